#!/usr/bin/env bash
# What per-operation policies cost on a call's path (1.10): the generic
# API's replay (idem_begin of a finished key) and fresh call (idem_begin +
# idem_finish of a new key, in one transaction), with idem_internal.idem_policy empty and
# with 200 policies, the benched operation's among them (its ttl: every
# fresh call takes it from the backend's copy).  pgbench -M prepared -c 4
# -j 2, the two configurations interleaved per repetition in one server;
# prints TPS and the per-repetition ratios (with policies / without).
#
#   IDEM_BENCH_SECONDS=5 IDEM_BENCH_REPS=3 bash test/bench/policy_bench.sh
source "$(dirname "$0")/../lib.sh"

SECONDS_PER_RUN=${IDEM_BENCH_SECONDS:-5}
export REPS=${IDEM_BENCH_REPS:-3}	# interleaved (test/lib.sh) reads it
ensure_packages
build_install
start_bench_server
sql -c "CREATE EXTENSION idem"
sql -c "SELECT count(*) FROM generate_series(1, 1000) i,
	LATERAL public.idem_begin(1, 'BENCH', 'replay-' || lpad(i::text, 12, '0'), '{}') b,
	LATERAL public.idem_finish(1, 'BENCH', 'replay-' || lpad(i::text, 12, '0'), 201, '{}')" >/dev/null

write_api_pgbench_scripts

tps() {	# tps SCRIPT
	"$PG_BINDIR/pgbench" -n -M prepared -c 4 -j 2 -T "$SECONDS_PER_RUN" -f "$IDEM_TMP/$1.pgbench" "$DB" 2>"$IDEM_TMP/pgbench.err" |
		sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
with_policies() {
	sql -q -c "SELECT count(*) FROM generate_series(1, 199) i, LATERAL public.idem_set_policy('OP_' || i, ttl => '2 days')" \
		-c "SELECT public.idem_set_policy('BENCH', ttl => '3 days')" >/dev/null
}
without_policies() { sql -q -c "TRUNCATE idem_internal.idem_policy"; }
at_exit 'cat "$IDEM_TMP/pgbench.err" >&2' 

for what in replay fresh; do
	IFS='|' read -r none some <<<"$(interleaved without_policies with_policies "$what")"
	echo "$what: without policies $none tps; with 200 policies $some tps; ratios $(per_repetition_ratios "$some" "$none")"
done
