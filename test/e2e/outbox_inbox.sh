#!/usr/bin/env bash
# End to end, under kill -9: producers make REQUESTS idempotent requests
# with random duplicates (idem_run; each new request debits an account,
# records an order and emits one message keyed by its account); 3 publisher
# processes lease outbox messages, append them to a broker log and
# acknowledge them; 2 consumers read the log and apply each message with
# idem_consume in one transaction with its effect, committing their offsets
# afterwards.  While the producers run, a chaos loop kills a random
# publisher or consumer with kill -9 and restarts it.  Passes when every
# message was acknowledged, none was lost, each took effect exactly once,
# per-key (per-account) order held, and the kills did cause redeliveries
# (one publisher and one consumer also exit once in the window between
# their two commits, E2E_CRASH_DIR: redeliveries whatever the random kills
# hit; a role that exited is restarted).
# Needs a server (PGHOST/PGPORT/PGUSER) with idem, and python3-psycopg.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
source "$(dirname "$0")/../lib.sh"

REQUESTS=${REQUESTS:-10000}
PRODUCERS=${PRODUCERS:-4}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-180}
export E2E_DB=idem_e2e
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -t idem-e2e.XXXXXX)
export E2E_CRASH_DIR=$work
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$E2E_DB" -At "$@"; }
# exec: $! of "py ... &" is then the python process itself, for kill -9
py() { exec /usr/bin/python3 "$here/pipeline.py" "$@"; }

new_idem_database "$E2E_DB"
psql <<'SQL'
CREATE TABLE e2e_account (id int PRIMARY KEY, seq int NOT NULL DEFAULT 0, balance bigint NOT NULL DEFAULT 0);
INSERT INTO e2e_account (id) SELECT generate_series(0, 49);
CREATE TABLE e2e_order (j bigint PRIMARY KEY, account int NOT NULL, seq int NOT NULL);
-- the business work of one request: the account's sequence (its row lock
-- orders the account's commits), an order, one message keyed by account
CREATE FUNCTION e2e_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
DECLARE
    acct int := (request->>'account')::int;
    s int;
BEGIN
    UPDATE public.e2e_account SET seq = seq + 1, balance = balance - (request->>'amount')::int
     WHERE id = acct RETURNING seq INTO s;
    INSERT INTO public.e2e_order VALUES ((request->>'j')::bigint, acct, s);
    PERFORM public.idem_outbox_emit('e2e',
        jsonb_build_object('account', acct, 'seq', s, 'j', request->'j'), 'account-' || acct);
    RETURN ROW(201, json_build_object('seq', s), NULL, (request->>'j')::bigint)::idem_result;
END $$;
-- the broker: a log with partitions and consumer offsets
CREATE TABLE e2e_broker (log_offset bigserial PRIMARY KEY, partition int NOT NULL,
                         message_id bigint NOT NULL, msg_key text, payload jsonb NOT NULL);
CREATE INDEX ON e2e_broker (partition, log_offset);
CREATE TABLE e2e_offsets (partition int PRIMARY KEY, committed bigint NOT NULL, redeliveries int NOT NULL DEFAULT 0);
INSERT INTO e2e_offsets (partition, committed) VALUES (0, 0), (1, 0);
-- the consumer's effect, and what it saw out of order
CREATE TABLE e2e_effect (message_id bigint NOT NULL, account int NOT NULL, seq int NOT NULL);
CREATE TABLE e2e_state (account int PRIMARY KEY, last_seq int NOT NULL);
INSERT INTO e2e_state SELECT generate_series(0, 49), 0;
CREATE TABLE e2e_violation (message_id bigint, account int, seq int);
SQL

# the restartable processes: 3 publishers, 2 consumers
roles=("publisher" "publisher" "publisher" "consumer 0" "consumer 1")
declare -a pids
start_role() {	# start_role INDEX
	# shellcheck disable=SC2086
	py ${roles[$1]} 2>>"$work/role-$1.log" &
	pids[$1]=$!
}
for i in "${!roles[@]}"; do start_role "$i"; done

producer_pids=()
per=$((REQUESTS / PRODUCERS))
for p in $(seq 0 $((PRODUCERS - 1))); do
	py producer "$p" "$per" "$PRODUCERS" 2>>"$work/producer-$p.log" &
	producer_pids+=($!)
done

# chaos while the producers run, and a little after
kills=0
producing() {
	for pid in "${producer_pids[@]}"; do
		kill -0 "$pid" 2>/dev/null && return 0
	done
	return 1
}
extra=10
# restart_exited: the roles that exited on their own (E2E_CRASH_DIR) run again
restart_exited() {
	local i
	for i in "${!roles[@]}"; do
		kill -0 "${pids[$i]}" 2>/dev/null || { wait "${pids[$i]}" 2>/dev/null || true; start_role "$i"; }
	done
}
while producing || [ "$extra" -gt 0 ]; do
	producing || extra=$((extra - 1))
	restart_exited
	sleep "0.$((RANDOM % 6 + 2))"
	i=$((RANDOM % ${#roles[@]}))
	if { kill -9 "${pids[$i]}" && wait "${pids[$i]}"; } 2>/dev/null; then :; fi
	kills=$((kills + 1))
	sleep 0.1
	start_role "$i"
done
restart_exited
producer_failures=0
for pid in "${producer_pids[@]}"; do
	wait "$pid" || producer_failures=$((producer_failures + 1))
done

# let the pipeline drain: every message acknowledged and consumed
deadline=$((SECONDS + DRAIN_TIMEOUT))
while [ $SECONDS -lt $deadline ]; do
	left=$(psql -c "SELECT (SELECT count(*) FROM idem_internal.idem_outbox WHERE acked_at IS NULL)
	                     + (SELECT count(*) FROM e2e_broker b JOIN e2e_offsets o USING (partition)
	                        WHERE b.log_offset > o.committed)")
	[ "$left" = 0 ] && break
	restart_exited
	sleep 0.5
done
for pid in "${pids[@]}"; do
	{ kill -9 "$pid" && wait "$pid"; } 2>/dev/null || true
done

orders=$(psql -c "SELECT count(*) FROM e2e_order")
records=$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'E2E_ORDER'")
# the outbox deletes what is acknowledged (1.12): the messages emitted are
# counted at their commits in idem_stats, and each reached the broker
messages=$(psql -c "SELECT outbox_emitted FROM idem_stats WHERE datname = current_database() AND kind = 'topic' AND operation = 'e2e'")
brokered=$(psql -c "SELECT count(DISTINCT message_id) FROM e2e_broker")
redeliveries=$(psql -c "SELECT sum(redeliveries) FROM e2e_offsets")
pushed=$(psql -c "SELECT count(*) - count(DISTINCT message_id) FROM e2e_broker")
echo "# $REQUESTS requests, $orders distinct; $kills kills; $pushed duplicate pushes; $redeliveries redeliveries skipped by idem_consume"

check "every producer finished its requests" 0 "$producer_failures"
check "duplicates among the requests were replayed (fewer orders than requests)" yes \
	"$([ "$orders" -lt "$REQUESTS" ] && [ "$orders" -gt $((REQUESTS / 2)) ] && echo yes || echo "no ($orders)")"
check "one record per order" "$orders" "$records"
check "one message per order: the outbox emitted exactly the committed ones, and each reached the broker" "$orders $orders" "$messages $brokered"
check "every message acknowledged" 0 "$(psql -c "SELECT count(*) FROM idem_internal.idem_outbox WHERE acked_at IS NULL")"
check "no message lost: every order's message reached the broker" 0 \
	"$(psql -c "SELECT count(*) FROM e2e_order o WHERE NOT EXISTS (
	            SELECT 1 FROM e2e_broker b WHERE (b.payload->>'j')::bigint = o.j)")"
check "each message took effect exactly once" "$orders $orders" \
	"$(psql -c "SELECT count(*) || ' ' || count(DISTINCT message_id) FROM e2e_effect")"
check "one inbox entry per message" "$orders" \
	"$(psql -c "SELECT count(*) FROM idem_internal.idem_inbox WHERE consumer = 'e2e-consumer'")"
check "per-key order: every account's messages applied in commit order" 0 \
	"$(psql -c "SELECT count(*) FROM e2e_violation")"
check "every account's last applied message is its last order" 0 \
	"$(psql -c "SELECT count(*) FROM e2e_account a JOIN e2e_state s ON s.account = a.id WHERE s.last_seq <> a.seq")"
check "a publisher and a consumer exited once between their two commits" "crashed-consumer crashed-publisher" \
	"$(cd "$work" && echo crashed-*)"
check "the kills happened and caused redeliveries or duplicate pushes" yes \
	"$([ "$kills" -ge 5 ] && [ $((redeliveries + pushed)) -gt 0 ] && echo yes || echo "no ($kills kills)")"
for f in "$work"/producer-*.log; do
	[ -s "$f" ] && { echo "# $f:"; tail -3 "$f"; }
done
rm -rf "$work"
