#!/usr/bin/env bash
# What 1.11's retention and privacy cost on a call's path: the generic
# API's replay (idem_begin of a finished key) and fresh call (idem_begin +
# idem_finish of a new key, in one transaction), plain (no keys file, no
# policy) and with everything on: idem.fingerprint_keys_file set (every
# record keyed with HMAC-SHA-256, every replay compared through it) and
# the operation's policy keeping a 30-day audit period with
# reuse_after_expiry 'refuse' (a fresh key is looked up in idem_internal.idem_history).
# pgbench -M prepared -c 4 -j 2, the two configurations interleaved per
# repetition in one server; prints TPS and the per-repetition ratios
# (everything on / plain).
#
#   IDEM_BENCH_SECONDS=5 IDEM_BENCH_REPS=3 bash test/bench/retention_bench.sh
source "$(dirname "$0")/../lib.sh"

SECONDS_PER_RUN=${IDEM_BENCH_SECONDS:-5}
export REPS=${IDEM_BENCH_REPS:-3}	# interleaved (test/lib.sh) reads it
ensure_packages
build_install
start_bench_server
keys=$IDEM_TMP/fingerprint.keys
printf 'v1:bench-secret-0123456789abcdef\n' >"$keys"
chown postgres: "$keys" 2>/dev/null || true
chmod 600 "$keys"
sql -c "CREATE EXTENSION idem"

write_api_pgbench_scripts

tps() {	# tps SCRIPT
	"$PG_BINDIR/pgbench" -n -M prepared -c 4 -j 2 -T "$SECONDS_PER_RUN" -f "$IDEM_TMP/$1.pgbench" "$DB" 2>"$IDEM_TMP/pgbench.err" |
		sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
# the replayed keys, written under the configuration being measured
replay_keys() {
	sql -q -c "DELETE FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'replay-%'" \
		-c "SELECT count(*) FROM generate_series(1, 1000) i,
			LATERAL public.idem_begin(1, 'BENCH', 'replay-' || lpad(i::text, 12, '0'), '{}') b,
			LATERAL public.idem_finish(1, 'BENCH', 'replay-' || lpad(i::text, 12, '0'), 201, '{}')" >/dev/null
}
wait_setting() {	# wait_setting VALUE: until a new session sees it
	for _ in $(seq 1 100); do
		[ "$(sql -At -c 'SHOW idem.fingerprint_keys_file')" = "$1" ] && return 0
		sleep 0.1
	done
	echo "the reload did not set idem.fingerprint_keys_file" >&2
	exit 1
}
everything_on() {
	sql -q -c "ALTER SYSTEM SET idem.fingerprint_keys_file = '$keys'" -c "SELECT pg_reload_conf()" \
		-c "SELECT public.idem_set_policy('BENCH', audit_ttl => '30 days', reuse_after_expiry => 'refuse')" >/dev/null
	wait_setting "$keys"
	replay_keys
}
plain() {
	sql -q -c "ALTER SYSTEM RESET idem.fingerprint_keys_file" -c "SELECT pg_reload_conf()" \
		-c "TRUNCATE idem_internal.idem_policy" >/dev/null
	wait_setting ""
	replay_keys
}
at_exit 'cat "$IDEM_TMP/pgbench.err" >&2' 

check "with everything on, a record is keyed (version 1)" "1" \
	"$(everything_on; sql -At -c "SELECT DISTINCT fingerprint_version FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'replay-%'")"
for what in replay fresh; do
	IFS='|' read -r off on <<<"$(interleaved plain everything_on "$what")"
	echo "$what: plain $off tps; keyed + audit + refuse $on tps; ratios $(per_repetition_ratios "$on" "$off")"
done
