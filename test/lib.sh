# shellcheck shell=bash
# test/lib.sh: set-up shared by test/run_all.sh and test/demo.sh.
#
# Installs what a fresh Debian 12 machine lacks, builds and installs idem,
# and runs a throwaway PostgreSQL server with idem preloaded, on a
# private Unix socket in a temporary directory (no TCP).  The server runs as
# the "postgres" user when we are root (initdb refuses root) and is stopped by
# its own data directory when the calling script exits.

set -euo pipefail

IDEM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The server under test: Debian's PostgreSQL 15 unless PG_CONFIG names
# another installation (a build of 16, 17 or 18, say): then its binaries,
# headers and PGXS serve, and only what it lacks stops the run.
# build_install copies that installation into the run's directory and
# installs idem there: from then on PG_CONFIG names the copy and
# IDEM_PG_ORIGIN the installation it was copied from.
DEBIAN_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
PG_CONFIG=${PG_CONFIG:-$DEBIAN_PG_CONFIG}
PG_BINDIR=$("$PG_CONFIG" --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
export PG_CONFIG

# Is the server under test Debian's PostgreSQL 15, or a copy of it (what
# the package check and apt-get can serve)?
debian_pg() { [ "${IDEM_PG_ORIGIN:-$PG_CONFIG}" = "$DEBIAN_PG_CONFIG" ]; }

log() { printf '==> %s\n' "$*" >&2; }
# The libraries' version: the extension's (idem.control) with a patch number.
lib_version() { echo "$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$IDEM_ROOT/idem.control").0"; }

# How long a test waits for progress before it calls it a failure:
# PostgreSQL's suites' PG_TEST_TIMEOUT_DEFAULT (180 s unless set).  A wait
# polls for its condition and ends as soon as it holds; the cap is only
# reached when something is wrong.
IDEM_WAIT=${PG_TEST_TIMEOUT_DEFAULT:-180}
export IDEM_WAIT

# until_ok COMMAND...: run COMMAND every 0.1 s, its output dropped, until it
# succeeds; false after IDEM_WAIT s.
until_ok() {
	local deadline=$((SECONDS + IDEM_WAIT))
	while [ "$SECONDS" -lt "$deadline" ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}
# prints EXPECTED COMMAND...: does COMMAND print EXPECTED
prints() { [ "$("${@:2}" 2>/dev/null)" = "$1" ]; }
# until_sql EXPECTED COMMAND...: until COMMAND (a psql invocation printing
# one value) prints EXPECTED; false after IDEM_WAIT s.
until_sql() { until_ok prints "$@"; }

# A transaction held open until the test lets it go, instead of a
# pg_sleep a slow machine may outlast: gate_close PSQL... starts a session
# holding the advisory lock IDEM_GATE; the transaction to hold takes
# pg_advisory_xact_lock(IDEM_GATE) last and waits there; gate_waited
# PSQL... returns once it waits; gate_open PSQL... ends the holding
# session, and the waiting transaction goes on.
IDEM_GATE=424242
gate_lock() { echo "pg_catalog.pg_advisory_xact_lock($IDEM_GATE)"; }
gate_locks() {	# gate_locks granted|waiting PSQL...: does such a lock of the gate exist
	local which=$1
	shift
	"$@" -X -At -c "SELECT count(*) > 0 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objid = $IDEM_GATE AND $([ "$which" = granted ] || echo NOT) granted"
}
gate_close() {
	"$@" -c "SELECT pg_catalog.pg_advisory_lock($IDEM_GATE)" -c "SELECT pg_catalog.pg_sleep(86400)" >/dev/null 2>&1 &
	IDEM_GATE_JOB=$!
	until_sql t gate_locks granted "$@"
}
gate_waited() { until_sql t gate_locks waiting "$@"; }
gate_open() {
	"$@" -X -At -c "SELECT count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objid = $IDEM_GATE AND granted" >/dev/null
	wait "$IDEM_GATE_JOB" 2>/dev/null || true
}

# The run's own directory.  The first script of a run (test/run_all.sh,
# test/demo.sh, a benchmark run alone) makes it and removes it when it
# exits; every script it starts works under it: TMPDIR points into it, the
# copy of PostgreSQL with idem installed lives in it, and its ports come
# from one allocator kept in it (free_port).  Nothing outside it changes,
# the Debian-package stage excepted (it says so).
if [ -z "${IDEM_RUN_DIR:-}" ]; then
	IDEM_RUN_DIR=$(mktemp -d -t idem-run.XXXXXX)
	chmod 755 "$IDEM_RUN_DIR"
	mkdir -m 1777 "$IDEM_RUN_DIR/tmp"
	IDEM_RUN_OWNER=$$
	export IDEM_RUN_DIR IDEM_RUN_OWNER
	export TMPDIR=$IDEM_RUN_DIR/tmp
fi

# Run the commands registered with at_exit (last first) when the script
# exits, then remove the run's directory if this script made it.
IDEM_AT_EXIT=()
at_exit() { IDEM_AT_EXIT=("$*" "${IDEM_AT_EXIT[@]}"); }
run_at_exit() {
	local cmd
	for cmd in "${IDEM_AT_EXIT[@]}"; do
		eval "$cmd" || true
	done
	if [ "${IDEM_RUN_OWNER:-}" = "$$" ] && [ -z "${IDEM_KEEP_TMP:-}" ]; then
		rm -rf "$IDEM_RUN_DIR"
	fi
}
trap run_at_exit EXIT

# The other majors to test besides $PG_CONFIG's: each pg_config named in
# IDEM_PG_CONFIGS, then each /usr/lib/postgresql/*/bin/pg_config (PGDG's
# packages put the majors there); one path per installation, in that order.
# test/majors.sh skips, with a line, one whose server headers are missing.
other_pg_configs() {
	local c real seen
	seen=" $(readlink -f "$PG_CONFIG") $(readlink -f "${IDEM_PG_ORIGIN:-$PG_CONFIG}") "
	for c in ${IDEM_PG_CONFIGS:-}; do
		real=$(readlink -f "$c" || echo "$c")
		case "$seen" in *" $real "*) continue ;; esac
		seen="$seen$real "
		echo "$c"
	done
	for c in /usr/lib/postgresql/*/bin/pg_config; do
		[ -x "$c" ] || continue
		real=$(readlink -f "$c")
		case "$seen" in *" $real "*) continue ;; esac
		seen="$seen$real "
		echo "$c"
	done
}

# Run a command as the server's OS user.
as_pg_user() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# Install the build and test dependencies that a fresh machine lacks.
ensure_packages() {
	local missing=()
	if debian_pg; then
		[ -x "$PG_BINDIR/postgres" ] || missing+=(postgresql-15)
		# pgxs.mk, pg_regress and pg_isolation_regress come with the client
		# package; the server headers are what postgresql-server-dev-15 adds
		[ -f /usr/include/postgresql/15/server/postgres.h ] || missing+=(postgresql-server-dev-15)
		[ -f /usr/share/postgresql/15/extension/pgcrypto.control ] || missing+=(postgresql-contrib)
	else
		local pg
		for pg in "$PG_BINDIR/postgres" "$("$PG_CONFIG" --pgxs)" \
			"$("$PG_CONFIG" --includedir-server)/postgres.h" \
			"$("$PG_CONFIG" --sharedir)/extension/pgcrypto.control"; do
			if [ ! -e "$pg" ]; then
				log "the PostgreSQL of $PG_CONFIG lacks $pg (build it with --enable-tap-tests --with-openssl, and install contrib/pgcrypto)"
				exit 1
			fi
		done
	fi
	perl -MIPC::Run -e 1 2>/dev/null || missing+=(libipc-run-perl)
	# the outbox/inbox pipeline's processes (test/e2e)
	/usr/bin/python3 -c 'import psycopg' 2>/dev/null || missing+=(python3-psycopg)
	command -v make >/dev/null || missing+=(make)
	command -v gcc >/dev/null || missing+=(gcc)
	if [ ${#missing[@]} -eq 0 ]; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		log "missing packages: ${missing[*]} (run as root, or install them)"
		exit 1
	fi
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Install the Debian packages of a stage's servers (brokers, poolers, a
# DCS) that are missing, without starting the machine's own services: a
# policy-rc.d that refuses every start is in place while apt runs.
ensure_service_packages() {	# ensure_service_packages PACKAGE...
	local missing=() p guard=/usr/sbin/policy-rc.d had_guard=0
	for p in "$@"; do
		dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -gt 0 ] || return 0
	log "installing ${missing[*]} (their services not started)"
	[ -e "$guard" ] && had_guard=1
	[ "$had_guard" = 1 ] || printf '#!/bin/sh\nexit 101\n' >"$guard"
	chmod +x "$guard"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	[ "$had_guard" = 1 ] || rm -f "$guard"
}

# A TCP port on loopback for a server of this run: the run's one allocator
# (test/ports.py), which hands out each port once, from a block below the
# kernel's ephemeral range, after checking nothing listens on it.
free_port() { /usr/bin/python3 "$IDEM_ROOT/test/ports.py"; }

# Copy the source tree to DEST: in a git checkout the files git would
# commit (tracked, and new ones it does not ignore), else the tree without
# its builds, results and node_modules.
copy_source_tree() {	# copy_source_tree DEST
	mkdir -p "$1"
	if git -C "$IDEM_ROOT" rev-parse --git-dir >/dev/null 2>&1; then
		git -C "$IDEM_ROOT" ls-files -z --cached --others --exclude-standard |
			(cd "$IDEM_ROOT" && xargs -0 tar -cf - --ignore-failed-read 2>/dev/null) | tar -C "$1" -xf -
	else
		tar -C "$IDEM_ROOT" --exclude=.git --exclude=node_modules --exclude='*.o' --exclude='*.so' \
			--exclude=results --exclude=tmp_check -cf - . | tar -C "$1" -xf -
	fi
}

# A copy of the PostgreSQL installation of $PG_CONFIG in the run's
# directory, each of its directories at its own path under the copy's root
# (PostgreSQL finds its lib/ and share/ relative to its binaries); the
# server headers are linked, not copied (they are only read).  Sets
# PG_CONFIG and PG_BINDIR to the copy's, IDEM_PG_ORIGIN to the original.
private_pg_tree() {
	local origin=$PG_CONFIG root dir
	root=$IDEM_RUN_DIR/pg-$("$origin" --version | awk '{print $2}')
	if [ ! -x "$root$("$origin" --bindir)/pg_config" ]; then
		for dir in "$("$origin" --bindir)" "$("$origin" --pkglibdir)" "$("$origin" --sharedir)"; do
			mkdir -p "$root$(dirname "$dir")"
			cp -a "$dir" "$root$dir"
		done
		dir=$("$origin" --includedir-server)
		mkdir -p "$root$(dirname "$dir")"
		ln -s "$dir" "$root$dir"
		# what an earlier install of idem left in the original
		rm -f "$root$("$origin" --pkglibdir)"/idem.so "$root$("$origin" --sharedir)"/extension/idem[.-]*
		rm -rf "$root$("$origin" --pkglibdir)"/bitcode/idem "$root$("$origin" --pkglibdir)"/bitcode/idem.index.bc
	fi
	IDEM_PG_ORIGIN=$origin
	PG_CONFIG=$root$("$origin" --bindir)/pg_config
	PG_BINDIR=$("$PG_CONFIG" --bindir)
	export IDEM_PG_ORIGIN PG_CONFIG
}

# Run the calling script (its path in the tree: test/run_all.sh) again from
# a copy of the source tree in the run's directory, unless it already runs
# there: the build, the results and the packages never land in the checkout.
run_in_copy() {	# run_in_copy SCRIPT ARGS...
	[ -z "${IDEM_RUN_TREE:-}" ] || return 0
	local script=$1
	shift
	IDEM_RUN_TREE=$IDEM_RUN_DIR/src
	copy_source_tree "$IDEM_RUN_TREE"
	chmod 755 "$IDEM_RUN_TREE"
	export IDEM_RUN_TREE
	log "running in $IDEM_RUN_TREE (a copy of $IDEM_ROOT)"
	exec bash "$IDEM_RUN_TREE/$script" "$@"
}

# Build idem with -Werror and install it into a private copy of the
# PostgreSQL of $PG_CONFIG (private_pg_tree): the machine's own
# installation is only read.
build_install() {
	[ -n "${IDEM_PG_ORIGIN:-}" ] || private_pg_tree
	log "building idem and installing it into $(dirname "$PG_BINDIR") (a copy of $IDEM_PG_ORIGIN's PostgreSQL)"
	make -C "$IDEM_ROOT" -s clean >/dev/null
	make -C "$IDEM_ROOT" -s COPT=-Werror >/dev/null
	make -C "$IDEM_ROOT" -s COPT=-Werror install >/dev/null
}

# Create a throwaway cluster with idem preloaded, on a private socket in a
# temporary directory; sets IDEM_TMP, PGHOST, PGPORT, PGUSER, and stops the
# server on exit.  Extra postgresql.conf lines may be given as arguments.
init_server() {
	IDEM_TMP=$(mktemp -d -t idem-test.XXXXXX)
	chmod 755 "$IDEM_TMP"
	[ "$(id -u)" -eq 0 ] && chown postgres: "$IDEM_TMP"
	as_pg_user "$PG_BINDIR/initdb" -D "$IDEM_TMP/data" -U postgres \
		--auth=trust --encoding=UTF8 --locale=C.UTF-8 --no-sync >"$IDEM_TMP/initdb.log" 2>&1
	local port
	port=$(free_port)
	{
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$IDEM_TMP'"
		echo "port = $port"
		echo "shared_preload_libraries = 'idem'"
		echo "max_connections = 100"
		echo "fsync = off"
		echo "log_min_messages = warning"
		for line in "$@"; do echo "$line"; done
	} >>"$IDEM_TMP/data/postgresql.conf"
	export PGHOST=$IDEM_TMP PGPORT=$port PGUSER=postgres
	at_exit stop_server
}

# Start a throwaway server (see init_server).
start_server() {
	init_server "$@"
	as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -l "$IDEM_TMP/server.log" -w -s start
	log "server running (socket directory $IDEM_TMP)"
}

# Stop the server this script started, and only that one.
stop_server() {
	if [ -n "${IDEM_TMP:-}" ] && [ -f "$IDEM_TMP/data/postmaster.pid" ]; then
		as_pg_user "$PG_BINDIR/pg_ctl" -D "$IDEM_TMP/data" -m fast -w -s stop || true
	fi
	if [ -n "${IDEM_TMP:-}" ] && [ -z "${IDEM_KEEP_TMP:-}" ]; then
		rm -rf "$IDEM_TMP"
	fi
}

# A new database $1 with idem installed, dropped first if it exists.
new_idem_database() {
	"$PG_BINDIR/dropdb" --if-exists "$1" 2>/dev/null
	"$PG_BINDIR/createdb" "$1"
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$1" -c "CREATE EXTENSION idem"
}

# A new database $1 with idem's SQL edition (managed/idem.sql, or the
# script $2) in schema idem, owned by the NOLOGIN role idem_owner,
# installed as a member of it (the superuser here); the C library is not
# used.  Its search_path is idem, public: the C edition's tests, run
# against it, call idem's functions unqualified.
new_sql_edition_database() {	# new_sql_edition_database DB [SCRIPT]
	"$PG_BINDIR/dropdb" --if-exists "$1" 2>/dev/null
	"$PG_BINDIR/createdb" "$1"
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$1" >/dev/null <<-SQL
		DO \$\$ BEGIN CREATE ROLE idem_owner NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END \$\$;
		CREATE SCHEMA idem AUTHORIZATION idem_owner;
		ALTER DATABASE "$1" SET search_path = idem, public;
	SQL
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$1" -f "${2:-$IDEM_ROOT/managed/idem.sql}" >/dev/null
}

# Guard database $1's calls of idem: overloads of every idem function
# planted in idem's schema and on the search_path of the roles $2...
# (test/plants.sql), and every statement logged (log_statement = all) from
# here on.  check_idem_calls NAME says afterwards, for every database
# guarded, that no plant ran, and that every logged call of an idem
# function named idem's schema and cast its arguments.
IDEM_GUARDED=()
guard_idem_calls() {	# guard_idem_calls DB [CALLER...]
	local db=$1
	shift
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$db" -v callers="$*" -f "$IDEM_ROOT/test/plants.sql" >/dev/null 2>&1 ||
		{ echo "not ok - $db: the overloads of idem's functions are planted"; return 1; }
	"$PG_BINDIR/psql" -X -q -d "$db" -c "ALTER DATABASE \"$db\" SET log_statement = 'all'"
	[ ${#IDEM_GUARDED[@]} -gt 0 ] || IDEM_CALLS_FROM=$(stat -c %s "$(server_log)")
	IDEM_GUARDED+=("$db")
}
# The log of the server PG* names (start_server's, beside its data directory).
server_log() { echo "$(dirname "$("$PG_BINDIR/psql" -X -At -d postgres -c 'SHOW data_directory')")/server.log"; }
check_idem_calls() {	# check_idem_calls NAME
	local name=$1 db functions schema
	for db in "${IDEM_GUARDED[@]}"; do
		"$PG_BINDIR/psql" -X -q -d "$db" -c "ALTER DATABASE \"$db\" RESET log_statement"
		check "$name: no overload planted beside idem's functions ran ($db)" "none" \
			"$("$PG_BINDIR/psql" -X -At -d "$db" -c "SELECT coalesce((SELECT string_agg(DISTINCT who || ' ' || fn, '; ')
			     FROM public.idem_plant_log), CASE WHEN (SELECT is_called FROM public.idem_plant_hits) THEN 'a planted overload ran (rolled back)' END, 'none')")"
	done
	db=${IDEM_GUARDED[0]}
	schema=$("$PG_BINDIR/psql" -X -At -d "$db" -c "SELECT extnamespace::regnamespace FROM pg_extension WHERE extname = 'idem'")
	functions=$("$PG_BINDIR/psql" -X -At -d "$db" -c "SELECT string_agg(DISTINCT p.proname, ',') FROM pg_proc p JOIN pg_depend d
		ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
		JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'")
	/usr/bin/python3 "$IDEM_ROOT/test/idem_calls.py" "$(server_log)" "${IDEM_CALLS_FROM:-0}" "${schema//\"/}" "$functions" "$name"
}

# Benchmarks: a throwaway server tuned alike for every benchmark (extra
# postgresql.conf lines as arguments), and sql() in database postgres.
start_bench_server() {
	start_server "shared_buffers = 1GB" "synchronous_commit = off" "fsync = on" \
		"max_wal_size = 8GB" "checkpoint_timeout = 30min" "idem.cleanup_interval = 0" "$@"
	DB=postgres
	sql() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
}

# Benchmarks: the median of the numbers on stdin (space- or newline-separated).
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Benchmarks: the generic API's replay (idem_begin of one of 1000 finished
# keys of operation BENCH) and fresh call (idem_begin + idem_finish of a new
# key, one transaction) as pgbench scripts $IDEM_TMP/replay.pgbench and
# $IDEM_TMP/fresh.pgbench.
write_api_pgbench_scripts() {
	cat >"$IDEM_TMP/replay.pgbench" <<-'SQL'
	\set i random(1, 1000)
	SELECT replayed FROM public.idem_begin(1, 'BENCH', 'replay-' || lpad(:i::text, 12, '0'), '{}');
	SQL
	cat >"$IDEM_TMP/fresh.pgbench" <<-'SQL'
	\set r random(1, 1000000000000)
	BEGIN;
	SELECT replayed FROM public.idem_begin(:client_id, 'BENCH', 'fresh-' || :client_id || '-' || lpad(:r::text, 13, '0'), '{}');
	SELECT public.idem_finish(:client_id, 'BENCH', 'fresh-' || :client_id || '-' || lpad(:r::text, 13, '0'), 201, '{}');
	COMMIT;
	SQL
}

# Benchmarks: REPS repetitions of `tps WHAT` (the caller's function) under
# two configurations, which the functions CONFIG_A and CONFIG_B put the
# server in, alternating which runs first (neither always warms the other
# up); prints "FIGURES_A|FIGURES_B".
interleaved() {	# interleaved CONFIG_A CONFIG_B WHAT
	local a=() b=() r
	for r in $(seq 1 "$REPS"); do
		if [ $((r % 2)) -eq 1 ]; then
			"$1"; a+=("$(tps "$3")")
			"$2"; b+=("$(tps "$3")")
		else
			"$2"; b+=("$(tps "$3")")
			"$1"; a+=("$(tps "$3")")
		fi
	done
	echo "${a[*]}|${b[*]}"
}

# Benchmarks: the ratios A_i / B_i of two lists of per-repetition figures,
# to two decimals, each followed by a space.
per_repetition_ratios() {	# per_repetition_ratios "A1 A2 ..." "B1 B2 ..."
	paste -d' ' <(echo "$1" | tr ' ' '\n' | grep -v '^$') <(echo "$2" | tr ' ' '\n' | grep -v '^$') |
		awk '{printf "%.2f ", $1 / $2}'
}

# One line of a shell check: "ok - NAME" or "not ok - NAME (...)".
check() {	# check NAME EXPECTED ACTUAL
	if [ "$2" = "$3" ]; then
		echo "ok - $1"
	else
		echo "not ok - $1 (expected $2, got $3)"
	fi
}
