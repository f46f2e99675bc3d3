#!/usr/bin/env bash
# The outbox and inbox benchmark (issue 12): each idem function against the
# plain SQL a user would otherwise write, on a throwaway server, pgbench
# -M prepared -c 8 -j 2, variants interleaved and repeated REPS times;
# prints median TPS and the ratio per repetition.
#
#   emit:      idem_outbox_emit (one keyed message per transaction)
#              vs a bare INSERT into a copy of idem's outbox table (its
#              columns and indexes) and a NOTIFY (test/bench/peers.sql),
#              also with synchronous_commit = on
#   consume:   idem_consume on new message ids
#              vs INSERT ... ON CONFLICT DO NOTHING into the same inbox table
#   fetch+ack: batches of 100 (fetch and ack in one statement), 200 per
#              client, in messages acknowledged per second of wall time, vs a
#              PL/pgSQL FOR UPDATE SKIP LOCKED queue doing the same (lease,
#              then ack) without per-key order, and vs a pgmq-style queue in
#              plain SQL (pgmq's table: msg_id, read_ct, enqueued_at, vt,
#              message; read = UPDATE ... SET vt, read_ct over FOR UPDATE SKIP
#              LOCKED; then DELETE by id); idem keyless and over 1,000 keys
#              (one message per key in flight), idem's cleanup
#              (idem_cleanup_expired) inside the window
#
#   bash test/bench/outbox_bench.sh               # 3 repetitions of 10 s
#   IDEM_BENCH_REPS=5 IDEM_BENCH_SECONDS=5 bash test/bench/outbox_bench.sh
#   IDEM_BENCH_ONLY=drain bash test/bench/outbox_bench.sh   # fetch+ack only
source "$(dirname "$0")/../lib.sh"

REPS=${IDEM_BENCH_REPS:-3}
SECONDS_PER_RUN=${IDEM_BENCH_SECONDS:-10}
CLIENTS=8
DRAIN_TXNS=200			# per client and run: at most 8 x 200 x 100 = 160,000 messages

ensure_packages
build_install
start_bench_server

# the baselines: test/bench/peers.sql (plain.outbox, plain.inbox, the
# pgmq-style queue, plain.queue), shared with bench.sh and instructions.sh
sql -c "CREATE EXTENSION idem" -f "$(dirname "$0")/peers.sql"

W=$IDEM_TMP/bench
mkdir -p "$W"
chmod 777 "$W"
cat >"$W/emit.sql" <<'SQL'
\set k random(1, 1000)
SELECT public.idem_outbox_emit('bench', '{"order": 1, "status": "CREATED"}', 'account-' || :k);
SQL
cat >"$W/bare_insert.sql" <<'SQL'
\set k random(1, 1000)
WITH i AS (INSERT INTO plain.outbox (message_id, topic, msg_key, payload, emitted_at, commit_seq, attempt, ready) VALUES (nextval('plain.outbox_seq'), 'bench', 'account-' || :k, '{"order": 1, "status": "CREATED"}', now(), nextval('plain.outbox_seq'), 0, true) RETURNING message_id) SELECT i.message_id, pg_notify('idem_outbox', 'bench') FROM i;
SQL
cat >"$W/consume.sql" <<'SQL'
\set m random(1, 9000000000000000)
SELECT public.idem_consume('bench', 'orders/' || :client_id || '/' || :m);
SQL
cat >"$W/on_conflict.sql" <<'SQL'
\set m random(1, 9000000000000000)
INSERT INTO plain.inbox (consumer, message_id, consumed_at, expires_at) VALUES ('bench', 'orders/' || :client_id || '/' || :m, now(), now() + interval '7 days') ON CONFLICT DO NOTHING;
SQL
cat >"$W/fetch_ack.sql" <<'SQL'
SELECT public.idem_outbox_ack(ARRAY(SELECT message_id FROM public.idem_outbox_fetch('drain', 100))) AS acked \gset
SQL
cat >"$W/plain_fetch_ack.sql" <<'SQL'
SELECT plain.ack(ARRAY(SELECT id FROM plain.fetch('drain', 100))) AS acked \gset
SQL
cat >"$W/pgmq_read_delete.sql" <<'SQL'
SELECT plain.pgmq_delete(ARRAY(SELECT msg_id FROM plain.pgmq_read(100))) AS deleted \gset
SQL

run_pgbench() {	# run_pgbench NAME [pgbench args]: prints the TPS
	local name=$1
	shift
	as_pg_user "$PG_BINDIR/pgbench" -n -M prepared -c "$CLIENTS" -j 2 \
		-h "$PGHOST" -p "$PGPORT" "$@" "$DB" >"$W/$name.out" 2>&1 || true
	local tps
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$W/$name.out")
	[ -n "$tps" ] || { log "pgbench $name failed:"; cat "$W/$name.out" >&2; tps=0; }
	echo "$tps"
}

# fill the drain topic: n messages, keyless or over 1,000 keys
fill() {	# fill idem|plain N KEYED
	if [ "$1" = idem ]; then
		sql -c "TRUNCATE idem_internal.idem_outbox" -c "SELECT count(public.idem_outbox_emit('drain',
			'{\"order\": 1}', CASE WHEN $3 THEN 'account-' || g % 1000 END)) FROM generate_series(1, $2) g" >/dev/null
		sql -c "VACUUM ANALYZE idem_internal.idem_outbox" >/dev/null
	elif [ "$1" = pgmq ]; then
		sql -c "TRUNCATE plain.pgmq" -c "INSERT INTO plain.pgmq (message)
			SELECT '{\"order\": 1}' FROM generate_series(1, $2) g" -c "VACUUM ANALYZE plain.pgmq" >/dev/null
	else
		sql -c "TRUNCATE plain.queue" -c "INSERT INTO plain.queue (seq, topic, payload)
			SELECT g, 'drain', '{\"order\": 1}' FROM generate_series(1, $2) g" -c "VACUUM ANALYZE plain.queue" >/dev/null
	fi
}

declare -A TPS MSGS
N=$((CLIENTS * DRAIN_TXNS * 100))
log "$REPS interleaved repetitions, $SECONDS_PER_RUN s per run, $CLIENTS clients"
ONLY=${IDEM_BENCH_ONLY:-}	# "drain": the fetch+ack comparison only
for rep in $(seq 1 "$REPS"); do
	[ "$ONLY" = drain ] || for v in emit bare_insert consume on_conflict; do
		t=$(run_pgbench "$v.$rep" -T "$SECONDS_PER_RUN" -f "$W/$v.sql")
		TPS[$v]="${TPS[$v]:-} $t"
		log "  rep $rep $v: $t TPS"
	done
	# where NOTIFY's commit serialization would show: each commit waits for its flush
	[ "$ONLY" = drain ] || for v in emit bare_insert; do
		t=$(PGOPTIONS="-c synchronous_commit=on" run_pgbench "${v}_sync.$rep" -T "$SECONDS_PER_RUN" -f "$W/$v.sql")
		TPS[${v}_sync]="${TPS[${v}_sync]:-} $t"
		log "  rep $rep $v (synchronous_commit = on): $t TPS"
	done
	for v in fetch_ack_false fetch_ack_true plain_fetch_ack pgmq; do
		case $v in
		fetch_ack_false) fill idem "$N" false; table=idem_internal.idem_outbox; script=fetch_ack ;;
		fetch_ack_true) fill idem "$N" true; table=idem_internal.idem_outbox; script=fetch_ack ;;
		plain_fetch_ack) fill plain "$N" false; table=plain.queue; script=plain_fetch_ack ;;
		pgmq) fill pgmq "$N"; table=plain.pgmq; script=pgmq_read_delete ;;
		esac
		before=$(sql -At -c "SELECT count(*) FROM $table")
		start=$(date +%s.%N)
		run_pgbench "$v.$rep" -t "$DRAIN_TXNS" -f "$W/$script.sql" >/dev/null
		# idem's cleanup of acknowledged messages (none since 1.12, whose
		# acknowledgement deletes them), inside the window
		case $v in fetch_ack_*) sql -c "SELECT public.idem_cleanup_expired(10000)" >/dev/null ;; esac
		end=$(date +%s.%N)
		case $v in
		plain_fetch_ack) acked=$(sql -At -c "SELECT count(*) FROM $table WHERE acked_at IS NOT NULL") ;;
		*) acked=$((before - $(sql -At -c "SELECT count(*) FROM $table"))) ;;
		esac
		t=$(awk -v n="$acked" -v a="$start" -v b="$end" 'BEGIN {printf "%.0f", n / (b - a)}')
		MSGS[$v]="${MSGS[$v]:-} $t"
		log "  rep $rep $v: $acked messages acknowledged, $t messages/s"
	done
done

echo
echo "## idem outbox/inbox benchmark: $(date -u +%Y-%m-%d), $(nproc) cores, -c $CLIENTS -j 2, $REPS interleaved repetitions"
pair() {	# pair LABEL A B: medians and per-repetition ratios A / B
	local per
	per=$(per_repetition_ratios "${TPS[$2]}" "${TPS[$3]}")
	printf '%s: %s %.0f TPS, %s %.0f TPS; ratio per repetition: %s(median %s)\n' "$1" \
		"$2" "$(echo "${TPS[$2]}" | median)" "$3" "$(echo "${TPS[$3]}" | median)" "$per" "$(echo "$per" | median)"
}
if [ "$ONLY" != drain ]; then
	pair "emit (one keyed message per transaction)" emit bare_insert
	pair "emit, synchronous_commit = on" emit_sync bare_insert_sync
	pair "consume (new message ids)" consume on_conflict
fi
msgs() { echo "${MSGS[$1]}" | median; }
keyless=$(per_repetition_ratios "${MSGS[fetch_ack_false]}" "${MSGS[pgmq]}")
keyed=$(per_repetition_ratios "${MSGS[fetch_ack_true]}" "${MSGS[pgmq]}")
echo "fetch+ack, batches of 100, 8 workers: idem keyless $(msgs fetch_ack_false) messages/s," \
	"idem over 1,000 keys (per-key order) $(msgs fetch_ack_true) messages/s," \
	"PL/pgSQL SKIP LOCKED queue $(msgs plain_fetch_ack) messages/s," \
	"pgmq-style read + delete $(msgs pgmq) messages/s;" \
	"ratios to pgmq per repetition: keyless ${keyless}(median $(echo "$keyless" | median))," \
	"keyed ${keyed}(median $(echo "$keyed" | median));" \
	"idem's include its cleanup of the acknowledged messages"
