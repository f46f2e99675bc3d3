#!/usr/bin/env bash
# Calls per second on Citus next to one server, on this machine: 8 clients
# (pgbench -M prepared -c 8 -j 2), idem_create_order fresh (a new key per call,
# owners 1-1000) and replayed (1,000 finished keys, owners 1-1000), against
#   single:  one PostgreSQL server with idem (no Citus);
#   coord:   the Citus coordinator, each call delegated to the worker holding
#            the owner's shard (test/citus/cluster.sh: a coordinator and two
#            workers on loopback);
#   worker:  the worker holding owner 1's shard, called directly for owner 1
#            (no delegation hop: the shard lookup and Citus's hooks alone);
#   local:   that worker, in a database with Citus whose idem is not
#            distributed (Citus's hooks alone).
# The variants are interleaved and repeated; prints the median calls/s and
# the ratios to single, per repetition and their median.  All four servers
# share the machine's cores: a loopback cluster shows what a call costs, not
# how Citus scales.
#
#   bash test/citus/bench.sh                       # 3 repetitions of 10 s
#   IDEM_BENCH_REPS=5 IDEM_BENCH_SECONDS=5 bash test/citus/bench.sh
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/cluster.sh"

REPS=${IDEM_BENCH_REPS:-3}
SECONDS_PER_RUN=${IDEM_BENCH_SECONDS:-10}

ensure_packages
if ! why=$(citus_installed); then
	citus_skip_line "$why"
	exit 0
fi
build_install
start_server "shared_buffers = 256MB" "synchronous_commit = off" "idem.cleanup_interval = 0"
single_dir=$IDEM_TMP
citus_cluster_start
# both cleanups on exit
at_exit citus_cluster_stop
for p in $COORD_PORT $WORKER1_PORT $WORKER2_PORT; do
	cq "$p" -c "ALTER SYSTEM SET synchronous_commit = off" -c "SELECT pg_reload_conf()" >/dev/null
done

single() { "$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$single_dir" -d postgres "$@"; }
single -c "CREATE EXTENSION idem"
worker_port=$(cq "$COORD_PORT" -c "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
	WHERE p.shardid = get_shard_id_for_distribution_column('idem_internal.idempotency_record', 1)")

scripts=$(mktemp -d)
cat >"$scripts/fresh.sql" <<'SQL'
\set o random(1, 1000)
\set r random(1, 1000000000000000)
SELECT order_id FROM idem_create_order(:o, pg_catalog.lpad((:r)::text, 20, '0'), 1001, 1);
SQL
cat >"$scripts/replay.sql" <<'SQL'
\set i random(1, 1000)
SELECT order_id FROM idem_create_order(:i, pg_catalog.lpad((:i)::text, 20, 'r'), 1001, 1);
SQL
cat >"$scripts/fresh1.sql" <<'SQL'
\set r random(1, 1000000000000000)
SELECT order_id FROM idem_create_order(1, pg_catalog.lpad((:r)::text, 20, '0'), 1001, 1);
SQL
cat >"$scripts/replay1.sql" <<'SQL'
\set i random(1, 1000)
SELECT order_id FROM idem_create_order(1, pg_catalog.lpad((:i)::text, 20, 'q'), 1001, 1);
SQL
# a database on that worker with Citus, and idem not distributed
"$PG_BINDIR/createdb" -h 127.0.0.1 -p "$worker_port" -U postgres idem_local
"$PG_BINDIR/psql" -X -q -h 127.0.0.1 -p "$worker_port" -U postgres -d idem_local \
	-c "CREATE EXTENSION citus" -c "CREATE EXTENSION idem" >/dev/null
keys="SELECT count(*) FROM generate_series(1, 1000) i,
	LATERAL idem_create_order(i, lpad(i::text, 20, 'r'), 1001, 1)"
keys1="SELECT count(*) FROM generate_series(1, 1000) i,
	LATERAL idem_create_order(1, lpad(i::text, 20, 'q'), 1001, 1)"
single -c "$keys" -c "$keys1" >/dev/null
"$PG_BINDIR/psql" -X -q -h 127.0.0.1 -p "$worker_port" -U postgres -d idem_local -c "$keys1" >/dev/null
cq "$COORD_PORT" -c "$keys" -c "$keys1" >/dev/null

run() {	# run VARIANT -> calls per second
	local target=$1 kind=$2 conn
	case $target in
		single) conn=(-h "$single_dir" postgres) ;;
		coord) conn=(-h 127.0.0.1 -p "$COORD_PORT" -U postgres idem) ;;
		worker) conn=(-h 127.0.0.1 -p "$worker_port" -U postgres idem) ;;
		local) conn=(-h 127.0.0.1 -p "$worker_port" -U postgres idem_local) ;;
	esac
	"$PG_BINDIR/pgbench" -n -M prepared -c 8 -j 2 -T "$SECONDS_PER_RUN" -f "$scripts/$kind.sql" \
		"${conn[@]}" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | cut -d. -f1
}

variants="single:fresh coord:fresh single:fresh1 local:fresh1 worker:fresh1 single:replay coord:replay single:replay1 local:replay1 worker:replay1"
declare -A results
for rep in $(seq 1 "$REPS"); do
	for v in $variants; do
		tps=$(run "${v%%:*}" "${v##*:}")
		results[$v]="${results[$v]:-} $tps"
		log "rep $rep $v: $tps calls/s"
	done
done

printf '\n%-34s %10s %10s  %s\n' "variant (8 clients)" "calls/s" "vs single" "ratios per repetition"
row() {	# row LABEL VARIANT BASELINE
	local med ratios
	med=$(echo "${results[$2]}" | median)
	if [ "$2" = "$3" ]; then
		printf '%-34s %10s %10s\n' "$1" "$med" "1.00"
	else
		ratios=$(per_repetition_ratios "${results[$2]}" "${results[$3]}")
		printf '%-34s %10s %10s  %s\n' "$1" "$med" "$(echo "$ratios" | median)" "$ratios"
	fi
}
row "fresh, single server" single:fresh single:fresh
row "fresh, through the coordinator" coord:fresh single:fresh
row "fresh owner 1, single server" single:fresh1 single:fresh1
row "fresh owner 1, Citus, not distributed" local:fresh1 single:fresh1
row "fresh owner 1, its worker directly" worker:fresh1 single:fresh1
row "replay, single server" single:replay single:replay
row "replay, through the coordinator" coord:replay single:replay
row "replay owner 1, single server" single:replay1 single:replay1
row "replay owner 1, Citus, not distributed" local:replay1 single:replay1
row "replay owner 1, its worker directly" worker:replay1 single:replay1
rm -rf "$scripts"
