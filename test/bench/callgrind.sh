#!/usr/bin/env bash
# Instructions per call, which machine load does not move (issue 40):
# valgrind --tool=callgrind over a single-user backend (postgres --single)
# of a throwaway cluster, each script run once: 200 warm-up calls, then
# 1,000 measured; a script of as many `EXECUTE marker` statements is
# subtracted, so that what is left is the call's own cost.  Each idem path
# is printed beside its baseline and the ratio baseline / idem (above 1:
# idem is cheaper).  The baselines: a prepared SELECT of the stored answer
# by its unique key that also receives the request as a jsonb parameter
# (a replay's fair limit); one statement writing the order and a finished
# record (a fresh order's limit).  Each statement returns the same columns
# as its idem path (single-user mode prints them).  Not part of the test
# command.
#
#   bash test/bench/callgrind.sh          (about 3 minutes)
source "$(dirname "$0")/../lib.sh"
ensure_packages
command -v valgrind >/dev/null || { apt-get update -qq; apt-get install -y -qq valgrind >/dev/null; }
build_install
init_server "idem.cleanup_interval = 0"
as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -l "$IDEM_TMP/server.log" -w -s start
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }
psql -c "CREATE EXTENSION idem" -c "
	DO \$\$ BEGIN
	  FOR i IN 1..1200 LOOP
	    PERFORM idem_begin(1, 'PAY', 'cg-key-' || lpad(i::text, 12, '0'), '{\"amount\": 5, \"currency\": \"EUR\"}');
	    PERFORM idem_finish(1, 'PAY', 'cg-key-' || lpad(i::text, 12, '0'), 201, '{\"ok\": true}');
	    PERFORM idem_create_order(1, 'cg-ord-' || lpad(i::text, 12, '0'), 7, 1);
	  END LOOP;
	END \$\$;"
as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -w -s stop

# script NAME PREPARE STATEMENT [writes]: NAME.sql, 200 warm-up and 1,000
# measured EXECUTEs, and NAME-warm.sql, the prepare and 200 only (%s: the
# call's key suffix).  A script that writes gets keys no other run used in
# each (its warm-up script others than the full one's), so that every call
# it makes is a first one.
script() {
	local w1=%012d w2=%012d
	[ "${4:-}" = writes ] && { w1=a%011d; w2=b%011d; }
	{
		echo "$2;"
		for i in $(seq 1 1200); do printf "$3;\n" "$(printf "$w1" "$i")"; done
	} >"$IDEM_TMP/$1.sql"
	{
		echo "$2;"
		for i in $(seq 1 200); do printf "$3;\n" "$(printf "$w2" "$i")"; done
	} >"$IDEM_TMP/$1-warm.sql"
}
script marker "PREPARE m(text) AS SELECT \$1" "EXECUTE m('cg-key-%s')"
script begin_replay "PREPARE b(text, jsonb) AS SELECT replayed, http_status, body, headers, resource_id FROM idem_begin(1, 'PAY', \$1, \$2)" \
	"EXECUTE b('cg-key-%s', '{\"amount\": 5, \"currency\": \"EUR\"}')"
script select_answer "PREPARE s(text, jsonb) AS SELECT true, http_status, response_body, response_headers, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'PAY' AND idempotency_key = \$1 AND \$2 IS NOT NULL" \
	"EXECUTE s('cg-key-%s', '{\"amount\": 5, \"currency\": \"EUR\"}')"
script order_replay "PREPARE o(text) AS SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(1, \$1, 7, 1)" "EXECUTE o('cg-ord-%s')"
script select_order "PREPARE so(text, jsonb) AS SELECT (response_json->>'orderId')::bigint, response_json->>'orderNo', response_json->>'status', http_status, true FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'CREATE_ORDER' AND idempotency_key = \$1 AND \$2 IS NOT NULL" \
	"EXECUTE so('cg-ord-%s', '{\"skuId\": 7, \"quantity\": 1}')"
script order_new "PREPARE n(text) AS SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(1, \$1, 7, 1)" "EXECUTE n('cg-new-%s')" writes
script write_both "PREPARE w(text) AS WITH o AS (INSERT INTO idem_internal.purchase_order (order_no, owner_id, sku_id, quantity, status) VALUES ('W-' || \$1, 1, 7, 1, 'CREATED') RETURNING id) INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, http_status, resource_id, expires_at) SELECT 1, 'W', \$1, repeat('0', 64), 'SUCCEEDED', 201, o.id, now() + interval '1 day' FROM o RETURNING resource_id, idempotency_key, status, http_status, true" \
	"EXECUTE w('cg-w-%s')" writes
chown postgres: "$IDEM_TMP"/*.sql

# instructions of one script, minus nothing (callgrind's program total)
total() {
	as_pg_user valgrind --tool=callgrind -q --callgrind-out-file="$IDEM_TMP/$1.cg" \
		"$PG_BINDIR/postgres" --single -D "$IDEM_TMP/data" -c shared_preload_libraries=idem \
		-c idem.cleanup_interval=0 postgres <"$IDEM_TMP/$1.sql" >/dev/null 2>"$IDEM_TMP/$1.err"
	callgrind_annotate "$IDEM_TMP/$1.cg" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}
# the 1,000 measured calls: a script's total minus its warm-up script's
declare -A ir
for s in marker begin_replay select_answer order_replay select_order order_new write_both; do
	ir[$s]=$(total "$s")
	ir[$s-warm]=$(total "$s-warm")
done
per_call() { echo $(( (ir[$1] - ir[$1-warm] - (ir[marker] - ir[marker-warm])) / 1000 )); }
line() {	# line WHAT IDEM BASELINE
	local a b
	a=$(per_call "$2")
	b=$(per_call "$3")
	printf '%-40s %9d Ir/call   baseline %9d   ratio %s\n' "$1" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b / a}')"
}
log "PostgreSQL $("$PG_BINDIR/postgres" --version | awk '{print $3}'), idem $(sed -n "s/^default_version = '\(.*\)'/\1/p" "$IDEM_ROOT/idem.control"), callgrind"
line "idem_begin replay" begin_replay select_answer
line "idem_create_order replay" order_replay select_order
line "idem_create_order, a new key" order_new write_both
