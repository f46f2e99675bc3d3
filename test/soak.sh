#!/usr/bin/env bash
# Soak: SOAK_CLIENTS (32) pgbench clients for SOAK_SECONDS (600) against a
# throwaway server whose cleanup worker runs every second over records that
# live 30 seconds.  The requests: 80 % replays (a key of the pool of the last
# 20 seconds, the same request), 15 % new keys, 5 % reused keys (a pool key
# of 21-25 seconds ago with another request: IK001 expected).  Every minute
# it samples the record table's and its indexes' size, the worker's
# deletions, and the private memory of the client backends and of the
# launcher; at the end it checks that the only errors were IK001 and the
# invariants: one order per executed key, every record points to its order
# (same owner, sku and quantity), no record without its order.  Not part of
# the test command; the README quotes its figures.
#
#   bash test/soak.sh
source "$(dirname "$0")/lib.sh"

SOAK_SECONDS=${SOAK_SECONDS:-600}
SOAK_CLIENTS=${SOAK_CLIENTS:-32}
SAMPLE=${SOAK_SAMPLE:-60}

ensure_packages
build_install
start_server "idem.cleanup_interval = 1" "max_connections = 100" "shared_buffers = 512MB" \
	"log_min_messages = warning"
DB=idem_soak
psql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" -At "$@"; }
new_idem_database "$DB"
psql <<'SQL'
ALTER DATABASE idem_soak SET idem.ttl = '30s';
CREATE SCHEMA soak;
-- one row per executed call: the key and what it asked for
CREATE TABLE soak.executed (owner bigint, key text, sku bigint, qty int, order_id bigint);
CREATE SEQUENCE soak.ik001;	-- IK001 answers
-- a call; IK001 is an expected answer, every other error aborts the client
CREATE FUNCTION soak.call(owner bigint, key text, sku bigint, qty int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    SELECT * INTO r FROM public.idem_create_order(owner, key, sku, qty);
    IF NOT r.replayed THEN
        INSERT INTO soak.executed VALUES (owner, key, sku, qty, r.order_id);
        RETURN 'executed';
    END IF;
    RETURN 'replayed';
EXCEPTION WHEN SQLSTATE 'IK001' THEN
    PERFORM nextval('soak.ik001');
    RETURN 'IK001';
END $$;
SQL
W=$IDEM_TMP/soak
mkdir -p "$W" && chmod 777 "$W"
cat >"$W/replay.sql" <<'EOF2'
\set back random(0, 20)
\set i random(1, 100)
SELECT soak.call(1, 'pool-' || (extract(epoch FROM clock_timestamp())::bigint - :back) || '-' || :i, 7, 1);
EOF2
cat >"$W/new.sql" <<'EOF2'
\set k random(1, 9000000000000000)
SELECT soak.call(2, 'new-' || lpad(:k::text, 16, '0'), 7, 1);
EOF2
cat >"$W/reused.sql" <<'EOF2'
\set back random(21, 25)
\set i random(1, 100)
SELECT soak.call(1, 'pool-' || (extract(epoch FROM clock_timestamp())::bigint - :back) || '-' || :i, 7, 2);
EOF2

rss_kb() { awk '/^RssAnon/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
sample() {
	local t=$1
	local sizes backends launcher
	sizes=$(psql -c "SELECT pg_total_relation_size('idem_internal.idempotency_record') / 1024,
	                        pg_indexes_size('idem_internal.idempotency_record') / 1024,
	                        (SELECT count(*) FROM idem_internal.idempotency_record),
	                        coalesce((SELECT total_deleted FROM idem_cleanup_status() WHERE datname = 'idem_soak'), 0)" | tr '|' ' ')
	backends=0 n=0
	for pid in $(psql -c "SELECT pid FROM pg_stat_activity WHERE datname = 'idem_soak' AND backend_type = 'client backend' AND pid <> pg_backend_pid()"); do
		backends=$((backends + $(rss_kb "$pid"))) n=$((n + 1))
	done
	launcher=$(rss_kb "$(psql -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem cleanup launcher'")")
	echo "$t $sizes $((n > 0 ? backends / n : 0)) $launcher"
}

log "soak: $SOAK_CLIENTS clients for $SOAK_SECONDS s"
"$PG_BINDIR/pgbench" -n -M prepared -c "$SOAK_CLIENTS" -j 2 -T "$SOAK_SECONDS" \
	-f "$W/replay.sql@80" -f "$W/new.sql@15" -f "$W/reused.sql@5" "$DB" >"$W/pgbench.out" 2>&1 &
bench=$!
echo "# second, table+indexes kB, indexes kB, records, deleted so far, client backend RssAnon kB (mean), launcher RssAnon kB"
start=$(date +%s)
sleep 5
while kill -0 "$bench" 2>/dev/null; do
	sample $(($(date +%s) - start)) | tee -a "$W/samples"
	for _ in $(seq 1 "$SAMPLE"); do kill -0 "$bench" 2>/dev/null || break; sleep 1; done
done
wait "$bench" && rc=0 || rc=$?
grep -E '^(number of (transactions actually processed|failed transactions)|tps|latency average)' "$W/pgbench.out" | sed 's/^/# /'
{ grep -B1 -A0 'aborted\|ERROR' "$W/pgbench.out" || true; } | head -10 >&2

executed=$(psql -c "SELECT count(*) FROM soak.executed")
deleted=$(psql -c "SELECT total_deleted FROM idem_cleanup_status() WHERE datname = 'idem_soak'")
ik001=$(psql -c "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM soak.ik001")
calls=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$W/pgbench.out")
echo "# $calls calls: $executed executed, $ik001 IK001, $((calls - executed - ik001)) replayed; records deleted by the worker: $deleted ($((deleted / SOAK_SECONDS)) a second)"
check "pgbench ran to the end, no client aborted (every error other than IK001 aborts)" 0 "$rc"
check "no failed transaction" 0 "$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$W/pgbench.out")"
check "one order per executed key" 0 "$(psql -c "SELECT count(*) FROM (SELECT owner, key FROM soak.executed GROUP BY 1, 2 HAVING count(*) > 1) d")"
check "every executed call has its order" "$executed" "$(psql -c "SELECT count(*) FROM soak.executed e JOIN idem_internal.purchase_order o ON o.id = e.order_id AND o.owner_id = e.owner AND o.sku_id = e.sku AND o.quantity = e.qty")"
check "no order without an executed call" "$executed" "$(psql -c "SELECT count(*) FROM idem_internal.purchase_order")"
check "every record points to its order (owner, sku, quantity)" 0 "$(psql -c "SELECT count(*) FROM idem_internal.idempotency_record r LEFT JOIN idem_internal.purchase_order o ON o.id = r.resource_id AND o.owner_id = r.owner_id AND r.request_hash = idem_request_hash(jsonb_build_object('sku', o.sku_id, 'qty', o.quantity)) WHERE o.id IS NULL")"
check "the worker deleted records in every minute after the first" 1 "$(awk 'NR > 2 && $5 > prev {n++} NR >= 2 {prev = $5} END {print (NR > 2 && n == NR - 2) ? 1 : 0}' "$W/samples")"
awk 'NR == 2 {t2 = $2; b2 = $6; l2 = $7} {t = $2; b = $6; l = $7} END {
	printf "# table+indexes: %d kB after the first minute, %d kB at the end (%.2f x)\n", t2, t, (t2 > 0 ? t / t2 : 0);
	printf "# client backend RssAnon: %d kB after the first minute, %d kB at the end; launcher %d kB then %d kB\n", b2, b, l2, l }' "$W/samples"
check "table and indexes bounded: at most 2 x their size after the first minute" 1 \
	"$(awk 'NR == 2 {t2 = $2} {t = $2} END {print (t <= 2 * t2) ? 1 : 0}' "$W/samples")"
check "client backends' memory flat: at most 1 MiB more than after the first minute" 1 \
	"$(awk 'NR == 2 {b2 = $6} {b = $6} END {print (b - b2 <= 1024) ? 1 : 0}' "$W/samples")"
check "launcher memory flat: at most 256 kB more than after the first minute" 1 \
	"$(awk 'NR == 2 {l2 = $7} {l = $7} END {print (l - l2 <= 256) ? 1 : 0}' "$W/samples")"
