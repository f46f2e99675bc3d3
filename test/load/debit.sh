#!/usr/bin/env bash
# Load check of the generic API: CLIENTS pgbench clients call idem_run with
# the same key at the same moment, a handler debiting one account by 100,
# for ROUNDS rounds with distinct keys.  Passes when every round debited
# exactly once, every caller of a round got the same answer (status, body,
# resource id), one executed and the others replayed, and pgbench counted
# no failed transaction.  Needs a server (PGHOST/PGPORT/PGUSER) with idem.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
source "$(dirname "$0")/../lib.sh"

ROUNDS=${ROUNDS:-30}
CLIENTS=${CLIENTS:-20}
DB=idem_load_debit
here=$(cd "$(dirname "$0")" && pwd)
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" -At "$@"; }

new_idem_database "$DB"
psql <<'SQL'
CREATE TABLE account (id bigint PRIMARY KEY, balance numeric NOT NULL);
CREATE TABLE debit (id bigserial PRIMARY KEY, account_id bigint NOT NULL, amount numeric NOT NULL);
INSERT INTO account VALUES (1, 1000000);
CREATE FUNCTION debit_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
DECLARE d bigint;
BEGIN
    UPDATE public.account SET balance = balance - (request->>'amount')::numeric
    WHERE id = (request->>'account')::bigint;
    INSERT INTO public.debit (account_id, amount)
    VALUES ((request->>'account')::bigint, (request->>'amount')::numeric) RETURNING id INTO d;
    RETURN ROW(201, json_build_object('debitId', d), NULL, d)::idem_result;
END $$;
CREATE TABLE idem_load_log (round_key text, replayed boolean, http_status int, body text, resource_id bigint);
SQL

failed_runs=0
failed_txns=0
for round in $(seq 1 "$ROUNDS"); do
	key=$(printf 'debit-round-%06d-%s' "$round" "$$")
	if ! out=$("$PG_BINDIR/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -t 1 \
			-D key="$key" -f "$here/debit.pgbench" "$DB" 2>&1); then
		failed_runs=$((failed_runs + 1))
		echo "$out" | tail -5 >&2
	fi
	n=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
	failed_txns=$((failed_txns + ${n:-0}))
done

check "pgbench: $ROUNDS rounds of $CLIENTS clients ran idem_run" 0 "$failed_runs"
check "pgbench: no failed transaction" 0 "$failed_txns"
check "every caller recorded its answer" $((ROUNDS * CLIENTS)) \
	"$(psql -c "SELECT count(*) FROM idem_load_log")"
check "exactly one debit per round" "$ROUNDS" "$(psql -c "SELECT count(*) FROM debit")"
check "the balance fell by 100 per round" $((1000000 - 100 * ROUNDS)) \
	"$(psql -c "SELECT balance::bigint FROM account WHERE id = 1")"
check "every caller of a round got the same answer" "$ROUNDS" \
	"$(psql -c "SELECT count(*) FROM (SELECT round_key FROM idem_load_log GROUP BY round_key
	            HAVING count(DISTINCT (http_status, body, resource_id)) = 1) s")"
check "one caller per round executed, the others replayed" "$ROUNDS" \
	"$(psql -c "SELECT count(*) FROM (SELECT round_key FROM idem_load_log GROUP BY round_key
	            HAVING count(*) FILTER (WHERE NOT replayed) = 1
	               AND count(*) FILTER (WHERE replayed) = $CLIENTS - 1) s")"
check "each round's record points to its debit" "$ROUNDS" \
	"$(psql -c "SELECT count(DISTINCT l.round_key) FROM idem_load_log l
	            JOIN idem_internal.idempotency_record r ON r.idempotency_key = l.round_key AND r.owner_id = 77
	            JOIN debit d ON d.id = r.resource_id AND d.id = l.resource_id")"

"$PG_BINDIR/dropdb" "$DB"
