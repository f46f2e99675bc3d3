#!/usr/bin/env bash
# Load check: CLIENTS pgbench clients send the same idempotency key at the
# same moment, for ROUNDS rounds with distinct keys.  Passes when every round
# made exactly one order, every caller of a round got the same order_id, one
# caller per round executed and the others replayed, and pgbench counted no
# failed transaction.  Needs a server (PGHOST/PGPORT/PGUSER) with idem;
# with IDEM_EDITION=sql, against the SQL edition (managed/idem.sql), in
# READ COMMITTED, where a waiting duplicate replays once the original
# commits.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
source "$(dirname "$0")/../lib.sh"

ROUNDS=${ROUNDS:-30}
CLIENTS=${CLIENTS:-20}
DB=idem_load
here=$(cd "$(dirname "$0")" && pwd)
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" -At "$@"; }

if [ "${IDEM_EDITION:-c}" = sql ]; then
	DB=idem_load_sql
	new_sql_edition_database "$DB"
	tables=idem
else
	new_idem_database "$DB"
	tables=idem_internal
fi
psql -c "CREATE TABLE idem_load_log (round_key text, order_id bigint, replayed boolean)"

failed_runs=0
failed_txns=0
for round in $(seq 1 "$ROUNDS"); do
	key=$(printf 'load-round-%06d-%s' "$round" "$$")
	if ! out=$("$PG_BINDIR/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -t 1 \
			-D key="$key" -f "$here/same_key.pgbench" "$DB" 2>&1); then
		failed_runs=$((failed_runs + 1))
		echo "$out" | tail -5 >&2
	fi
	n=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
	failed_txns=$((failed_txns + ${n:-0}))
done

check "pgbench: $ROUNDS rounds of $CLIENTS clients ran" 0 "$failed_runs"
check "pgbench: no failed transaction" 0 "$failed_txns"
check "every caller recorded its answer" $((ROUNDS * CLIENTS)) \
	"$(psql -c "SELECT count(*) FROM idem_load_log")"
check "exactly one order per round" "$ROUNDS" \
	"$(psql -c "SELECT count(*) FROM $tables.purchase_order WHERE owner_id = 77")"
check "every caller of a round got the same order_id" "$ROUNDS" \
	"$(psql -c "SELECT count(*) FROM (SELECT round_key FROM idem_load_log
	            GROUP BY round_key HAVING count(DISTINCT order_id) = 1) s")"
check "one caller per round executed, the others replayed" "$ROUNDS" \
	"$(psql -c "SELECT count(*) FROM (SELECT round_key FROM idem_load_log GROUP BY round_key
	            HAVING count(*) FILTER (WHERE NOT replayed) = 1
	               AND count(*) FILTER (WHERE replayed) = $CLIENTS - 1) s")"
check "each round's order is the one its record points to" "$ROUNDS" \
	"$(psql -c "SELECT count(DISTINCT l.round_key) FROM idem_load_log l
	            JOIN $tables.idempotency_record r ON r.idempotency_key = l.round_key AND r.owner_id = 77
	            JOIN $tables.purchase_order o ON o.id = r.resource_id AND o.id = l.order_id")"

"$PG_BINDIR/dropdb" "$DB"
