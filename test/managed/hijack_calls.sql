-- Every entry point of the SQL edition, called by the role of its kind in
-- test/managed/run.sh's attacked database, in sessions that planted in
-- their own pg_temp first (test/hijack.sql).  A function of schema idem
-- not named here (but the internal idem_sql_*) fails the stage.
\set ON_ERROR_STOP 1
\c - h_app
SELECT hijack_log.plant_temp() > 0 AS planted;
SELECT order_no IS NOT NULL FROM idem.idem_create_order(1, 'hijack-order-00000001', 1, 2);
SELECT replayed FROM idem.idem_create_order(1, 'hijack-order-00000001', 1, 2);
BEGIN;
SELECT replayed FROM idem.idem_begin(1, 'PAY', 'hijack-begin-00000001', '{"a": 1, "b": [2.5, {"\u00e9": null, "\ufb33": true}]}');
SELECT idem.idem_finish(1, 'PAY', 'hijack-begin-00000001', 200, '{"paid": true}');
SELECT idem.idem_outbox_emit('orders', '{"n": 1}', 'k1', '{"h": "1"}');
SELECT idem.idem_outbox_emit('orders', '{"n": 2}', 'k2');
SELECT idem.idem_outbox_emit('orders', '{"n": 3}');
COMMIT;
BEGIN;
SELECT replayed FROM idem.idem_begin(1, 'PAY', 'hijack-begin-00000002', '{"a": 1}', interval '1 hour');
SELECT http_status FROM idem.idem_finish_stored(1, 'PAY', 'hijack-begin-00000002', 200, '{"paid": true}', 7,
                                                NULL, '[["Set-Cookie", "a=1"], ["set-cookie", "b=2"]]');
COMMIT;
SELECT replayed FROM idem.idem_begin(1, 'PAY', 'hijack-begin-00000001', '{"b": [2.5, {"\ufb33": true, "\u00e9": null}], "a": 1}');
SELECT replayed FROM idem.idem_begin(1, 'PAY', 'hijack-begin-00000002', '{"a": 1}');
-- expired records (a ttl of 10 ms): one archived and claimed again, one
-- of an operation that refuses the key (IK007)
BEGIN;
SELECT replayed FROM idem.idem_begin(1, 'BRIEF', 'hijack-brief-0000001', '{}');
SELECT idem.idem_finish(1, 'BRIEF', 'hijack-brief-0000001', 200, '{}');
SELECT replayed FROM idem.idem_begin(1, 'SHORT', 'hijack-short-0000001', '{}');
SELECT idem.idem_finish(1, 'SHORT', 'hijack-short-0000001', 200, '{}');
COMMIT;
SELECT pg_catalog.pg_sleep(0.05);
BEGIN;
SELECT replayed FROM idem.idem_begin(1, 'BRIEF', 'hijack-brief-0000001', '{}');
SELECT idem.idem_finish(1, 'BRIEF', 'hijack-brief-0000001', 200, '{}');
COMMIT;
\set ON_ERROR_STOP 0
SELECT replayed FROM idem.idem_begin(1, 'SHORT', 'hijack-short-0000001', '{}');
-- IK005 at COMMIT: the deferred check runs
BEGIN;
SELECT replayed FROM idem.idem_begin(1, 'PAY', 'hijack-begin-00000003', '{}');
COMMIT;
\set ON_ERROR_STOP 1
SELECT idem.idem_request_hash('{"a": 1e21}') IS NOT NULL, idem.idem_canonical_json('{"b": 1, "a": 0.1}'), idem.idem_edition() IS NOT NULL;

\c - h_publisher
SELECT hijack_log.plant_temp() > 0 AS planted;
SELECT idem.idem_outbox_ack(ARRAY(SELECT message_id FROM idem.idem_outbox_fetch('orders', 10, interval '1 minute'))) AS acked;

\c - idem_installer
SELECT hijack_log.plant_temp() > 0 AS planted;
SELECT count(*) > 0 FROM idem.idem_grant('h_granted', 'app');
SELECT count(*) > 0 FROM idem.idem_revoke('h_granted', 'app');
SELECT count(*) > 0 FROM idem.idem_privileges('publisher');
SELECT operation FROM idem.idem_set_policy('PAY', ttl => interval '2 hours');
SELECT operation FROM idem.idem_set_policy('OTHER');
SELECT idem.idem_drop_policy('OTHER');
SELECT idem.idem_bind('h_app', '1-100', NULL);
SELECT max_ttl FROM idem.idem_configure(max_ttl => interval '30 days');
SELECT idem.idem_cleanup_expired(100, 1) >= 0;
