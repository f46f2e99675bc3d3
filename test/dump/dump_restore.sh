#!/usr/bin/env bash
# pg_dump keeps idem's rows: records and orders survive a dump and restore
# into a new database (pg_extension_config_dump), the sequences keep their
# positions, and after the restore a retry still replays and a new key still
# executes with a fresh order id.  Needs a server (PGHOST/PGPORT/PGUSER).
#
# Prints one "ok - ..." or "not ok - ..." line per check.
source "$(dirname "$0")/../lib.sh"

src=idem_dump_src
dst=idem_dump_dst
dump=$(mktemp -t idem-dump.XXXXXX)
q() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -At -d "$1" -c "$2"; }

for db in $src $dst; do "$PG_BINDIR/dropdb" --if-exists "$db" 2>/dev/null; done
"$PG_BINDIR/createdb" $src
q $src "CREATE EXTENSION idem"
q $src "SELECT count(*) FROM (SELECT idem_create_order(9, 'dump-key-' || lpad(i::text, 10, '0'), i, 1)
        FROM generate_series(1, 25) i) s" >/dev/null
# a generic record, with its request digest under the source's secret (1.13)
q $src "SELECT idem_begin(9, 'DEBIT', 'dump-debit-key-000001', '{\"amount\": 100, \"account\": 1}'); SELECT idem_finish(9, 'DEBIT', 'dump-debit-key-000001', 201, '{\"debit\": 1}')" >/dev/null
q $src "SELECT idem_set_policy('PAY', ttl => '30 days', max_attempts => 3, audit_ttl => '90 days', reuse_after_expiry => 'refuse')" >/dev/null
# an expired payment, archived by the cleanup: its audit fields in idem_internal.idem_history
q $src "SELECT idem_begin(9, 'PAY', 'dump-pay-key-archived', '{}'); SELECT idem_finish(9, 'PAY', 'dump-pay-key-archived', 201, '{}', header_list => '[[\"Set-Cookie\", \"a=1\"], [\"Set-Cookie\", \"b=2\"]]')" >/dev/null
q $src "UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' WHERE idempotency_key = 'dump-pay-key-archived'"
q $src "SELECT idem_cleanup_expired()" >/dev/null
# dead letters (1.13): a 'block' topic's dead letter holding its key, a consumer's
q $src "SELECT idem_outbox_set_topic('dump.topic', 2, 'block')" >/dev/null
q $src "SELECT idem_outbox_emit('dump.topic', '{\"n\": 1}', 'k'), idem_outbox_emit('dump.topic', '{\"n\": 2}', 'k')" >/dev/null
q $src "SELECT count(*) FROM idem_outbox_fetch('dump.topic', 10)" >/dev/null
q $src "SELECT idem_outbox_nack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE topic = 'dump.topic'), 'refused', true)" >/dev/null
q $src "SELECT idem_consume_failed('dump-consumer', 'm1', 'boom', 'k', 'dump.topic', 1)" >/dev/null
# a task's attempts (1.16): one of unknown outcome, marked for reconciliation
q $src "SELECT idem_set_policy('DUMP_PAY', uncertain => 'reconcile')" >/dev/null
q $src "SELECT idem_submit(9, 'DUMP_PAY', 'dump-task-key-000001', '{\"amount\": 1}')" >/dev/null
q $src "SELECT idem_fail_unknown(task_id, token, '{\"provider\": \"timeout\"}') FROM idem_lease('DUMP_PAY', 'w1')" >/dev/null
attempts_before=$(q $src "SELECT md5(string_agg(a::text, ',' ORDER BY a.token)) FROM idem_internal.idem_task_attempt a")
# an operator's action (1.16): its audit row
q $src "SELECT idem_task_cancel(task_id, 'dump test') FROM idem_submit(9, 'DUMP_PAY', 'dump-task-key-000002', '{}')" >/dev/null
audit_before=$(q $src "SELECT md5(string_agg(a::text, ',' ORDER BY a.id)) FROM idem_internal.idem_operator_audit a")
dead_before=$(q $src "SELECT md5(string_agg(d::text, ',' ORDER BY d.message_id)) FROM idem_internal.idem_outbox_dead d")
failures_before=$(q $src "SELECT md5(string_agg(f::text, ',')) FROM idem_internal.idem_inbox_failure f")
history_before=$(q $src "SELECT md5(string_agg(h::text, ',' ORDER BY h.record_id)) FROM idem_internal.idem_history h")
before=$(q $src "SELECT md5(string_agg(r::text, ',' ORDER BY r.id)) FROM idem_internal.idempotency_record r")
orders_before=$(q $src "SELECT md5(string_agg(o::text, ',' ORDER BY o.id)) FROM idem_internal.purchase_order o")

# CREATE granted on idem's schema after the install: pg_dump writes the
# schema's privileges after CREATE EXTENSION, so the restore installs idem
# and grants it again; idem_health() must say so (1.14)
q $src "DROP ROLE IF EXISTS idem_dump_creator; CREATE ROLE idem_dump_creator; GRANT CREATE ON SCHEMA public TO idem_dump_creator"
"$PG_BINDIR/pg_dump" -Fc -f "$dump" $src
"$PG_BINDIR/createdb" $dst
"$PG_BINDIR/pg_restore" -d $dst "$dump"

check "records survive pg_dump and restore" "$before" \
	"$(q $dst "SELECT md5(string_agg(r::text, ',' ORDER BY r.id)) FROM idem_internal.idempotency_record r")"
check "orders survive pg_dump and restore" "$orders_before" \
	"$(q $dst "SELECT md5(string_agg(o::text, ',' ORDER BY o.id)) FROM idem_internal.purchase_order o")"
check "a retry after the restore replays" "t" \
	"$(q $dst "SELECT replayed FROM idem_create_order(9, 'dump-key-0000000007', 7, 1)")"
check "a new key after the restore gets the next order id" "26" \
	"$(q $dst "SELECT order_id FROM idem_create_order(9, 'dump-key-after-restore', 1, 1)")"
# the digest secret is not dumped: the restored database drew its own, so
# the restored record's digest no longer matches and its fingerprint decides
check "the restored database has a digest secret of its own" "1|false" \
	"$(q $dst "SELECT count(*) || '|' || bool_or(secret = '$(q $src "SELECT secret FROM idem_internal.idem_digest_secret")'::bytea) FROM idem_internal.idem_digest_secret")"
check "a generic retry after the restore replays (its fingerprint decides), another request is IK001" "true|201|{\"debit\": 1}|IK001" \
	"$(q $dst "SELECT replayed || '|' || http_status || '|' || body FROM idem_begin(9, 'DEBIT', 'dump-debit-key-000001', '{\"amount\": 100, \"account\": 1}')")|$("$PG_BINDIR/psql" -X -q -At -d $dst -v VERBOSITY=sqlstate -c "SELECT idem_begin(9, 'DEBIT', 'dump-debit-key-000001', '{\"amount\": 101, \"account\": 1}')" 2>&1 | grep -o IK001)"
check "policies survive pg_dump and restore" "PAY|30 days|3|90 days|refuse" \
	"$(q $dst "SELECT operation, ttl, max_attempts, audit_ttl, reuse_after_expiry FROM idem_policies WHERE operation = 'PAY'")"
check "history rows survive pg_dump and restore" "$history_before" \
	"$(q $dst "SELECT md5(string_agg(h::text, ',' ORDER BY h.record_id)) FROM idem_internal.idem_history h")"
check "tasks' attempts survive pg_dump and restore, and the restored task is reconciled with them" "$attempts_before|unknown" \
	"$(q $dst "SELECT md5(string_agg(a::text, ',' ORDER BY a.token)) FROM idem_internal.idem_task_attempt a")|$(q $dst "SELECT attempts->0->>'outcome' FROM idem_lease_reconcile('DUMP_PAY', 'r1')")"
check "operators' audit rows survive pg_dump and restore, and the restored audit still refuses a change" "$audit_before|42501" \
	"$(q $dst "SELECT md5(string_agg(a::text, ',' ORDER BY a.id)) FROM idem_internal.idem_operator_audit a")|$("$PG_BINDIR/psql" -X -q -At -d $dst -v VERBOSITY=sqlstate -c "DROP ROLE IF EXISTS idem_dump_su; CREATE ROLE idem_dump_su SUPERUSER; SET ROLE idem_dump_su; DELETE FROM idem_internal.idem_operator_audit" 2>&1 | grep -o 42501)"
check "the restored history still refuses the archived key (IK007)" "IK007" \
	"$("$PG_BINDIR/psql" -X -q -At -d $dst -v VERBOSITY=sqlstate -c "SELECT idem_begin(9, 'PAY', 'dump-pay-key-archived', '{}')" 2>&1 | grep -o IK007)"
check "the restored policy applies" "t" \
	"$(q $dst "BEGIN; SELECT expires_at = now() + interval '30 days' FROM idem_begin(9, 'PAY', 'dump-pay-key-00000001', '{}'); ROLLBACK;" | head -n 1)"

check "dead letters, topic settings and consumers' failures survive pg_dump and restore" "$dead_before|$failures_before|dump.topic|2|block" \
	"$(q $dst "SELECT md5(string_agg(d::text, ',' ORDER BY d.message_id)) FROM idem_internal.idem_outbox_dead d")|$(q $dst "SELECT md5(string_agg(f::text, ',')) FROM idem_internal.idem_inbox_failure f")|$(q $dst "SELECT topic, max_deliveries, on_dead FROM idem_internal.idem_outbox_topic")"
check "the restored dead letter still holds its key, and its redrive delivers it" '|{"n": 1}' \
	"$(q $dst "SELECT string_agg(payload::text, ',') FROM idem_outbox_fetch('dump.topic', 10)")|$(q $dst "SELECT idem_outbox_redrive(ARRAY(SELECT message_id FROM idem_internal.idem_outbox_dead))" >/dev/null; q $dst "SELECT string_agg(payload::text, ',') FROM idem_outbox_fetch('dump.topic', 10)")"

check "a restored grant of CREATE on idem's schema is reported by idem_health()" "{idem_dump_creator}" \
	"$(q $dst "SELECT schema_creators FROM idem_health()")"

rm -f "$dump"
for db in $src $dst; do "$PG_BINDIR/dropdb" "$db"; done
q postgres "DROP ROLE idem_dump_creator"
