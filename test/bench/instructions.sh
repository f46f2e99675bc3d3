#!/usr/bin/env bash
# Instructions per call over the wire (issue 40's method), which machine
# load does not move: a throwaway server runs under
# valgrind --tool=callgrind (every backend writes its own count at exit,
# collected from PostgresMain on: not what the postmaster did before the fork),
# and one pgbench client in prepared mode (-M prepared, as an application's
# driver) runs each script twice, 200 calls and 1,200; the difference of
# the two backends' totals is 1,000 calls without the connection's start.
# Then the same scripts on the same server without valgrind, for the wall
# clock beside (the median of five interleaved runs; no target).
# Each idem path is printed beside its baseline with two ratios, baseline
# / idem (above 1: idem is cheaper): whole, the statements as the server
# runs them, round trip included; net, with a marker script (the same
# client-side variables, one SELECT of them) subtracted from both sides,
# the call's own cost.  Then the idem path's top functions (self
# instructions, the 1,200-call run).  Not part of the test command; a smoke of it is (the
# stage instructions: --smoke, or IDEM_INSTR_SMOKE=1, runs 20 and 40 calls
# of two paths and checks only that figures come out, never their size).
#
#   bash test/bench/instructions.sh            (about 25 minutes on 2 cores: pgmq's
#                                                grouped reads of 15,000 messages
#                                                under callgrind take most)
#   IDEM_INSTR_PATHS="begin_replay_1k select_answer_1k" IDEM_KEEP_TMP=1 \
#     bash test/bench/instructions.sh          (some paths only, "drain" for
#                                                the drain; their
#                                                callgrind files kept)
#   IDEM_WALL_REPS=1 bash ...                  (one wall-clock run, not five)
#
# Replays read 10,000 distinct stored keys at random; new keys are drawn
# at random from 2^62.  Requests: the article's order request and a 1 KB
# request.  Baselines, what an application would write for the same job
# (docs/performance.md says why each is so):
#   - a replay: a prepared SELECT of the stored answer by its unique key,
#     receiving the request as a jsonb parameter, parsed at Bind as idem's
#     is; the test that uses it is in the target list, where it adds no
#     plan node;
#   - idem_create_order's replay: the five columns from the article's
#     tables (peers.sql's peer schema) by owner and key; the order call
#     receives no request document, so neither does its baseline;
#   - a new order: one statement writing the order and a finished record,
#     its response included, into the article's tables;
#   - idem_run with a new key: one statement calling the handler and
#     writing the finished record into the article's record table;
#   - an emit: one INSERT of the same row into a copy of idem's outbox
#     table and a NOTIFY;
#   - beside the replays, the physical limit: the stored status and body
#     by the unique key, nothing else (no threshold);
#   - the drains (per message, 1 and 2 batches of fetch 100 + ack from a
#     queue filled to 1,000 and to 15,000 messages): the real pgmq, its
#     SQL fetched at run time (cargo vendor of the pgmq crate into this
#     run's temporary directory; a skip line without cargo).  The keyless
#     drain against pgmq.read, the keyed drain (1,000 keys, per-key order)
#     against pgmq's FIFO groups, read_grouped_rr and read_grouped (with
#     the GIN index pgmq advises for them); each read and its delete in one
#     statement, as the ack.
source "$(dirname "$0")/../lib.sh"
ensure_packages
ensure_service_packages valgrind
build_install
init_server "idem.cleanup_interval = 0
autovacuum = off"
smoke=${IDEM_INSTR_SMOKE:-}
[ "${1:-}" = --smoke ] && smoke=1
keys=10000
[ -n "$smoke" ] && keys=100
few=200 many=1200
[ -n "$smoke" ] && { few=20; many=40; }
as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -l "$IDEM_TMP/server.log" -w -s start
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }
big=$(python3 -c 'import json; print(json.dumps({"items": [{"sku": i, "name": "item %04d" % i, "qty": 1} for i in range(27)]}, separators=(",", ":")))')
# a retry that spells the same numbers otherwise (1.0 for 1): the same
# request, other bytes, so no digest match
big2=${big//\"qty\":1\}/\"qty\":1.0\}}
psql -v big="$big" -v keys="$keys" <<'SQL'
CREATE EXTENSION idem;
SET bench.big TO :'big';
SET bench.keys TO :keys;
SELECT length(:'big') AS big_request_bytes \gset
\echo 1 KB request: :big_request_bytes bytes
CREATE TABLE bench_ledger (id bigserial PRIMARY KEY, amount int);
CREATE FUNCTION bench_handler(request jsonb) RETURNS idem_result LANGUAGE sql AS $$
    WITH l AS (INSERT INTO bench_ledger (amount) VALUES ((request->>'amount')::int) RETURNING id)
    SELECT ROW(201, json_build_object('id', l.id), NULL, l.id)::idem_result FROM l $$;
DO $$
DECLARE big jsonb := current_setting('bench.big', true)::jsonb;
BEGIN
  FOR i IN 1..current_setting('bench.keys')::int LOOP
    PERFORM idem_create_order(1, 'cg-ord-' || lpad(i::text, 12, '0'), 7, 1);
    PERFORM idem_begin(1, 'PAY', 'cg-key-' || lpad(i::text, 12, '0'), '{"skuId": 7, "quantity": 1}');
    PERFORM idem_finish(1, 'PAY', 'cg-key-' || lpad(i::text, 12, '0'), 201, '{"ok": true}');
    PERFORM idem_begin(1, 'BIG', 'cg-key-' || lpad(i::text, 12, '0'), big);
    PERFORM idem_finish(1, 'BIG', 'cg-key-' || lpad(i::text, 12, '0'), 201, '{"ok": true}');
    PERFORM idem_run(1, 'RUN', 'cg-key-' || lpad(i::text, 12, '0'), '{"amount": 5}', 'bench_handler(jsonb)');
    PERFORM idem_run(1, 'RUNBIG', 'cg-key-' || lpad(i::text, 12, '0'), big, 'bench_handler(jsonb)');
  END LOOP;
END $$;
ANALYZE;
SQL
# the SQL edition (managed/idem.sql) beside it, in schema idem, with the
# same 10,000 orders and PAY records
psql -v keys="$keys" <<SQL
CREATE ROLE idem_owner NOLOGIN;
CREATE SCHEMA idem AUTHORIZATION idem_owner;
\\i $IDEM_ROOT/managed/idem.sql
SET bench.keys TO :keys;
DO \$\$
BEGIN
  FOR i IN 1..current_setting('bench.keys')::int LOOP
    PERFORM idem.idem_create_order(1, 'cg-ord-' || lpad(i::text, 12, '0'), 7, 1);
    PERFORM idem.idem_begin(1, 'PAY', 'cg-key-' || lpad(i::text, 12, '0'), '{"skuId": 7, "quantity": 1}');
    PERFORM idem.idem_finish(1, 'PAY', 'cg-key-' || lpad(i::text, 12, '0'), 201, '{"ok": true}');
  END LOOP;
END \$\$;
ANALYZE idem.idempotency_record;
SQL
psql -f "$(dirname "$0")/peers.sql"	# the baselines, shared with bench.sh and outbox_bench.sh
# the order replays' baseline: the article's tables with the same 10,000
# orders, each record holding its response as the article stores it
psql -v keys="$keys" <<'SQL'
INSERT INTO peer.purchase_order (order_no, owner_id, sku_id, quantity, status)
SELECT 'ORD-' || lpad(g::text, 12, '0'), 1, 7, 1, 'CREATED' FROM generate_series(1, :keys) g;
INSERT INTO peer.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, http_status,
                                     response_json, resource_id, expires_at)
SELECT 1, 'CREATE_ORDER', 'cg-ord-' || lpad(o.id::text, 12, '0'), repeat('0', 64), 'SUCCEEDED', 201,
       jsonb_build_object('orderId', o.id, 'orderNo', o.order_no, 'status', o.status), o.id, now() + interval '1 day'
  FROM peer.purchase_order o;
ANALYZE peer.idempotency_record;
ANALYZE peer.purchase_order;
SQL
# the drains, against the real pgmq: its SQL (the pgmq crate on crates.io
# embeds it) fetched now with cargo into this run's temporary directory,
# installed into the private PostgreSQL, never kept
pgmq_crate=0.33.7 pgmq_version=1.11.1
fetch_pgmq() {	# false (and a line why) if it cannot
	local dir=$IDEM_TMP/pgmq cargo src
	cargo=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
	if [ ! -x "$cargo" ]; then
		ensure_service_packages cargo >/dev/null 2>&1 || true
		cargo=$(command -v cargo) || { echo "# skip - the pgmq drains: no cargo to fetch pgmq with"; return 1; }
	fi
	mkdir -p "$dir/p/src" && touch "$dir/p/src/lib.rs"
	printf '[package]\nname = "throwaway"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\npgmq = { version = "=%s", default-features = false }\n' \
		"$pgmq_crate" >"$dir/p/Cargo.toml"
	(cd "$dir/p" && CARGO_HOME="$dir/home" "$cargo" vendor -q "$dir/vendor") >"$dir/vendor.log" 2>&1 ||
		{ echo "# skip - the pgmq drains: cargo vendor of pgmq $pgmq_crate failed ($(tail -n 1 "$dir/vendor.log"))"; return 1; }
	src=$dir/vendor/pgmq/src/install/embedded
	grep -q "^default_version = '$pgmq_version'" "$src/pgmq.control" ||
		{ echo "# skip - the pgmq drains: the crate holds no pgmq $pgmq_version"; return 1; }
	cp "$src/pgmq.control" "$("$PG_CONFIG" --sharedir)/extension/pgmq.control"
	cp "$src/sql/pgmq.sql" "$("$PG_CONFIG" --sharedir)/extension/pgmq--$pgmq_version.sql"
}
drain=yes
{ [ -n "$smoke" ] || [[ -n "${IDEM_INSTR_PATHS:-}" && " $IDEM_INSTR_PATHS " != *" drain "* ]]; } && drain=
[ -z "$drain" ] || fetch_pgmq || drain=
if [ -n "$drain" ]; then
	# four queues: idem's outbox keyless (topic drainfree) and over 1,000
	# keys (drain), pgmq's queue keyless and in 1,000 FIFO groups; before
	# each run one of them is filled to the depth measured, the others
	# emptied
	psql <<'SQL'
CREATE EXTENSION pgmq;
SELECT pgmq.create('keyless'), pgmq.create('keyed');
-- pgmq's advice for FIFO groups: a GIN index on the headers
SELECT pgmq.create_fifo_index('keyed');
CREATE FUNCTION bench_fill(queue text, depth int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body jsonb := '{"order": 1, "status": "CREATED"}';
    n int;
BEGIN
    DELETE FROM idem_internal.idem_outbox WHERE topic <> CASE queue WHEN 'drain' THEN 'drain' WHEN 'drainfree' THEN 'drainfree' ELSE '' END;
    IF queue <> 'keyless' THEN DELETE FROM pgmq.q_keyless; END IF;
    IF queue <> 'keyed' THEN DELETE FROM pgmq.q_keyed; END IF;
    IF queue = 'drain' THEN
        n := depth - (SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'drain');
        PERFORM idem_outbox_emit('drain', body, 'account-' || (g % 1000)) FROM generate_series(1, n) g;
    ELSIF queue = 'drainfree' THEN
        n := depth - (SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'drainfree');
        PERFORM idem_outbox_emit('drainfree', body) FROM generate_series(1, n) g;
    ELSIF queue = 'keyless' THEN
        n := depth - (SELECT count(*) FROM pgmq.q_keyless);
        PERFORM pgmq.send('keyless', body) FROM generate_series(1, n) g;
    ELSE
        n := depth - (SELECT count(*) FROM pgmq.q_keyed);
        PERFORM pgmq.send('keyed', body, jsonb_build_object('x-pgmq-group', 'account-' || (g % 1000))) FROM generate_series(1, n) g;
    END IF;
END $$;
SQL
fi
as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -w -s stop

W=$IDEM_TMP/instr
mkdir -p "$W/cg"
chmod -R 777 "$W"
key="'cg-key-' || lpad(:k::text, 12, '0')"
ord="'cg-ord-' || lpad(:k::text, 12, '0')"
new="'cg-new-' || :n"
replay="\\set k random(1, $keys)"
fresh='\set n random(1, 4611686018427387903)'
# the requests are parameters (pgbench -D), as a driver sends them: each
# call's text is parsed into jsonb, by idem's call and by the baseline alike
req=":req"
bigreq=":big"
# script NAME LINES...: a pgbench script
script() { local name=$1; shift; printf '%s\n' "$@" >"$W/$name.sql"; }
script marker "$replay" "$fresh" "SELECT $key, $new;"
script begin_replay "$replay" "SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'PAY', $key, $req);"
script select_answer "$replay" "SELECT $req::jsonb IS NOT NULL, http_status, response_body, response_headers, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'PAY' AND idempotency_key = $key;"
script begin_replay_1k "$replay" "SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'BIG', $key, $bigreq);"
# the physical limit of a replay: the stored status and body by the unique
# key, nothing else (no request, no headers)
script limit_answer "$replay" "SELECT http_status, response_body FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'PAY' AND idempotency_key = $key;"
script limit_order "$replay" "SELECT http_status, response_json FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'CREATE_ORDER' AND idempotency_key = $ord;"
script begin_respelled "$replay" "SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'PAY', $key, :req2);"
script select_respelled "$replay" "SELECT :req2::jsonb IS NOT NULL, http_status, response_body, response_headers, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'PAY' AND idempotency_key = $key;"
script begin_respelled_1k "$replay" "SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'BIG', $key, :big2);"
script select_respelled_1k "$replay" "SELECT :big2::jsonb IS NOT NULL, http_status, response_body, response_headers, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'BIG' AND idempotency_key = $key;"
script select_answer_1k "$replay" "SELECT $bigreq::jsonb IS NOT NULL, http_status, response_body, response_headers, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'BIG' AND idempotency_key = $key;"
# the SQL edition's calls, and their baselines on its own table
script sql_begin_replay "$replay" "SELECT replayed, http_status, body, headers, resource_id FROM idem.idem_begin(1, 'PAY', $key, $req);"
script sql_select_answer "$replay" "SELECT $req::jsonb IS NOT NULL, http_status, response_body, response_headers, resource_id FROM idem.idempotency_record WHERE owner_id = 1 AND operation = 'PAY' AND idempotency_key = $key;"
script sql_order_replay "$replay" "SELECT order_id, order_no, status, http_status, replayed FROM idem.idem_create_order(1, $ord, 7, 1);"
script sql_order_new "$fresh" "SELECT order_id, order_no, status, http_status, replayed FROM idem.idem_create_order(1, $new, 7, 1);"
# a new key through idem_begin and idem_finish, in one transaction
script begin_finish_new "$fresh" "BEGIN;" "SELECT replayed FROM idem_begin(1, 'PAY', $new, $req);" "SELECT idem_finish(1, 'PAY', $new, 201, '{\"ok\": true}');" "END;"
script sql_begin_finish_new "$fresh" "BEGIN;" "SELECT replayed FROM idem.idem_begin(1, 'PAY', $new, $req);" "SELECT idem.idem_finish(1, 'PAY', $new, 201, '{\"ok\": true}');" "END;"
# a pooled connection whose other requests make temporary tables: each
# call follows a CREATE TEMP TABLE in its transaction, whose invalidations
# reach every cache of the backend
tmp="CREATE TEMP TABLE bench_scratch (id int) ON COMMIT DROP;"
script begin_replay_tmp "$replay" "BEGIN;" "$tmp" "SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'PAY', $key, $req);" "END;"
script select_answer_tmp "$replay" "BEGIN;" "$tmp" "SELECT $req::jsonb IS NOT NULL, http_status, response_body, response_headers, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'PAY' AND idempotency_key = $key;" "END;"
script order_replay "$replay" "SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(1, $ord, 7, 1);"
script select_order "$replay" "SELECT (response_json->>'orderId')::bigint, response_json->>'orderNo', response_json->>'status', http_status, true FROM peer.idempotency_record WHERE owner_id = 1 AND operation = 'CREATE_ORDER' AND idempotency_key = $ord;"
script run_replay "$replay" "SELECT replayed, http_status, body, resource_id FROM idem_run(1, 'RUN', $key, :amount, 'bench_handler(jsonb)');"
script select_run "$replay" "SELECT :amount::jsonb IS NOT NULL, http_status, response_body, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'RUN' AND idempotency_key = $key;"
script run_replay_1k "$replay" "SELECT replayed, http_status, body, resource_id FROM idem_run(1, 'RUNBIG', $key, $bigreq, 'bench_handler(jsonb)');"
script select_run_1k "$replay" "SELECT $bigreq::jsonb IS NOT NULL, http_status, response_body, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'RUNBIG' AND idempotency_key = $key;"
script order_new "$fresh" "SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(1, $new, 7, 1);"
script write_both "$fresh" "WITH o AS (INSERT INTO peer.purchase_order (order_no, owner_id, sku_id, quantity, status) VALUES ('W-' || :n, 1, 7, 1, 'CREATED') RETURNING id, order_no, status) INSERT INTO peer.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, http_status, response_json, resource_id, expires_at) SELECT 1, 'W', $new, repeat('0', 64), 'SUCCEEDED', 201, jsonb_build_object('orderId', o.id, 'orderNo', o.order_no, 'status', o.status), o.id, now() + interval '1 day' FROM o RETURNING resource_id, idempotency_key, status, http_status, true;"
script run_new "$fresh" "SELECT replayed, http_status, body, resource_id FROM idem_run(1, 'RUN', $new, :amount, 'bench_handler(jsonb)');"
script handler_and_record "$fresh" "INSERT INTO peer.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, http_status, response_json, resource_id, expires_at) SELECT 1, 'HR', $new, repeat('0', 64), 'SUCCEEDED', r.http_status, r.body::jsonb, r.resource_id, now() + interval '1 day' FROM bench_handler(:amount) r RETURNING false, http_status, response_json, resource_id;"
script emit '\set k random(1, 1000)' "SELECT idem_outbox_emit('bench', :req, 'account-' || :k);"
script bare_insert '\set k random(1, 1000)' "WITH i AS (INSERT INTO plain.outbox (message_id, topic, msg_key, payload, emitted_at, commit_seq, attempt, ready) VALUES (nextval('plain.outbox_seq'), 'bench', 'account-' || :k, :req, now(), nextval('plain.outbox_seq'), 0, true) RETURNING message_id) SELECT i.message_id, pg_notify('idem_outbox', 'bench') FROM i;"
# the drains, a batch of 100 fetched and acknowledged (deleted) in one
# statement: idem's outbox against pgmq's read and delete, like with like
script drain_marker "SELECT 1;"
script drain_free "SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_outbox_fetch('drainfree', 100)));"
script pgmq_read "SELECT pgmq.delete('keyless', ARRAY(SELECT msg_id FROM pgmq.read('keyless', 30, 100)));"
script drain_keyed "SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_outbox_fetch('drain', 100)));"
script pgmq_grouped_rr "SELECT pgmq.delete('keyed', ARRAY(SELECT msg_id FROM pgmq.read_grouped_rr('keyed', 30, 100)));"
script pgmq_grouped "SELECT pgmq.delete('keyed', ARRAY(SELECT msg_id FROM pgmq.read_grouped('keyed', 30, 100)));"
chmod 666 "$W"/*.sql

# the server under callgrind: each backend writes cg/<pid> at its exit
(cd "$W" && as_pg_user valgrind --tool=callgrind -q --trace-children=yes --callgrind-out-file="$W/cg/%p" \
	--collect-atstart=no --toggle-collect=PostgresMain \
	"$PG_BINDIR/postgres" -D "$IDEM_TMP/data" >"$W/server.log" 2>&1 &)
for _ in $(seq 1 600); do "$PG_BINDIR/pg_isready" -q -h "$PGHOST" -p "$PGPORT" && break; sleep 0.2; done
postmaster=$(head -n 1 "$IDEM_TMP/data/postmaster.pid")
sleep 2			# the auxiliary processes started

# bench_script NAME CALLS: one pgbench client (-M prepared, as a driver)
# runs the script, the requests as its variables
bench_script() {
	"$PG_BINDIR/pgbench" -n -M prepared -c 1 -t "$2" -f "$W/$1.sql" -h "$PGHOST" -p "$PGPORT" -U postgres \
		-D req='{"skuId": 7, "quantity": 1}' -D big="$big" -D amount='{"amount": 5}' \
		-D req2='{"skuId": 7.0, "quantity": 1}' -D big2="$big2" postgres
}

# run NAME CALLS: one pgbench client; the instructions of its backend (pgbench
# also opens a short connection of its own first: the larger of the two)
run() {
	local f best=0 ir
	rm -f "$W"/cg/*
	children=$(pgrep -c -P "$postmaster")
	bench_script "$1" "$2" >"$W/$1-$2.pgbench" 2>&1 || { cat "$W/$1-$2.pgbench" >&2; return 1; }
	# the backends' files are written at their exit: wait until the
	# postmaster has no more children than before the run
	for _ in $(seq 1 600); do
		[ "$(pgrep -c -P "$postmaster")" -le "$children" ] && break
		sleep 0.2
	done
	for f in "$W"/cg/*; do
		ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
		[ -n "$ir" ] && [ "$ir" -gt "$best" ] && { best=$ir; mv "$f" "$W/$1-$2.cg"; }
	done
	[ "$best" -gt 0 ] || { echo "no callgrind output for $1" >&2; return 1; }
	echo "$best"
}
declare -A ir
paths=(marker begin_replay select_answer begin_replay_1k select_answer_1k begin_respelled select_respelled
	begin_respelled_1k select_respelled_1k limit_answer limit_order begin_replay_tmp select_answer_tmp order_replay select_order run_replay select_run run_replay_1k select_run_1k order_new write_both run_new handler_and_record emit bare_insert
	sql_begin_replay sql_select_answer sql_order_replay sql_order_new begin_finish_new sql_begin_finish_new)
[ -n "$smoke" ] && paths=(marker begin_replay select_answer order_new write_both sql_begin_replay)
[ -n "${IDEM_INSTR_PATHS:-}" ] && read -ra paths <<<"marker ${IDEM_INSTR_PATHS//drain/}"
for s in "${paths[@]}"; do
	ir[$s-few]=$(run "$s" "$few")
	ir[$s-many]=$(run "$s" "$many")
done
n=$((many - few))
per_call() { echo $(( (ir[$1-many] - ir[$1-few] - (ir[marker-many] - ir[marker-few])) / n )); }
whole_call() { echo $(( (ir[$1-many] - ir[$1-few]) / n )); }
top() {	# the idem path's five costliest functions (self), the larger run
	callgrind_annotate --inclusive=no "$W/$1-${2:-$many}.cg" 2>/dev/null |
		awk '/PROGRAM TOTALS/ {go = 1; next} go && NF >= 2 && $1 ~ /^[0-9,]+$/ && k < 5 {k++; printf "      %s\n", $0}' || true
}
line() {	# line WHAT IDEM BASELINE (nothing for a path not run)
	local a b A B wa wb
	[ -n "${ir[$2-many]:-}" ] && [ -n "${ir[$3-many]:-}" ] || return 0
	a=$(per_call "$2")
	b=$(per_call "$3")
	A=$(whole_call "$2")
	B=$(whole_call "$3")
	wa=$(us "$2" none)
	wb=$(us "$3" none)
	printf '%-44s whole %9d vs %9d Ir, ratio %s; net %9d vs %9d, ratio %s; wall %s vs %s us, ratio %s\n' "$1" \
		"$A" "$B" "$(awk -v a="$A" -v b="$B" 'BEGIN {printf "%.2f", b / a}')" \
		"$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b / a}')" "$wa" "$wb" "$(wall_ratio "$wa" "$wb")"
	[ -n "$smoke" ] || top "$2"
}
# fill QUEUE DEPTH: one queue filled to DEPTH messages, the others empty,
# vacuumed; its backend gone before the next run counts
base_children=$(pgrep -c -P "$postmaster")
fill() {
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$PGHOST" -p "$PGPORT" -U postgres -d postgres \
		-c "SELECT bench_fill('$1', $2)" -c "VACUUM ANALYZE idem_internal.idem_outbox, pgmq.q_keyless, pgmq.q_keyed" >/dev/null
	for _ in $(seq 1 600); do
		[ "$(pgrep -c -P "$postmaster")" -le "$base_children" ] && break
		sleep 0.2
	done
}
drain_queue() {	# the queue a drain script reads
	case $1 in drain_free) echo drainfree ;; pgmq_read) echo keyless ;; drain_keyed) echo drain ;; *) echo keyed ;; esac
}
depths=(1000 15000)
drains=(drain_free pgmq_read drain_keyed pgmq_grouped_rr pgmq_grouped)
[ -z "$drain" ] || {
	# per message: 1 and 2 batches of 100 from a queue filled to the depth
	ir[drain_marker-few]=$(run drain_marker 1)
	ir[drain_marker-many]=$(run drain_marker 2)
	for depth in "${depths[@]}"; do
		for s in "${drains[@]}"; do
			fill "$(drain_queue "$s")" "$depth"
			ir[$s@$depth-few]=$(run "$s" 1)
			fill "$(drain_queue "$s")" "$depth"
			ir[$s@$depth-many]=$(run "$s" 2)
		done
	done
}

# Wall clock beside, with no target: the same scripts on the same server
# without valgrind, the paths interleaved (marker, each idem path and its
# baseline, in turn) and repeated five times; per call, the time of one
# call (1 / pgbench's TPS, one client) less the marker's, the median of the
# five runs.
as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -m fast -w -s stop
as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -l "$IDEM_TMP/server.log" -w -s start
reps=${IDEM_WALL_REPS:-5} wall_calls=2000
[ -n "$smoke" ] && { reps=1; wall_calls=20; }
declare -A ms	# each path's median, microseconds per call
wall_run() {	# wall_run NAME CALLS: microseconds per call of one run (1 / its TPS)
	bench_script "$1" "$2" 2>&1 | awk '/^tps = / {printf "%.2f\n", 1000000 / $3}'
}
median() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
declare -A wl	# each path's runs, space-separated
wall_paths=("${paths[@]}")
for _ in $(seq 1 "$reps"); do
	for s in "${wall_paths[@]}"; do
		wl[$s]+="$(wall_run "$s" "$wall_calls") "
	done
	# a drain: 5 batches from a queue filled to the depth
	[ -z "$drain" ] || for depth in "${depths[@]}"; do
		wl[drain_marker]+="$(wall_run drain_marker 5) "
		for s in "${drains[@]}"; do
			fill "$(drain_queue "$s")" "$depth"
			wl[$s@$depth]+="$(wall_run "$s" 5) "
		done
	done
done
for s in "${!wl[@]}"; do ms[$s]=$(median "${wl[$s]}"); done
# microseconds per call beyond the marker
us() {	# us PATH [MARKER|none] [DIVISOR]: microseconds per call, less the marker's
	local m=0
	[ "${2:-marker}" = none ] || m=${ms[${2:-marker}]}
	awk -v a="${ms[$1]}" -v m="$m" -v d="${3:-1}" 'BEGIN {printf "%.1f", (a - m) / d}'
}
wall_ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0) printf "%.2f", b / a; else print "-"}'; }

log "PostgreSQL $("$PG_BINDIR/postgres" --version | awk '{print $3}'), idem $(sed -n "s/^default_version = '\(.*\)'/\1/p" "$IDEM_ROOT/idem.control"), callgrind over the wire, pgbench -M prepared, $n calls; wall clock: median of $reps interleaved runs of $wall_calls calls"
line "idem_begin replay (the article's request)" begin_replay select_answer
if [ -n "$smoke" ]; then
	line "idem_create_order, a new key" order_new write_both
	# that it runs and counts: figures out, positive (never a bound on them)
	for s in begin_replay select_answer order_new write_both sql_begin_replay; do
		v=$(per_call "$s")
		if [ "$v" -gt 0 ]; then
			echo "ok - the instruction benchmark counts $s over the wire ($v Ir per call in a $n-call smoke)"
		else
			echo "not ok - the instruction benchmark counts $s over the wire (got $v)"
		fi
	done
	check "the instruction benchmark's wall-clock pass times each path" true \
		"$(for s in "${paths[@]}"; do [ -n "${ms[$s]}" ] || echo "false ($s)"; done | head -n 1 | grep . || echo true)"
	exit 0
fi
line "idem_begin replay (a 1 KB request)" begin_replay_1k select_answer_1k
line "idem_begin replay against the physical limit" begin_replay limit_answer
line "idem_create_order replay against the physical limit" order_replay limit_order
line "idem_begin replay, the request respelled (7.0)" begin_respelled select_respelled
line "idem_begin replay, 1 KB respelled (1.0)" begin_respelled_1k select_respelled_1k
line "idem_begin replay after a CREATE TEMP TABLE" begin_replay_tmp select_answer_tmp
line "idem_create_order replay" order_replay select_order
line "idem_run replay" run_replay select_run
line "idem_run replay (a 1 KB request)" run_replay_1k select_run_1k
line "idem_create_order, a new key" order_new write_both
line "idem_run, a new key (a handler inserting a row)" run_new handler_and_record

line "idem_outbox_emit, a keyed message (1,000 keys)" emit bare_insert

log "the SQL edition (managed/idem.sql): against its baseline, then against the C edition (ratio: the C edition's cost / the SQL edition's)"
line "SQL edition: idem_begin replay" sql_begin_replay sql_select_answer
line "SQL edition: idem_create_order replay" sql_order_replay select_order
line "SQL edition: idem_create_order, a new key" sql_order_new write_both
line "SQL vs C edition: idem_begin replay" sql_begin_replay begin_replay
line "SQL vs C edition: idem_create_order replay" sql_order_replay order_replay
line "SQL vs C edition: idem_create_order, a new key" sql_order_new order_new
line "SQL vs C edition: idem_begin + idem_finish, a new key" sql_begin_finish_new begin_finish_new

[ -n "$drain" ] || exit 0
per_message() { echo $(( (ir[$1-many] - ir[$1-few] - (ir[drain_marker-many] - ir[drain_marker-few])) / 100 )); }
drain_line() {	# drain_line WHAT IDEM PGMQ DEPTH
	local a b wa wb
	a=$(per_message "$2@$4")
	b=$(per_message "$3@$4")
	wa=$(us "$2@$4" drain_marker 100)
	wb=$(us "$3@$4" drain_marker 100)
	printf '%-58s %8d Ir/msg  pgmq %8d  ratio %s   wall %s vs %s us, ratio %s\n' "$1" "$a" "$b" \
		"$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b / a}')" "$wa" "$wb" "$(wall_ratio "$wa" "$wb")"
}
log "drains, per message: fetch 100 + acknowledge in one statement, against pgmq $pgmq_version (crate $pgmq_crate)"
for depth in "${depths[@]}"; do
	drain_line "keyless drain vs pgmq.read, $depth queued" drain_free pgmq_read "$depth"
	drain_line "keyed drain vs pgmq.read_grouped_rr, $depth queued" drain_keyed pgmq_grouped_rr "$depth"
	drain_line "keyed drain vs pgmq.read_grouped, $depth queued" drain_keyed pgmq_grouped "$depth"
done
top drain_keyed 2
