#!/usr/bin/env bash
# Runs every test suite of idem against a real, throwaway PostgreSQL (Debian's
# 15, or the installation PG_CONFIG names): pg_regress, the isolation specs,
# the TAP tests, the pgbench load checks, pg_dump, the upgrade suite, the
# package.  Sets up everything itself on a fresh Debian 12 machine (as root:
# packages; then build with -Werror, install, a private server).  A stage
# whose software is not installed (Citus) prints "skip - NAME: why" and
# counts as skipped.
#
# Then the same idem on every other major it is given: each pg_config in
# IDEM_PG_CONFIGS (space-separated) and each /usr/lib/postgresql/*/bin/pg_config
# whose server headers are installed runs regress, isolation, TAP, the
# upgrade suite, pg_dump and restore, Citus where it is installed for that
# major, and pg_upgrade from the default major (test/majors.sh): one
# "ok"/"not ok"/"skip" line per major and stage.
#
# Ends with "N passed, M failed, K skipped".
#
#   bash test/run_all.sh
#   IDEM_PG_CONFIGS="/path/to/16/bin/pg_config /path/to/18/bin/pg_config" bash test/run_all.sh
#   PG_CONFIG=/path/to/17/bin/pg_config bash test/run_all.sh   # 17 as the default
source "$(dirname "$0")/lib.sh"

# The run works in a copy of the source tree in its own directory: the
# build, the suites' results, the clients' packages and node_modules land
# there, never in the checkout (tracked files and new ones not ignored, as
# git would commit them).
run_in_copy test/run_all.sh "$@"

# Each stage's wall time, and its budget from test/README.md's table of
# stage budgets ("| `NAME` | SECONDS | ..."); a stage over its budget says
# so (a busy machine may make it slower: a line to read, not a failure).
budget_of() { sed -n "s/^| \`$1\` | \([0-9]*\) |.*/\1/p" "$IDEM_ROOT/test/README.md" | head -n 1; }
timed() {	# timed NAME COMMAND...
	local name=$1 t0=$SECONDS took budget over=
	shift
	"$@"
	took=$((SECONDS - t0))
	budget=$(budget_of "$name")
	[ -n "$budget" ] && [ "$took" -gt "$budget" ] && over=": over its budget"
	log "stage $name: $took s (budget ${budget:-none} s)$over"
	echo "$name $took ${budget:-none}" >>"$IDEM_TMP/stage-times"
}

ensure_packages
build_install
if [ -n "${IDEM_MAJOR:-}" ]; then
	check "$IDEM_MAJOR: built with -Werror and installed into its own tree ($("$PG_CONFIG" --pkglibdir))" \
		true "$([ -f "$("$PG_CONFIG" --pkglibdir)/idem.so" ] && [ -f "$("$PG_CONFIG" --sharedir)/extension/idem.control" ] && echo true || echo false)"
fi
# the worker has its own TAP tests; here it would race cleanup.sql's counts
start_server "idem.cleanup_interval = 0"
echo "setup $SECONDS $(budget_of setup)" >"$IDEM_TMP/stage-times"

passed=0
failed=0
skipped=0
log_dir=$IDEM_TMP/logs
mkdir -p "$log_dir"

# On another major (test/majors.sh sets IDEM_MAJOR, e.g. "PostgreSQL 16.4"),
# only the suites that test the server's side run, each stage's output goes
# to its log, and each stage prints one line for the caller to count: "ok -
# MAJOR: STAGE, N passed", "not ok - ..." with the stage's failures after it
# as "# " lines, or "skip - MAJOR: STAGE: why".
IDEM_MAJOR=${IDEM_MAJOR:-}
stage() {	# stage NAME COMMAND...
	local name=$1
	shift
	if [ -z "$IDEM_MAJOR" ]; then
		timed "$name" "$@"
		return
	fi
	local p0=$passed f0=$failed s0=$skipped out=$log_dir/stage-$name.out
	"$@" >"$out" 2>&1
	local p=$((passed - p0)) f=$((failed - f0)) s=$((skipped - s0))
	if [ "$f" -gt 0 ]; then
		echo "not ok - $IDEM_MAJOR: $name, $p passed, $f failed"
		# what failed first, then the details that follow in the output
		grep -E '^\[[0-9:]+\] test/t/|FAILED|^not ok|failed: ' "$out" | sed 's/^/# /' || true
		tail -n 200 "$out" | sed 's/^/# /'
	elif [ "$s" -gt 0 ] && [ "$p" -eq 0 ]; then
		echo "skip - $IDEM_MAJOR: $name: $(sed -n "s/^skip - \($name: \)\{0,1\}//p" "$out" | head -n 1)"
	else
		echo "ok - $IDEM_MAJOR: $name, $p passed"
	fi
}

# Count "test NAME ... ok|FAILED" lines of a pg_regress-style run.
count_regress() {
	local out=$1
	local ok bad
	# "test NAME ... ok" up to PostgreSQL 15, "ok N - NAME" (TAP) from 16 on
	ok=$(grep -cE '^(test |     )?[A-Za-z0-9_-]+ +\.\.\. ok|^ok [0-9]+ +[-+] ' "$out" || true)
	bad=$(grep -cE '\.\.\. FAILED|\.\.\. failed|^not ok [0-9]+ ' "$out" || true)
	passed=$((passed + ok))
	failed=$((failed + bad))
	if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
		log "no test ran in $(basename "$out")"
		failed=$((failed + 1))
	fi
}

# Run a make target; show the failures' diffs.
run_make_suite() {
	local name=$1
	shift
	log "running $name"
	make -C "$IDEM_ROOT" -s "$@" installcheck >"$log_dir/$name.log" 2>&1 || true
	grep -E '\.\.\. |^(not )?ok [0-9]+ ' "$log_dir/$name.log" || true
	count_regress "$log_dir/$name.log"
	for diffs in "$IDEM_ROOT/regression.diffs" "$IDEM_ROOT/test/output_iso/regression.diffs"; do
		if [ -s "$diffs" ] && grep -qE 'FAILED|^not ok' "$log_dir/$name.log"; then
			cat "$diffs"
		fi
	done
}

rm -f "$IDEM_ROOT/regression.diffs" "$IDEM_ROOT/test/output_iso/regression.diffs"
stage regress run_make_suite regress ISOLATION= TAP_TESTS=
stage isolation run_make_suite isolation REGRESS= TAP_TESTS=

# Run the TAP tests (test/t/*.pl), three files at a time (each has its own
# clusters and ports; most of their time is spent waiting for the worker's
# rounds).  initdb refuses root, so as root they run as the server's OS
# user, in a copy of the tree that user may write to.
run_tap_suite() {
	local tree=$IDEM_ROOT out=$log_dir/tap.log
	log "running tap"
	if [ "$(id -u)" -eq 0 ]; then
		tree=$IDEM_TMP/tap-tree
		copy_source_tree "$tree"
		chown -R postgres: "$tree"
	fi
	as_pg_user env -u PGHOST -u PGPORT -u PGUSER \
		make -C "$tree" -s installcheck PG_CONFIG="$PG_CONFIG" REGRESS= ISOLATION= PROVE_FLAGS="--timer -j3" >"$out" 2>&1 || true
	grep -vE '^(\+\+\+|# Looks like|\s*$)' "$out" | grep -E '^\[|^#|^t/|Result|Failed' || true
	local ok bad
	ok=$(grep -cE '^\[[0-9:]+\] test/t/\S+\.pl \.+ ok' "$out" || true)
	bad=$(grep -cE '^\[[0-9:]+\] test/t/\S+\.pl \.+ ' "$out" | awk -v ok="$ok" '{print $1 - ok}')
	passed=$((passed + ok))
	failed=$((failed + bad))
	if [ "$ok" -eq 0 ] && [ "$bad" -eq 0 ]; then
		log "no TAP test ran"
		cat "$out"
		failed=$((failed + 1))
	fi
	if [ "$bad" -ne 0 ]; then
		# the logs of the files that did not pass: their failed checks
		# with what the test printed around them, then their last lines
		local name
		for name in $(grep -E '^\[[0-9:]+\] test/t/\S+\.pl \.+ ' "$out" | grep -vE '\.+ ok' |
			sed -E 's|^\[[0-9:]+\] test/t/(\S+)\.pl .*|\1|'); do
			f=$tree/tmp_check/log/regress_log_$name
			log "failed: test/t/$name.pl; its failed checks and the last lines of $f"
			grep -B 15 -A 5 '^\[[0-9:.]*\]([0-9.]*s) not ok' "$f" 2>/dev/null | head -n 80 || true
			tail -n 30 "$f" 2>/dev/null || true
		done
	fi
}

stage tap run_tap_suite

# Run a shell check that prints "ok - ..." / "not ok - ..." lines, or one
# "skip - ..." line when what it needs is not installed.
#
# A line of another major's stage ("ok - PostgreSQL 16.4: regress, 25
# passed", "not ok - ...: tap, 30 passed, 2 failed") counts the checks it
# names; any other line counts one.
run_shell_check() {
	timed "$1" shell_check "$@"
}
shell_check() {
	local name=$1 script=$2
	log "running $name: $3"
	bash "$script" "${@:4}" 2>&1 | tee "$log_dir/$name.log" || true
	passed=$((passed + $(awk '/^ok - / {n += (match($0, /, [0-9]+ passed$/) ? substr($0, RSTART + 2) + 0 : 1)} END {print n + 0}' "$log_dir/$name.log")))
	failed=$((failed + $(awk '/^not ok - / {n += (match($0, /, [0-9]+ failed$/) ? substr($0, RSTART + 2) + 0 : 1)} END {print n + 0}' "$log_dir/$name.log")))
	# each skip line is a check not run (one for a stage whose software is
	# missing; a major's stages each have theirs)
	skipped=$((skipped + $(grep -c '^skip - ' "$log_dir/$name.log" || true)))
	if grep -q '^skip - ' "$log_dir/$name.log" && ! grep -qE '^(not )?ok - ' "$log_dir/$name.log"; then
		:
	elif ! grep -q '^ok - ' "$log_dir/$name.log"; then
		log "no check passed in $name"
		failed=$((failed + 1))
	fi
}

if [ -n "$IDEM_MAJOR" ]; then
	stage dump run_shell_check dump "$IDEM_ROOT/test/dump/dump_restore.sh" "pg_dump keeps idem's rows"
	stage upgrade_suite run_shell_check upgrade_suite "$IDEM_ROOT/test/upgrade/suite_after_update.sh" \
		"the pg_regress suite on databases created at each released version and updated"
	stage citus run_shell_check citus "$IDEM_ROOT/test/citus/run.sh" "Citus where it is installed for this major"
	stage pg_upgrade run_shell_check pg_upgrade "$IDEM_ROOT/test/upgrade/pg_upgrade.sh" \
		"pg_upgrade from ${IDEM_UPGRADE_FROM:-the default major} with idem in use"
	exit 0
fi

run_shell_check layers "$IDEM_ROOT/test/layers.sh" \
	"src/LAYERS: no include of src/ goes up or sideways; no function over 80 lines"
run_shell_check lint "$IDEM_ROOT/test/lint.sh" \
	"every test file runs (REGRESS, ISOLATION, test/t/*.pl); shellcheck finds no warning in the shell scripts"
run_shell_check load "$IDEM_ROOT/test/load/same_key.sh" "20 clients on one key, 30 rounds"
run_shell_check debit "$IDEM_ROOT/test/load/debit.sh" "20 clients on one key through idem_run, 30 rounds"
run_shell_check hot_keys "$IDEM_ROOT/test/load/hot_keys.sh" "16 clients racing on a new key every 5 ms"
run_shell_check big_transaction "$IDEM_ROOT/test/load/big_transaction.sh" \
	"one transaction of 100,000 calls of each kind with the default lock settings, another session calling meanwhile"
run_shell_check e2e "$IDEM_ROOT/test/e2e/outbox_inbox.sh" \
	"outbox -> publishers -> broker -> idem_consume, 10,000 requests, kill -9 of publishers and consumers"
run_shell_check chaos "$IDEM_ROOT/test/chaos/tasks.sh" \
	"10,000 tasks, 6 workers leasing with bind_session, kill -9 of two of them, retryable failures"
run_shell_check payments "$IDEM_ROOT/test/chaos/payments.sh" \
	"2,000 payments through a provider that is not idempotent, late answers and kill -9 of the workers: reconciled, each charged once; the control without reconciliation charges twice"
run_shell_check pgbouncer "$IDEM_ROOT/test/pooler/pgbouncer.sh" \
	"PgBouncer 1.18 in transaction pooling, 50 clients over 10 server connections: the seven tests, the generic API, the outbox and inbox, long flows, bind_session and per-role bindings"
run_shell_check failover "$IDEM_ROOT/test/failover/patroni.sh" \
	"etcd and two nodes under Patroni, 20 clients through a multi-host string: kill -9 of the primary, its Patroni stopped (synchronous), kill -9 again (asynchronous)"
run_shell_check clients_python "$IDEM_ROOT/test/clients/python.sh" \
	"the Python library from its wheel: its API, the HTTP contract in Flask, FastAPI and Django, Redis, PgBouncer, a double click in Chromium"
run_shell_check clients_node "$IDEM_ROOT/test/clients/node.sh" \
	"the Node library from its npm pack tarball: its API, the HTTP contract in Express and node:http, Redis"
run_shell_check clients_java "$IDEM_ROOT/test/clients/java.sh" \
	"the Java library as mvn install builds it: its JUnit tests, the HTTP contract in a servlet Filter on embedded Tomcat 10.1"
run_shell_check clients_spring "$IDEM_ROOT/test/clients/spring.sh" \
	"Spring Boot 3.5 and 4.1: the starters from mvn install; examples/spring on each under @SpringBootTest (JdbcTemplate and JPA, 20 threads, failures that store nothing, ProblemDetail, Actuator), then through the HTTP contract, a double click in Chromium, a newer JDK; the fingerprints of every stack compared"
run_shell_check brokers "$IDEM_ROOT/test/brokers/run.sh" \
	"the outbox through Redis Streams and RabbitMQ: idem_pg.relay and idem_pg.consumer, 10,000 transactions, relays killed, the broker restarted, a consumer exiting between its commit and its ack"
run_shell_check brokers_kafka "$IDEM_ROOT/test/brokers/kafka.sh" \
	"the outbox through Apache Kafka 4.4 (KRaft, from Maven Central): idem_pg.relay's idempotent producer, the Python and Node consumers in one group, relays killed before their ack, the broker restarted, a consumer exiting before its offset commit, dead letters to <topic>.dead, the malformed entries"
run_shell_check citus "$IDEM_ROOT/test/citus/run.sh" \
	"Citus 13.2 where it is installed: a coordinator and two workers, idem distributed by owner, every call through the coordinator"
run_shell_check exporter "$IDEM_ROOT/test/exporter/check_queries.sh" \
	"the postgres_exporter queries run as a pg_monitor role and return their metrics"
run_shell_check instructions "$IDEM_ROOT/test/bench/instructions.sh" \
	"a smoke of the instruction benchmark (callgrind over the wire, pgbench -M prepared): it runs and counts" --smoke
run_shell_check fuzz "$IDEM_ROOT/test/fuzz/fuzz.sh" "idem_canonical_json and idem_request_hash against npm's canonicalize, 20,000 random documents; the digest input against the fingerprint, 5,000 pairs of spellings"
run_shell_check managed "$IDEM_ROOT/test/managed/run.sh" \
	"the SQL edition (managed/idem.sql) on a server without idem's library: its installer as an ordinary role, its pg_regress file, the escalation attack, the three libraries' IK002, the article's seven tests, the JCS fuzz, 20 clients on one key, one transaction of 100,000 claims, 300 sequences against the C edition and two spoiled copies caught"
run_shell_check dump "$IDEM_ROOT/test/dump/dump_restore.sh" "pg_dump keeps idem's rows"
run_shell_check readme "$IDEM_ROOT/test/readme/check.sh" \
	"the README's quickstart runs as pasted; the Markdown pages' links resolve; the README is at most 40 KB"
run_shell_check upgrade_suite "$IDEM_ROOT/test/upgrade/suite_after_update.sh" \
	"the pg_regress suite on databases created at each released version and updated"

# last: it replaces the installed files with the package's, then restores them
run_shell_check package "$IDEM_ROOT/test/package/check.sh" \
	"the Debian package: built with pg_buildext, installed, make installcheck against it"


# every other major given: its own build, install and server (test/majors.sh)
for other in $(other_pg_configs); do
	run_shell_check "major-$("$other" --version | awk '{print $2}')" "$IDEM_ROOT/test/majors.sh" \
		"idem on the PostgreSQL of $other" "$other"
done

log "stage times (s) and budgets: $(awk '{printf "%s %s/%s, ", $1, $2, $3; t += $2} END {printf "total %d s", t}' "$IDEM_TMP/stage-times")"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
