#!/usr/bin/env bash
# The long-flow benchmark (issue 11): idem_lease + idem_complete against a
# plain PL/pgSQL FOR UPDATE SKIP LOCKED queue doing the same work, on a
# throwaway server; 8 workers (pgbench -M prepared -c 8 -j 2) drain a
# queue filled beforehand, variants interleaved and repeated REPS times;
# prints jobs per second of wall time (median) and the ratio per repetition.
#
# One job: lease it (attempt + 1, a new fencing token, a lease of 30 s),
# insert its business row, store its result (checking the token), all in
# the worker's transaction.  The plain queue does exactly that with its own
# columns (status, attempts, token from a sequence, due time, lease end,
# worker, heartbeat, result) and the indexes a queue of unique jobs kept
# for a retention period has, as idem's record has them: a primary key, a
# unique job key, a partial index of what is due, an index of expiry.  Its
# lease moves the job's due time to the lease's end; idem's leaves it and
# steps over held leases.  What it does not have is idem's: the request
# fingerprint, the replay to a repeated submit, the checks, the statistics.
#
#   one:   one job per transaction (8 x 2,000 jobs)
#   batch: batches of 100 per transaction (8 x 40 x 100 jobs)
#
#   bash test/bench/task_bench.sh                # 3 repetitions
#   IDEM_BENCH_REPS=5 bash test/bench/task_bench.sh
source "$(dirname "$0")/../lib.sh"

REPS=${IDEM_BENCH_REPS:-3}
CLIENTS=8
ONE_TXNS=${IDEM_BENCH_ONE_TXNS:-2000}		# per client
BATCH_TXNS=${IDEM_BENCH_BATCH_TXNS:-40}	# per client, 100 jobs each

ensure_packages
build_install
start_bench_server

sql <<'SQL'
CREATE EXTENSION idem;
CREATE SCHEMA plain;
CREATE SEQUENCE plain.token_seq;
CREATE TABLE plain.jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    owner_id bigint NOT NULL,
    job_key text NOT NULL,
    request jsonb NOT NULL,
    payload jsonb,
    status text NOT NULL,
    attempts int NOT NULL DEFAULT 0,
    token bigint,
    due_at timestamptz,
    lease_expires_at timestamptz,
    worker text,
    heartbeat_at timestamptz,
    http_status int,
    body json,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL DEFAULT 'infinity');
-- what a queue with unique jobs and a retention period has (River's job
-- table has the like): a unique job key, what is due, when a job may go
CREATE UNIQUE INDEX ON plain.jobs (owner_id, queue, job_key);
CREATE INDEX ON plain.jobs (queue, due_at) WHERE due_at IS NOT NULL;
CREATE INDEX ON plain.jobs (expires_at);
CREATE FUNCTION plain.lease(q text, w text, n int)
RETURNS TABLE (task_id bigint, owner bigint, request jsonb, payload jsonb, attempt int, token bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH d AS (SELECT j.id FROM plain.jobs j WHERE j.queue = q AND j.due_at <= clock_timestamp()
               ORDER BY j.due_at LIMIT n FOR UPDATE SKIP LOCKED)
    UPDATE plain.jobs j SET status = 'PROCESSING', attempts = j.attempts + 1,
        token = nextval('plain.token_seq'), due_at = clock_timestamp() + interval '30 seconds',
        lease_expires_at = clock_timestamp() + interval '30 seconds', worker = w,
        heartbeat_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM d WHERE j.id = d.id
    RETURNING j.id, j.owner_id, j.request, j.payload, j.attempts, j.token;
END $$;
CREATE FUNCTION plain.complete(i bigint, t bigint, http int, b json) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE plain.jobs SET status = 'SUCCEEDED', http_status = http, body = b, due_at = NULL,
        lease_expires_at = NULL, updated_at = clock_timestamp(),
        expires_at = clock_timestamp() + interval '1 day'
    WHERE id = i AND token = t AND status = 'PROCESSING' AND lease_expires_at IS NOT NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'stale token' USING ERRCODE = 'IK004';
    END IF;
END $$;
-- the business work of a job, the same for both: its row, then its result
CREATE TABLE public.effect (task_id bigint NOT NULL, done_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION public.work_idem(t bigint, tok bigint) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.effect (task_id) VALUES (t);
    PERFORM public.idem_complete(t, tok, 200, '{"shipped": true}');
    RETURN 1;
END $$;
CREATE FUNCTION public.work_plain(t bigint, tok bigint) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.effect (task_id) VALUES (t);
    PERFORM plain.complete(t, tok, 200, '{"shipped": true}');
    RETURN 1;
END $$;
SQL

W=$IDEM_TMP/bench
mkdir -p "$W"
chmod 777 "$W"
for n in 1 100; do
	echo "SELECT sum(public.work_idem(task_id, token)) FROM public.idem_lease('bench', 'w' || :client_id, '30 seconds', $n);" >"$W/idem_$n.sql"
	echo "SELECT sum(public.work_plain(task_id, token)) FROM plain.lease('bench', 'w' || :client_id, $n);" >"$W/plain_$n.sql"
done

fill() {	# fill idem|plain N
	sql -c "TRUNCATE public.effect" >/dev/null
	if [ "$1" = idem ]; then
		# submitted 1,000 per transaction: each holds its key's lock until commit
		sql -c "DELETE FROM idem_internal.idempotency_record" -c "DO \$\$ BEGIN
			FOR c IN 0 .. ($2 - 1) / 1000 LOOP
				PERFORM public.idem_submit(g % 1000, 'bench', 'bench-key-' || lpad(g::text, 12, '0'),
					jsonb_build_object('order', g), '{\"carrier\": \"dhl\"}')
				FROM generate_series(c * 1000 + 1, least((c + 1) * 1000, $2)) g;
				COMMIT;
			END LOOP; END \$\$" >/dev/null
		sql -c "VACUUM ANALYZE idem_internal.idempotency_record" >/dev/null
	else
		sql -c "TRUNCATE plain.jobs" -c "INSERT INTO plain.jobs (queue, owner_id, job_key, request, payload, status, due_at)
			SELECT 'bench', g % 1000, 'bench-key-' || lpad(g::text, 12, '0'), jsonb_build_object('order', g),
			'{\"carrier\": \"dhl\"}', 'PENDING', now() FROM generate_series(1, $2) g" \
			-c "VACUUM ANALYZE plain.jobs" >/dev/null
	fi
}

declare -A JOBS
log "$REPS interleaved repetitions, $CLIENTS workers"
for rep in $(seq 1 "$REPS"); do
	for v in idem_1 plain_1 idem_100 plain_100; do
		case $v in
		*_1) n=$((CLIENTS * ONE_TXNS)); txns=$ONE_TXNS ;;
		*_100) n=$((CLIENTS * BATCH_TXNS * 100)); txns=$BATCH_TXNS ;;
		esac
		fill "${v%_*}" "$n"
		start=$(date +%s.%N)
		as_pg_user "$PG_BINDIR/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -t "$txns" \
			-h "$PGHOST" -p "$PGPORT" -f "$W/$v.sql" "$DB" >"$W/$v.$rep.out" 2>&1 ||
			{ log "pgbench $v failed:"; cat "$W/$v.$rep.out" >&2; }
		end=$(date +%s.%N)
		done_jobs=$(sql -At -c "SELECT count(*) FROM public.effect")
		t=$(awk -v n="$done_jobs" -v a="$start" -v b="$end" 'BEGIN {printf "%.0f", n / (b - a)}')
		JOBS[$v]="${JOBS[$v]:-} $t"
		log "  rep $rep $v: $done_jobs of $n jobs done, $t jobs/s"
	done
done

echo
echo "## idem long-flow benchmark: $(date -u +%Y-%m-%d), $(nproc) cores, 8 workers (-c $CLIENTS -j 2), $REPS interleaved repetitions"
pair() {	# pair LABEL A B
	local per
	per=$(per_repetition_ratios "${JOBS[$2]}" "${JOBS[$3]}")
	printf '%s: idem %s jobs/s, PL/pgSQL SKIP LOCKED queue %s jobs/s; ratio per repetition: %s(median %s)\n' "$1" \
		"$(echo "${JOBS[$2]}" | median)" "$(echo "${JOBS[$3]}" | median)" "$per" "$(echo "$per" | median)"
}
pair "lease + complete, one job per transaction" idem_1 plain_1
pair "lease + complete, batches of 100" idem_100 plain_100
