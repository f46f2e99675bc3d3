#!/usr/bin/env bash
# Payments with uncertain outcomes (issue 54): PAYMENTS payments through a
# payment provider that is not idempotent (test/chaos/payment_provider.py:
# every charge call charges; one in five is answered after the worker's
# client gave up) and has a lookup by key, charged by WORKERS Python
# workers (test/chaos/payment_worker.py, on idem_pg.TaskWorker) that kill
# themselves with kill -9 at random points: before the charge, and between
# the provider's answer and idem_complete; a new worker replaces each.
#
# With the operation's policy uncertain => 'reconcile': every key charged
# exactly once at the provider, every payment SUCCEEDED with that charge,
# every charge call made after an attempt of unknown outcome preceded by a
# lookup of its key, every late answer an 'unknown' attempt in
# idem_task_attempts, nothing left uncertain.  The control: CONTROL
# payments, the same provider and kills, the policy unset and the worker
# as idem 1.15 allowed it (a timeout is a retryable failure): keys charged
# twice.
# Needs a server (PGHOST/PGPORT/PGUSER) with idem preloaded, and python3-psycopg.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
source "$(dirname "$0")/../lib.sh"

PAYMENTS=${PAYMENTS:-2000}
CONTROL=${CONTROL:-300}
WORKERS=${WORKERS:-4}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -t idem-payments.XXXXXX)
chmod 755 "$work"
export PYTHONPATH="$IDEM_ROOT/clients/python/src"
# retries and reconciliations come back within a fifth of a second
export PGOPTIONS="-c idem.retry_base=20ms -c idem.retry_max=200ms -c idem.max_attempts=50"

declare -a pids
provider_pid=
stop_all() {
	for pid in "${pids[@]}" $provider_pid; do
		{ kill -9 "$pid" && wait "$pid"; } 2>/dev/null || true
	done
	pids=()
	provider_pid=
}
at_exit stop_all

# setup MODE N [LATE_RATE]: database idem_pay_MODE with N payments submitted
# and the provider started (one answer in five late, or LATE_RATE)
setup() {
	local mode=$1 n=$2
	export PAY_DB=idem_pay_$1 KILL_LOG=$work/kills-$1
	: >"$KILL_LOG"
	new_idem_database "$PAY_DB"
	psql -c "CREATE TABLE payment (task_id bigint NOT NULL, charge text NOT NULL, worker text NOT NULL)"
	psql -c "CREATE TABLE provider_call (doc jsonb NOT NULL)"
	if [ "$mode" != control ]; then
		psql -c "SELECT idem_set_policy('PAY', uncertain => 'reconcile')" >/dev/null
	fi
	PROVIDER_PORT=$(free_port)
	export PROVIDER_PORT
	/usr/bin/python3 "$here/payment_provider.py" "$PROVIDER_PORT" "$work/journal-$mode" 20261206 "${3:-0.2}" \
		2>>"$work/provider.log" &
	provider_pid=$!
	until_ok /usr/bin/python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PROVIDER_PORT/journal')" ||
		{ echo "not ok - the payment provider starts"; return 0; }
	psql -c "SELECT count(idem_submit(g % 50, 'PAY', 'pay-key-' || lpad(g::text, 10, '0'),
	                                  jsonb_build_object('amount', 100 + g)))
	         FROM generate_series(1, $n) g" >/dev/null
}
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$PAY_DB" -At "$@"; }

# drive WORKER_MODE LOG CONDITION: WORKERS workers (restarted when they
# die) until the SQL CONDITION is true or IDEM_WAIT s passed; disowned, so
# the shell does not report the kills
drive() {
	local mode=$1 log=$2 gen=0 deadline=$((SECONDS + IDEM_WAIT))
	start() {
		gen=$((gen + 1))
		/usr/bin/python3 "$here/payment_worker.py" "w$1-g$gen" "$mode" 2>>"$log" &
		pids[$1]=$!
		disown "${pids[$1]}"
	}
	for i in $(seq 0 $((WORKERS - 1))); do start "$i"; done
	while [ "$(psql -c "SELECT $3")" != t ] && [ $SECONDS -lt $deadline ]; do
		sleep 0.2
		for i in $(seq 0 $((WORKERS - 1))); do
			if ! kill -0 "${pids[$i]}" 2>/dev/null; then
				start "$i"
			fi
		done
	done
	for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
	pids=()
}

unfinished() { psql -c "SELECT count(*) FROM idem_internal.idempotency_record
                        WHERE operation = 'PAY' AND status NOT IN ('SUCCEEDED', 'FAILED_FINAL')"; }

# run MODE N: N payments charged by workers of MODE; the provider's calls
# end in table provider_call, the kills in KILL_LOG
run() {
	local mode=$1 n=$2 started=$SECONDS
	setup "$mode" "$n"
	drive "$mode" "$work/worker-$mode.log" "NOT EXISTS (SELECT FROM idem_internal.idempotency_record
	                                     WHERE operation = 'PAY' AND status NOT IN ('SUCCEEDED', 'FAILED_FINAL'))"
	local took=$((SECONDS - started))
	stop_all
	psql -c "\\copy provider_call FROM '$work/journal-$mode'"
	echo "# $mode: $n payments in ${took} s; $(grep -c ' before$' "$KILL_LOG" || true) workers killed before a charge," \
		"$(grep -c ' after$' "$KILL_LOG" || true) after the provider's answer;" \
		"$(psql -c "SELECT count(*) FILTER (WHERE doc->>'kind' = 'charge') || ' charge calls ('
		               || count(*) FILTER (WHERE (doc->>'late')::boolean) || ' answered late), '
		               || count(*) FILTER (WHERE doc->>'kind' = 'lookup') || ' lookups' FROM provider_call")"
	if grep -q Traceback "$work/worker-$mode.log" 2>/dev/null; then
		tail -n 20 "$work/worker-$mode.log" >&2
	fi
	check "$mode: no worker failed other than by its kills" 0 "$(grep -c Traceback "$work/worker-$mode.log" || true)"
	check "$mode: every payment ended within ${IDEM_WAIT} s" 0 "$(unfinished)"
}

charged_twice() {
	psql -c "SELECT count(*) FROM (SELECT doc->>'key' FROM provider_call WHERE doc->>'kind' = 'charge'
	         GROUP BY 1 HAVING count(*) > 1) x"
}

run reconcile "$PAYMENTS"
check "reconcile: every key charged exactly once at the provider" "$PAYMENTS 0" \
	"$(psql -c "SELECT count(DISTINCT doc->>'key') FROM provider_call WHERE doc->>'kind' = 'charge'") $(charged_twice)"
check "reconcile: every payment SUCCEEDED, its stored answer and its one business row the provider's charge" "$PAYMENTS $PAYMENTS" \
	"$(psql -c "SELECT count(*) FILTER (WHERE r.status = 'SUCCEEDED' AND r.response_body::jsonb->>'charge' = c.doc->>'charge'),
	                   count(*) FILTER (WHERE (SELECT count(*) FROM payment p WHERE p.task_id = r.id AND p.charge = c.doc->>'charge') = 1)
	            FROM idem_internal.idempotency_record r
	            JOIN provider_call c ON c.doc->>'key' = r.idempotency_key AND c.doc->>'kind' = 'charge'
	            WHERE r.operation = 'PAY'" | tr '|' ' ')"
# a charge call made after an attempt of unknown outcome (a late answer, a
# worker killed) must have a lookup of its key between that attempt's end
# and the call
after_uncertain="
	FROM provider_call c
	JOIN idem_internal.idempotency_record r ON r.operation = 'PAY' AND r.idempotency_key = c.doc->>'key'
	CROSS JOIN LATERAL (SELECT max(a.ended_at) AS ended FROM idem_task_attempts a
	                    WHERE a.task_id = r.id AND NOT a.reconcile AND a.outcome IN ('unknown', 'lapsed')
	                      AND a.ended_at < to_timestamp((c.doc->>'at')::float8)) u
	WHERE c.doc->>'kind' = 'charge' AND u.ended IS NOT NULL"
check "reconcile: every charge call after an attempt of unknown outcome was preceded by a lookup (and there were such calls)" "0 yes" \
	"$(psql -c "SELECT count(*) FILTER (WHERE NOT EXISTS (
	                SELECT 1 FROM provider_call l WHERE l.doc->>'kind' = 'lookup' AND l.doc->>'key' = c.doc->>'key'
	                   AND to_timestamp((l.doc->>'at')::float8) BETWEEN u.ended AND to_timestamp((c.doc->>'at')::float8))),
	                   CASE WHEN count(*) > 0 THEN 'yes' ELSE 'no' END $after_uncertain" | tr '|' ' ')"
check "reconcile: every late answer is an 'unknown' attempt in idem_task_attempts" \
	"$(psql -c "SELECT count(*) FROM provider_call WHERE (doc->>'late')::boolean")" \
	"$(psql -c "SELECT count(*) FROM idem_task_attempts WHERE operation = 'PAY' AND outcome = 'unknown' AND NOT reconcile")"
check "reconcile: the kills left leases lapsed and reconciled, nothing is left uncertain" "yes 0" \
	"$(psql -c "SELECT CASE WHEN count(*) FILTER (WHERE outcome = 'lapsed') > 0 AND count(*) FILTER (WHERE reconcile) > 0
	                        THEN 'yes' ELSE 'no' END FROM idem_task_attempts WHERE operation = 'PAY'") $(psql -c "SELECT uncertain_tasks FROM idem_health()")"

run control "$CONTROL"
twice=$(charged_twice)
echo "# control: $twice of $CONTROL keys charged more than once"
check "control: without reconciliation the same provider and kills charge keys twice" yes \
	"$([ "$twice" -gt 0 ] && echo yes || echo "no ($twice)")"

# An operator cancels uncertain payments (issue 55): CANCELLED payments whose
# every charge is answered late are marked by workers that do not
# reconcile; an operator (idem_grant(..., 'operator')) cancels each; then
# reconciling workers run until a canary payment has succeeded (its late
# charge reconciled): no cancelled key is looked up or charged again.
CANCELLED=${CANCELLED:-100}
export KILL_RATE=0
setup cancel "$CANCELLED" 1.0
drive mark "$work/worker-cancel.log" "(SELECT count(*) FROM idem_internal.idempotency_record
                                     WHERE operation = 'PAY' AND task_uncertain_since IS NOT NULL) = $CANCELLED"
psql -c "SET client_min_messages = warning" -c "DROP ROLE IF EXISTS idem_pay_operator" -c "CREATE ROLE idem_pay_operator" >/dev/null
psql -c "SELECT count(*) FROM idem_grant('idem_pay_operator', 'operator')" >/dev/null
psql -c "SET ROLE idem_pay_operator" -c "SELECT count(idem_task_cancel(task_id, 'the customer cancelled: not to be charged again'))
         FROM idem_task_attempts WHERE operation = 'PAY' AND outcome = 'unknown'" >/dev/null
psql -c "SELECT idem_submit(99, 'PAY', 'pay-key-canary-0001', '{\"amount\": 1}')" >/dev/null
drive reconcile "$work/worker-cancel.log" "(SELECT status = 'SUCCEEDED' FROM idem_internal.idempotency_record
                                          WHERE idempotency_key = 'pay-key-canary-0001')"
stop_all
psql -c "\\copy provider_call FROM '$work/journal-cancel'"
check "cancel: the operator cancelled every uncertain payment, each audited with its reason, as the operator" "$CANCELLED $CANCELLED" \
	"$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'PAY' AND status = 'FAILED_FINAL'
	             AND response_body::jsonb->'error'->>'cancelled' LIKE 'the customer cancelled%'") $(psql -c "SELECT count(*)
	             FROM idem_operator_actions WHERE action = 'cancel' AND current_user_name = 'idem_pay_operator'")"
check "cancel: reconciling workers ran (the canary's late charge was reconciled), yet no cancelled key was looked up or charged again" \
	"SUCCEEDED $CANCELLED 0" \
	"$(psql -c "SELECT status FROM idem_internal.idempotency_record WHERE idempotency_key = 'pay-key-canary-0001'") $(psql -c "SELECT count(*) FILTER (WHERE charges = 1) || ' ' || count(*) FILTER (WHERE lookups > 0)
	             FROM (SELECT doc->>'key' AS k, count(*) FILTER (WHERE doc->>'kind' = 'charge') AS charges,
	                          count(*) FILTER (WHERE doc->>'kind' = 'lookup') AS lookups
	                     FROM provider_call WHERE doc->>'key' <> 'pay-key-canary-0001' GROUP BY 1) x")"
psql -c "DROP OWNED BY idem_pay_operator" -c "DROP ROLE idem_pay_operator" >/dev/null
rm -rf "$work"
