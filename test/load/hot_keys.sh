#!/usr/bin/env bash
# Load check: CLIENTS pgbench clients for SECONDS seconds, each call sending
# the key of the current 5 ms time slice, so that every few milliseconds all
# clients race on a key none of them has seen; one call in ten runs in a
# transaction that rolls back.  This keeps hitting the window between a
# call's read and its key lock in which another caller commits the key.
# Passes when pgbench counted no failed transaction and, for every key a
# committed call answered, there is exactly one order, every committed
# caller got it, exactly one of them executed, and the record points to it.
# Needs a server (PGHOST/PGPORT/PGUSER) with idem.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
source "$(dirname "$0")/../lib.sh"

SECONDS_TO_RUN=${SECONDS_TO_RUN:-8}
CLIENTS=${CLIENTS:-16}
DB=idem_hot
here=$(cd "$(dirname "$0")" && pwd)
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" -At "$@"; }

new_idem_database "$DB"
psql -c "CREATE TABLE idem_hot_log (key text, order_id bigint, replayed boolean)"

rc=0
out=$("$PG_BINDIR/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECONDS_TO_RUN" \
	-f "$here/hot_keys.pgbench@9" -f "$here/hot_keys_abort.pgbench@1" "$DB" 2>&1) || rc=$?
[ $rc -eq 0 ] || echo "$out" | grep -v "^ - \|^transaction\|^latency\|^tps\|^number\|^initial\|^query\|^scaling\|^duration\|^SQL script" | head -20 >&2
failed_txns=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
keys=$(psql -c "SELECT count(DISTINCT key) FROM idem_hot_log")
calls=$(psql -c "SELECT count(*) FROM idem_hot_log")
echo "# $calls committed calls on $keys keys ($((calls / (keys > 0 ? keys : 1))) a key)"

check "pgbench ran" 0 "$rc"
check "pgbench: no failed transaction" 0 "${failed_txns:-missing}"
check "hundreds of keys were raced" 1 "$(psql -c "SELECT (count(DISTINCT key) >= 200)::int FROM idem_hot_log")"
check "one order per key" "$keys" \
	"$(psql -c "SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = 78")"
check "every caller of a key got the same order_id" "$keys" \
	"$(psql -c "SELECT count(*) FROM (SELECT key FROM idem_hot_log GROUP BY key
	            HAVING count(DISTINCT order_id) = 1) s")"
check "one caller per key executed" "$keys" \
	"$(psql -c "SELECT count(*) FROM (SELECT key FROM idem_hot_log GROUP BY key
	            HAVING count(*) FILTER (WHERE NOT replayed) = 1) s")"
check "each key's record points to its order" "$keys" \
	"$(psql -c "SELECT count(DISTINCT l.key) FROM idem_hot_log l
	            JOIN idem_internal.idempotency_record r ON r.idempotency_key = l.key AND r.owner_id = 78
	            JOIN idem_internal.purchase_order o ON o.id = r.resource_id AND o.id = l.order_id")"

"$PG_BINDIR/dropdb" "$DB"
