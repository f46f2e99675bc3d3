#!/usr/bin/env bash
# Chaos for long flows (issue 11): TASKS tasks submitted (with repeated
# submits), 6 worker processes (test/chaos/task_worker.py) leasing in
# batches with bind_session, each task's business row and idem_complete in
# one transaction, 1 in 10 attempts failing retryably; two of the workers
# are killed with kill -9 at random points and restarted while the others
# run.  Passes when every task SUCCEEDED exactly once (one business row
# each), none is left PROCESSING or leased, attempt counts match the leases
# handed out (attempt n is the n-th lease, tokens grow), and every task a
# killed worker held was taken over before half its lease (a minute) would
# have lapsed: the end of the session ended the lease, not its expiry.
# Needs a server (PGHOST/PGPORT/PGUSER) with idem preloaded, and python3-psycopg.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
source "$(dirname "$0")/../lib.sh"

TASKS=${TASKS:-10000}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-$IDEM_WAIT}
export CHAOS_DB=idem_chaos
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -t idem-chaos.XXXXXX)
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$CHAOS_DB" -At "$@"; }

new_idem_database "$CHAOS_DB"
psql <<'SQL'
CREATE TABLE chaos_effect (task_id bigint NOT NULL, n int NOT NULL, worker text NOT NULL);
CREATE TABLE chaos_lease (task_id bigint NOT NULL, attempt int NOT NULL, token bigint NOT NULL,
                          worker text NOT NULL, leased_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE chaos_fail (task_id bigint NOT NULL, attempt int NOT NULL);
CREATE TABLE chaos_stale (task_id bigint NOT NULL, attempt int NOT NULL, worker text NOT NULL);
CREATE TABLE chaos_kill (worker text PRIMARY KEY, killed_at timestamptz NOT NULL);
SQL
# the submits: every task once, a fifth of them twice more (replayed, no second task)
psql -c "DO \$\$ BEGIN
	FOR c IN 0 .. ($TASKS - 1) / 1000 LOOP
		PERFORM idem_submit(g % 100, 'CHAOS', 'chaos-key-' || lpad(g::text, 10, '0'), jsonb_build_object('n', g))
		FROM generate_series(c * 1000 + 1, least((c + 1) * 1000, $TASKS)) g;
		COMMIT;
	END LOOP;
	PERFORM idem_submit(g % 100, 'CHAOS', 'chaos-key-' || lpad(g::text, 10, '0'), jsonb_build_object('n', g))
	FROM generate_series(1, $TASKS, 5) g, generate_series(1, 2);
END \$\$"

# retries come back within half a second
export PGOPTIONS="-c idem.retry_base=20ms -c idem.retry_max=500ms -c idem.max_attempts=20"
declare -a pids gens
start_worker() {	# start_worker I: a new generation of worker I
	gens[$1]=$(( ${gens[$1]:-0} + 1 ))
	/usr/bin/python3 "$here/task_worker.py" "w$1-g${gens[$1]}" 2>>"$work/worker-$1.log" &
	pids[$1]=$!
}
for i in 0 1 2 3 4 5; do start_worker "$i"; done

unfinished() { psql -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'CHAOS' AND task_due_at IS NOT NULL"; }
# kill -9 workers 0 and 1 at random points while work is left
kills=0
deadline=$((SECONDS + DRAIN_TIMEOUT))
while [ "$(unfinished)" -gt 0 ] && [ $SECONDS -lt $deadline ]; do
	sleep "0.$((RANDOM % 5 + 3))"
	i=$((RANDOM % 2))
	if { kill -9 "${pids[$i]}" && wait "${pids[$i]}"; } 2>/dev/null; then :; fi
	psql -c "INSERT INTO chaos_kill VALUES ('w$i-g${gens[$i]}', clock_timestamp())"
	kills=$((kills + 1))
	sleep 0.05
	start_worker "$i"
done
for pid in "${pids[@]}"; do
	{ kill -9 "$pid" && wait "$pid"; } 2>/dev/null || true
done
crashed=0
for i in 0 1 2 3 4 5; do
	grep -q Traceback "$work/worker-$i.log" 2>/dev/null && { crashed=$((crashed + 1)); tail -5 "$work/worker-$i.log"; }
done

stats=$(psql -c "SELECT count(*) || ' leases, ' || count(*) FILTER (WHERE attempt > 1) || ' later attempts' FROM chaos_lease")
echo "# $TASKS tasks; $kills kills; $stats; $(psql -c "SELECT count(*) FROM chaos_fail") retryable failures;" \
	"$(psql -c "SELECT count(*) FROM chaos_stale") stale tokens refused"

check "no worker failed other than by its kills" 0 "$crashed"
check "one task per key, whatever the repeated submits" "$TASKS" \
	"$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'CHAOS'")"
check "every task SUCCEEDED" "$TASKS" \
	"$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'CHAOS' AND status = 'SUCCEEDED'")"
check "none left PROCESSING, retryable or leased" 0 \
	"$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'CHAOS'
	             AND (task_due_at IS NOT NULL OR task_lease_expires_at IS NOT NULL OR task_session IS NOT NULL)")"
check "exactly one business row per task" "$TASKS $TASKS" \
	"$(psql -c "SELECT count(*) || ' ' || count(DISTINCT task_id) FROM chaos_effect")"
check "each task's stored result is its own business row's" 0 \
	"$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record r JOIN chaos_effect e ON e.task_id = r.id
	             WHERE r.resource_id <> e.n OR r.response_body::text <> format('{\"n\": %s}', e.n)")"
check "attempt n is the n-th lease handed out, with a greater token each time" 0 \
	"$(psql -c "SELECT count(*) FROM (
	    SELECT task_id, attempt, token, row_number() OVER w AS nth, lag(token) OVER w AS prev_token
	    FROM chaos_lease WINDOW w AS (PARTITION BY task_id ORDER BY attempt)) l
	    WHERE attempt <> nth OR token <= prev_token")"
check "every task's attempt count is its number of leases" 0 \
	"$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record r
	             WHERE operation = 'CHAOS' AND task_attempts <> (SELECT count(*) FROM chaos_lease l WHERE l.task_id = r.id)")"
check "attempts = 1 + retryable failures + takeovers (a lease that ended neither way)" 0 \
	"$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record r WHERE operation = 'CHAOS' AND task_attempts <>
	             1 + (SELECT count(*) FROM chaos_fail f WHERE f.task_id = r.id)
	               + (SELECT count(*) FROM chaos_lease l WHERE l.task_id = r.id AND l.attempt < r.task_attempts
	                  AND NOT EXISTS (SELECT 1 FROM chaos_fail f WHERE f.task_id = l.task_id AND f.attempt = l.attempt))")"
# takeovers of what a killed worker held: the next attempt of a task whose
# lease a killed generation had, unless that lease ended in a failure
takeovers=$(psql -c "SELECT count(*) || ' ' || coalesce(round(max(extract(epoch FROM n.leased_at - k.killed_at))::numeric, 2), 0)
	FROM chaos_lease l JOIN chaos_kill k ON k.worker = l.worker
	JOIN chaos_lease n ON n.task_id = l.task_id AND n.attempt = l.attempt + 1
	WHERE NOT EXISTS (SELECT 1 FROM chaos_fail f WHERE f.task_id = l.task_id AND f.attempt = l.attempt)")
echo "# tasks taken over from killed workers, and the longest wait after a kill (s): $takeovers"
check "the kills happened and left tasks to take over" yes \
	"$([ "$kills" -ge 5 ] && [ "${takeovers%% *}" -gt 0 ] && echo yes || echo "no ($kills kills, $takeovers)")"
check "with bind_session, killed workers' tasks were taken over before half their lease would lapse (30 s of a minute)" yes \
	"$(awk -v t="${takeovers#* }" 'BEGIN {print (t < 30) ? "yes" : "no (" t " s)"}')"
rm -rf "$work"
