#!/usr/bin/env bash
# The benchmark of issue 4: idem against what users would otherwise write and
# against the least work any design can do.  Starts its own throwaway server
# (synchronous_commit = off, shared_buffers = 1GB), runs
# pgbench -M prepared -c 8 -j 2 -T 10 per variant, the variants interleaved
# and repeated 3 times, and prints median TPS and ratios; then the mixed
# workload at 8 and 32 clients (p50/p99 latency), one pass with
# synchronous_commit = on, fresh calls over 10 million records, and the RSS of
# one backend over 1 million calls.  About 15 minutes.
#
#   bash test/bench/bench.sh                 # everything
#   IDEM_BENCH_QUICK=1 bash test/bench/bench.sh   # 1 repetition of 3 s, 1M records
#   IDEM_BENCH_ONLY="run_fresh limit_run_fresh" IDEM_BENCH_REPS=9 bash test/bench/bench.sh
#                        # only those variants, interleaved, then their table rows
#   IDEM_BENCH_ONLY="idem_fresh idem_fresh_nostats idem_replay idem_replay_nostats" ...
#                        # what idem_stats costs: VARIANT_nostats runs with idem.stats_track = off
source "$(dirname "$0")/../lib.sh"

SECONDS_PER_RUN=10
REPS=3
BIG_RECORDS=10000000
MEMORY_CALLS=1000000
if [ -n "${IDEM_BENCH_QUICK:-}" ]; then
	SECONDS_PER_RUN=3 REPS=1 BIG_RECORDS=1000000 MEMORY_CALLS=100000
fi
REPS=${IDEM_BENCH_REPS:-$REPS}
SECONDS_PER_RUN=${IDEM_BENCH_SECONDS:-$SECONDS_PER_RUN}

ensure_packages
build_install
start_bench_server "autovacuum_vacuum_insert_threshold = -1"

sql -c "CREATE EXTENSION idem" -f "$IDEM_ROOT/test/bench/peers.sql"
# 1,000 finished keys for the replays, in idem and in peer A's tables
sql -c "SELECT count(*) FROM generate_series(1, 1000) i,
	LATERAL public.idem_create_order(1, 'replay-' || lpad(i::text, 12, '0'), 1001, 1)" \
	-c "SELECT count(*) FROM generate_series(1, 1000) i,
	LATERAL peer.create_order(1, 'replay-' || lpad(i::text, 12, '0'), 1001, 1)" >/dev/null

# The generic API: a handler inserting one row, its limit's record table
# with the columns idem_finish writes, 1,000 finished keys to replay.
sql <<'SQL' >/dev/null
CREATE TABLE bench.item (id bigserial PRIMARY KEY, sku bigint NOT NULL, qty integer NOT NULL);
CREATE FUNCTION bench.item_handler(request jsonb) RETURNS public.idem_result
LANGUAGE plpgsql AS $$
DECLARE i bigint;
BEGIN
    INSERT INTO bench.item (sku, qty) VALUES ((request->>'sku')::bigint, (request->>'qty')::int)
    RETURNING id INTO i;
    RETURN ROW(201, '{"status": "CREATED"}', NULL, i)::public.idem_result;
END $$;
ALTER TABLE lim.idempotency_record ADD COLUMN response_body json, ADD COLUMN response_headers jsonb;
SELECT count(*) FROM generate_series(1, 1000) i,
    LATERAL public.idem_run(1, 'BENCH_ITEM', 'runrep-' || lpad(i::text, 12, '0'),
                            '{"sku": 1001, "qty": 1}', 'bench.item_handler(jsonb)');
SQL

W=$IDEM_TMP/bench
mkdir -p "$W"
chmod 777 "$W"
RANDKEY='\set k random(1, 9000000000000000)'
HASH=$(printf '%s' '{"qty":1,"sku":1001}' | sha256sum | cut -c1-64)

cat >"$W/idem_fresh.sql" <<SQL
$RANDKEY
SELECT * FROM public.idem_create_order(:client_id, 'fresh-' || lpad(:k::text, 16, '0'), 1001, 1);
SQL
cat >"$W/idem_replay.sql" <<'SQL'
\set i random(1, 1000)
SELECT * FROM public.idem_create_order(1, 'replay-' || lpad(:i::text, 12, '0'), 1001, 1);
SQL
sed 's/public\.idem_create_order/peer.create_order/' "$W/idem_fresh.sql" >"$W/plpgsql_fresh.sql"
sed 's/public\.idem_create_order/peer.create_order/' "$W/idem_replay.sql" >"$W/plpgsql_replay.sql"
cat >"$W/client_fresh.sql" <<SQL
$RANDKEY
BEGIN;
INSERT INTO peer.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at) VALUES (:client_id, 'CREATE_ORDER', 'client-' || lpad(:k::text, 16, '0'), '$HASH', 'PROCESSING', now() + interval '1 day') ON CONFLICT (owner_id, operation, idempotency_key) DO NOTHING RETURNING id AS record_id \gset
INSERT INTO peer.purchase_order (id, order_no, owner_id, sku_id, quantity, status) SELECT n, 'ORD-' || lpad(n::text, 12, '0'), :client_id, 1001, 1, 'CREATED' FROM nextval('peer.purchase_order_id_seq') n RETURNING id AS order_id \gset
UPDATE peer.idempotency_record SET status = 'SUCCEEDED', http_status = 201, resource_id = :order_id, response_json = jsonb_build_object('orderId', :order_id::bigint, 'orderNo', 'ORD-' || lpad(:order_id::text, 12, '0'), 'status', 'CREATED'), updated_at = now() WHERE id = :record_id;
COMMIT;
SQL
cat >"$W/limit_fresh.sql" <<SQL
$RANDKEY
WITH o AS (INSERT INTO lim.purchase_order (id, order_no, owner_id, sku_id, quantity, status) SELECT n, 'ORD-' || lpad(n::text, 12, '0'), :client_id, 1001, 1, 'CREATED' FROM nextval('lim.purchase_order_id_seq') n RETURNING id, order_no, status) INSERT INTO lim.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, http_status, response_json, resource_id, expires_at) SELECT :client_id, 'CREATE_ORDER', 'limit-' || lpad(:k::text, 16, '0'), '$HASH', 'SUCCEEDED', 201, jsonb_build_object('orderId', o.id, 'orderNo', o.order_no, 'status', o.status), o.id, now() + interval '1 day' FROM o;
SQL
cat >"$W/limit_replay.sql" <<'SQL'
\set i random(1, 1000)
SELECT http_status, response_json FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'CREATE_ORDER' AND idempotency_key = 'replay-' || lpad(:i::text, 12, '0');
SQL
cat >"$W/run_fresh.sql" <<SQL
$RANDKEY
SELECT * FROM public.idem_run(:client_id, 'BENCH_ITEM', 'run-' || lpad(:k::text, 16, '0'), '{"sku": 1001, "qty": 1}', 'bench.item_handler(jsonb)');
SQL
cat >"$W/limit_run_fresh.sql" <<SQL
$RANDKEY
WITH h AS (SELECT * FROM bench.item_handler('{"sku": 1001, "qty": 1}')) INSERT INTO lim.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, http_status, response_body, response_headers, resource_id, expires_at) SELECT :client_id, 'BENCH_ITEM', 'limrun-' || lpad(:k::text, 16, '0'), '$HASH', 'SUCCEEDED', h.http_status, h.body, h.headers, h.resource_id, now() + interval '1 day' FROM h;
SQL
cat >"$W/run_replay.sql" <<'SQL'
\set i random(1, 1000)
SELECT * FROM public.idem_run(1, 'BENCH_ITEM', 'runrep-' || lpad(:i::text, 12, '0'), '{"sku": 1001, "qty": 1}', 'bench.item_handler(jsonb)');
SQL
cat >"$W/begin_replay.sql" <<'SQL'
\set i random(1, 1000)
SELECT * FROM public.idem_begin(1, 'BENCH_ITEM', 'runrep-' || lpad(:i::text, 12, '0'), '{"sku": 1001, "qty": 1}');
SQL
cat >"$W/limit_run_replay.sql" <<'SQL'
\set i random(1, 1000)
SELECT http_status, response_body, response_headers, resource_id FROM idem_internal.idempotency_record WHERE owner_id = 1 AND operation = 'BENCH_ITEM' AND idempotency_key = 'runrep-' || lpad(:i::text, 12, '0');
SQL
cat >"$W/mix_mismatch.sql" <<'SQL'
\set i random(1, 1000)
SELECT bench.expect_key_reused(1, 'replay-' || lpad(:i::text, 12, '0'));
SQL

# pgbench NAME CLIENTS [extra args]: prints the TPS; the output is kept in $W.
run_pgbench() {
	local name=$1 clients=$2
	shift 2
	as_pg_user "$PG_BINDIR/pgbench" -n -M prepared -c "$clients" -j 2 -T "$SECONDS_PER_RUN" \
		-h "$PGHOST" -p "$PGPORT" "$@" "$DB" >"$W/$name.out" 2>&1 || true
	local tps
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$W/$name.out")
	if [ -z "$tps" ]; then
		log "pgbench $name failed:"
		cat "$W/$name.out" >&2
		tps=0
	fi
	echo "$tps"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }

VARIANTS=${IDEM_BENCH_ONLY:-"idem_fresh idem_replay plpgsql_fresh plpgsql_replay client_fresh limit_fresh limit_replay run_fresh limit_run_fresh run_replay begin_replay limit_run_replay"}
declare -A TPS
log "main runs: $REPS x $VARIANTS, $SECONDS_PER_RUN s each, 8 clients"
for rep in $(seq 1 "$REPS"); do
	for v in $VARIANTS; do
		# VARIANT_nostats: the same script with idem_stats counting off
		if [[ $v == *_nostats ]]; then
			t=$(PGOPTIONS="-c idem.stats_track=off" run_pgbench "$v.$rep" 8 -f "$W/${v%_nostats}.sql")
		else
			t=$(run_pgbench "$v.$rep" 8 -f "$W/$v.sql")
		fi
		TPS[$v]="${TPS[$v]:-} $t"
		log "  rep $rep $v: $t TPS"
	done
done
declare -A MED
for v in $VARIANTS; do MED[$v]=$(echo "${TPS[$v]}" | median); done

# Only some variants: their medians, per-repetition ratios, and stop.
if [ -n "${IDEM_BENCH_ONLY:-}" ]; then
	echo
	echo "## idem benchmark, variants $VARIANTS: $(date -u +%Y-%m-%d), $(nproc) cores, -c 8 -j 2 -T $SECONDS_PER_RUN, $REPS interleaved repetitions"
	for v in $VARIANTS; do
		printf '%s: median %.0f TPS (runs%s)\n' "$v" "${MED[$v]}" "${TPS[$v]}"
	done
	pair() {	# pair VARIANT LIMIT: ratio of medians and the median of per-repetition ratios
		[[ " $VARIANTS " == *" $1 "* && " $VARIANTS " == *" $2 "* ]] || return 0
		local per
		per=$(per_repetition_ratios "${TPS[$1]}" "${TPS[$2]}")
		echo "$1 / $2: ratio of medians $(ratio "${MED[$1]}" "${MED[$2]}"), per repetition: $per(median $(echo "$per" | median))"
	}
	pair run_fresh limit_run_fresh
	pair run_replay limit_run_replay
	pair begin_replay limit_run_replay
	pair idem_fresh idem_fresh_nostats
	pair idem_replay idem_replay_nostats
	pair run_fresh run_fresh_nostats
	pair idem_fresh limit_fresh
	pair idem_replay limit_replay
	exit 0
fi

# The mixed workload: 80 % replays, 15 % fresh, 5 % mismatched keys (IK001).
mixed() {
	local clients=$1 name=mixed_$1
	rm -f "$W/$name".log*
	local t
	t=$(run_pgbench "$name" "$clients" -f "$W/idem_replay.sql@80" -f "$W/idem_fresh.sql@15" \
		-f "$W/mix_mismatch.sql@5" -l --log-prefix="$W/$name.log")
	local lat
	lat=$(cat "$W/$name".log* | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {printf "%.2f %.2f", a[int(NR*0.5)]/1000, a[int(NR*0.99)]/1000}')
	local ik001
	ik001=$(sed -n '/^SQL script 3/,/^ - [0-9]* transactions/{s/^ - \([0-9]*\) transactions.*/\1/p}' "$W/$name.out" | head -1)
	echo "$t $lat ${ik001:-?}"
}
log "mixed workload, 8 and 32 clients"
read -r MIX8 P50_8 P99_8 IK8 <<<"$(mixed 8)"
read -r MIX32 P50_32 P99_32 IK32 <<<"$(mixed 32)"

log "one pass with synchronous_commit = on"
declare -A SYNC
for v in $VARIANTS; do
	SYNC[$v]=$(PGOPTIONS="-c synchronous_commit=on" run_pgbench "$v.sync" 8 -f "$W/$v.sql")
done

log "fresh calls over $BIG_RECORDS records"
sql -c "INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash,
	status, http_status, response_json, resource_id, expires_at)
	SELECT 1000000 + g % 100000, 'CREATE_ORDER', 'bulk-' || lpad(g::text, 16, '0'), '$HASH', 'SUCCEEDED',
	201, jsonb_build_object('orderId', g, 'orderNo', 'ORD-' || lpad(g::text, 12, '0'), 'status', 'CREATED'),
	g, now() + interval '1 day' FROM generate_series(1, $BIG_RECORDS) g" -c "VACUUM ANALYZE idem_internal.idempotency_record"
BIG=""
for rep in $(seq 1 "$REPS"); do
	BIG="$BIG $(run_pgbench "big_fresh.$rep" 8 -f "$W/idem_fresh.sql")"
done
BIG_MED=$(echo "$BIG" | median)
RECORDS=$(sql -At -c "SELECT count(*) FROM idem_internal.idempotency_record")

log "one backend, $MEMORY_CALLS calls (4 replays to 1 fresh)"
MEM=$(sql -At -c "CALL bench.calls(1, 100000)" -c "SELECT bench.rss_anon_kb()" \
	-c "CALL bench.calls(100001, $MEMORY_CALLS)" -c "SELECT bench.rss_anon_kb()" | tr '\n' ' ')
read -r RSS_WARM RSS_END <<<"$MEM"

echo
echo "## idem benchmark: $(date -u +%Y-%m-%d), $(nproc) cores, pgbench -M prepared -c 8 -j 2 -T $SECONDS_PER_RUN, $REPS interleaved repetitions"
echo
echo "| variant | median TPS | runs | ratio to its limit | ratio to PL/pgSQL | synchronous_commit = on |"
echo "|---|---|---|---|---|---|"
row() {	# row VARIANT LABEL LIMIT PLPGSQL
	local v=$1
	local to_limit="—" to_pl="—"
	[ -n "$3" ] && to_limit=$(ratio "${MED[$v]}" "${MED[$3]}")
	[ -n "$4" ] && to_pl=$(ratio "${MED[$v]}" "${MED[$4]}")
	printf '| %s | %.0f | %s | %s | %s | %.0f |\n' "$2" "${MED[$v]}" \
		"$(echo "${TPS[$v]}" | awk '{for (i = 1; i <= NF; i++) printf "%s%.0f", (i > 1 ? " " : ""), $i}')" \
		"$to_limit" "$to_pl" "${SYNC[$v]}"
}
row idem_fresh "1. idem fresh" limit_fresh plpgsql_fresh
row idem_replay "2. idem replay" limit_replay plpgsql_replay
row plpgsql_fresh "3. PL/pgSQL fresh" limit_fresh ""
row plpgsql_replay "3. PL/pgSQL replay" limit_replay ""
row client_fresh "4. client-driven fresh" limit_fresh ""
row limit_fresh "5. limit: one statement, both rows" "" ""
row limit_replay "6. limit: prepared SELECT" "" ""
row run_fresh "7. idem_run fresh, PL/pgSQL handler inserting a row" limit_run_fresh ""
row run_replay "8. idem_run replay" limit_run_replay ""
row begin_replay "8. idem_begin replay" limit_run_replay ""
row limit_run_fresh "9. limit: one statement, handler + finished record" "" ""
row limit_run_replay "10. limit: prepared SELECT of the stored result" "" ""
echo
echo "| mixed (80 % replay, 15 % fresh, 5 % IK001) | TPS | p50 ms | p99 ms | IK001 answers |"
echo "|---|---|---|---|---|"
printf '| 8 clients | %.0f | %s | %s | %s |\n' "$MIX8" "$P50_8" "$P99_8" "$IK8"
printf '| 32 clients | %.0f | %s | %s | %s |\n' "$MIX32" "$P50_32" "$P99_32" "$IK32"
echo
echo "fresh with $RECORDS records in idem_internal.idempotency_record: median $(printf '%.0f' "$BIG_MED") TPS (runs$BIG) = $(ratio "$BIG_MED" "${MED[idem_fresh]}") x the figure above"
echo "one backend, RssAnon after 100,000 calls: $RSS_WARM kB; after $MEMORY_CALLS: $RSS_END kB (growth $((RSS_END - RSS_WARM)) kB)"
