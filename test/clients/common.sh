# shellcheck shell=bash
# test/clients/common.sh: what the client libraries' stages share (sourced
# by python.sh, node.sh, java.sh and spring.sh).  A throwaway server on loopback TCP
# with the examples' database (examples/schema.sql), the role the example
# services connect as (shop_app: idem_grant's app kind, bound to owners
# 1-999999), services started on free ports and stopped with the script.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

CLIENTS_TEST=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
EXAMPLES=$IDEM_ROOT/examples
CLIENTS=$IDEM_ROOT/clients
# contract.py leaves each stack's fingerprints here; spring.sh, the last
# client stage, compares them (one directory for the whole test command)
export IDEM_FINGERPRINTS=$IDEM_RUN_DIR/fingerprints

ensure_client_packages() {	# ensure_client_packages PACKAGE...: the Debian packages a stage needs
	local missing=() p
	for p in "$@"; do
		# node and npm may come from elsewhere than Debian (NodeSource's nodejs has npm)
		case $p in
		nodejs) command -v node >/dev/null && continue ;;
		npm) command -v npm >/dev/null && continue ;;
		esac
		dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	fi
}


# the server, the database and the role; the caller's libpq variables then
# reach it as the superuser (the checks), SERVICE_USER as the services
start_clients_server() {
	[ -n "${IDEM_PG_ORIGIN:-}" ] || build_install	# run alone: a build of its own
	local port
	port=$(free_port)
	start_server "listen_addresses = '127.0.0.1'" "port = $port" "idem.cleanup_interval = 0" "max_connections = 200"
	export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=idem_clients
	"$PG_BINDIR/createdb" idem_clients
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -f "$EXAMPLES/schema.sql" >/dev/null
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 >/dev/null <<-'SQL'
		CREATE ROLE shop_app LOGIN;
		SELECT count(*) FROM idem_grant('shop_app', 'app');
		GRANT SELECT, INSERT, UPDATE ON shop_order, account, debit TO shop_app;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO shop_app;
		GRANT EXECUTE ON FUNCTION debit_account(bigint, numeric) TO shop_app;
		ALTER ROLE shop_app SET idem.allowed_owners = '1-999999';
		-- a duplicate waits for its in-flight original 1 s before IK002
		ALTER DATABASE idem_clients SET idem.wait_timeout = '1s';
	SQL
	SERVICE_USER=shop_app
	at_exit cleanup_clients
	# every call of idem from here on: planted overloads beside idem's
	# functions must never run, and each statement names idem's schema
	guard_idem_calls idem_clients shop_app postgres
	at_exit "check_idem_calls '${CLIENTS_STAGE:-$(basename "$0" .sh)}'"
}

service_pids=()
redis_port=
stop_services() {
	local pid
	for pid in "${service_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${service_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	service_pids=()
}
cleanup_clients() {
	stop_services
	[ -n "$redis_port" ] && redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1
	[ -n "${bouncer_pid:-}" ] && kill "$bouncer_pid" 2>/dev/null
	stop_server
}

# start_service NAME PORT [ENV=VALUE ...] -- COMMAND...: a service as
# SERVICE_USER on PORT; waits until it answers
start_service() {
	local name=$1 port=$2 envs=()
	shift 2
	while [ "$1" != "--" ]; do envs+=("$1"); shift; done
	shift
	# exec: $! is then the service itself, which stop_services ends
	(exec env PGUSER="$SERVICE_USER" PORT="$port" "${envs[@]}" "$@") >>"$IDEM_TMP/$name-$port.log" 2>&1 &
	service_pids+=($!)
	local _
	# a generous cap (IDEM_SERVICE_WAIT tenths of a second: a JVM's start on a busy machine)
	for _ in $(seq 1 "${IDEM_SERVICE_WAIT:-150}"); do
		/usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && return 0
		sleep 0.1
	done
	log "$name on port $port did not start:"
	cat "$IDEM_TMP/$name-$port.log" >&2
	return 1
}

# contract NAME URL OWNER_BASE [MODE ...]: test/clients/contract.py
# a run's mark in its keys: letters around the digits, so that no log line
# holds it by chance
new_run() { echo "run${RANDOM}x${RANDOM}z"; }
contract() { IDEM_RUN=${IDEM_RUN:-$(new_run)} /usr/bin/python3 "$CLIENTS_TEST/contract.py" "$@" || true; }

# the contract of one service: the checks, then a second instance with
# IDEM_CONFLICT_STATUS=422 on a read-only session
contract_of() {	# contract_of NAME OWNER_BASE COMMAND...
	local name=$1 owner=$2 port vport
	shift 2
	IDEM_RUN=$(new_run)
	export IDEM_RUN
	port=$(free_port)
	if start_service "$name" "$port" -- "$@"; then
		contract "$name" "http://127.0.0.1:$port" "$owner"
	else
		echo "not ok - $name: the service starts"
	fi
	vport=$(free_port)
	if start_service "$name" "$vport" IDEM_CONFLICT_STATUS=422 IDEM_ERRORS_URL=https://docs.example.org/idem/http-errors \
		IDEM_PG_OPTIONS="-c default_transaction_read_only=on" -- "$@"; then
		contract "$name" "http://127.0.0.1:$vport" "$owner" --variant
	else
		echo "not ok - $name: the read-only instance starts"
	fi
	stop_services
	keys_not_logged "$name"
	stack_logged "$name"
	unset IDEM_RUN
}

# stack_logged NAME: a handler's exception (the contract's test 4) is
# logged with its stack: the file and the line that raised it
stack_logged() {
	local frames
	frames=$(cat "$IDEM_TMP/$1"-*.log 2>/dev/null |
		grep -c -E '^  File ".*", line [0-9]+|^ +at .*\.(js|mjs):[0-9]+:[0-9]+|^\s+at [A-Za-z].*\([A-Za-z]+\.java:[0-9]+\)' || true)
	check "$1: a handler's exception is logged with its stack (file and line)" yes "$([ "$frames" -gt 0 ] && echo yes || echo "no frame in the log")"
}

# keys_not_logged NAME: no line the services NAME* wrote holds a key the
# checks sent (each key carries IDEM_RUN)
keys_not_logged() {
	local hits
	hits=$(cat "$IDEM_TMP/$1"-*.log 2>/dev/null | grep -c -- "$IDEM_RUN" || true)
	check "$1: no log line of the service holds an idempotency key ($(cat "$IDEM_TMP/$1"-*.log 2>/dev/null | wc -l) lines)" 0 "$hits"
}

# browser_double_click LABEL SERVICE COMMAND...: the example's order page
# (examples/web/index.html) in headless Chromium: a double click, then an
# edited order; checks named "LABEL: ..."
browser_double_click() {
	local label=$1 service=$2 port out k k2
	shift 2
	log "a double click, then an edited order, in headless Chromium ($service)"
	(cd "$CLIENTS_TEST" && npm install --no-audit --no-fund --silent >/dev/null 2>&1) || log "npm install failed in test/clients"
	SHOTS=${IDEM_SCREENSHOT_DIR:-$CLIENTS_TEST/screenshots}
	mkdir -p "$SHOTS"
	port=$(free_port)
	if ! start_service "$service" "$port" -- "$@"; then
		echo "not ok - $label: the $service service starts"
		return
	fi
	out=$(cd "$CLIENTS_TEST" && node browser.mjs "http://127.0.0.1:$port/" "$SHOTS/double-click-$service.png" 2>"$IDEM_TMP/browser.err") ||
		{ log "the browser test failed:"; cat "$IDEM_TMP/browser.err" >&2; }
	echo "# $label: $out"
	field() { printf '%s' "$out" | /usr/bin/python3 -c "import json, sys; d = json.load(sys.stdin); print($1)" 2>/dev/null; }
	k=$(field 'd["key"]')
	k2=$(field 'd["second"]')
	check "$label: the double click sent two POSTs with one key, the edited order a third with a new key" "201 201 201 new" \
		"$(field '" ".join(map(str, d["posts"])) + (" new" if d["key"] != d["second"] else " same")')"
	check "$label: one order for the double click's key" 1 \
		"$("$PG_BINDIR/psql" -X -At -c "SELECT count(*) FROM idem_internal.idempotency_record r JOIN shop_order o ON o.id = r.resource_id
		                          WHERE r.owner_id = 7 AND r.idempotency_key = '$k'")"
	check "$label: the edited order is a second order (quantity 3), not a 409" "1 3" \
		"$("$PG_BINDIR/psql" -X -At -F ' ' -c "SELECT count(*), max(o.quantity) FROM idem_internal.idempotency_record r
		     JOIN shop_order o ON o.id = r.resource_id WHERE r.owner_id = 7 AND r.idempotency_key = '$k2'")"
	# the page lists the answers as they arrive: the replay, woken by the
	# original's commit, may come in first
	check "$label: the page shows the first answer and the replayed one (the same order), then the new order" yes \
		"$(printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
first = [l for l in d["lines"] if l["key"] == d["key"]]
by = {l["cls"]: l["text"] for l in first}
last = [l for l in d["lines"] if l["key"] == d["second"]]
ok = (len(first) == 2 and sorted(by) == ["fresh", "replayed"]
      and by["replayed"] == by["fresh"].replace("201 ", "201 (replayed) ", 1)
      and len(last) == 1 and last[0]["cls"] == "fresh" and last[0]["text"].startswith("201 "))
print("yes" if ok else "no: %r" % d["lines"])' 2>&1)"
	check "$label: a screenshot was saved" yes "$([ -s "$SHOTS/double-click-$service.png" ] && echo yes || echo no)"
}

start_redis() {
	redis_port=$(free_port)
	redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes >/dev/null
}

# fast_layer_of NAME OWNER_BASE COMMAND...: the same service without and
# with REDIS_URL, and the fast layer's checks (Redis stopped, restarted,
# flushed, paused; test 5; hot-key replays with and without it)
fast_layer_of() {
	local name=$1 owner=$2 plain fast
	shift 2
	[ -n "$redis_port" ] || start_redis
	plain=$(free_port)
	fast=$(free_port)
	if start_service "$name" "$plain" -- "$@" &&
		start_service "$name-fast" "$fast" REDIS_URL="redis://127.0.0.1:$redis_port/0" -- "$@"; then
		IDEM_RUN=$(new_run)
		export IDEM_RUN
		contract "$name-fast" "http://127.0.0.1:$fast" "$owner" --fast "http://127.0.0.1:$plain" "$redis_port"
		stop_services
		keys_not_logged "$name-fast"
		unset IDEM_RUN
	else
		echo "not ok - $name-fast: the services start"
	fi
	stop_services
}

# tap_lines PREFIX: TAP "ok N - name" / "not ok N - name" lines as this suite's
tap_lines() { sed -n -E "s/^(not ok|ok) [0-9]+ - (.*)/\1 - $1: \2/p"; }

# The libraries built and installed as a user gets them (each prints its
# ok/not ok line; returns non-zero when it failed).

# build_python_client: the wheel (python3 -m build --no-isolation) from a
# copy of the tree, installed into a fresh venv; sets PY, the venv's python
build_python_client() {	# build_python_client [REQUIREMENT...]: installed beside it from PyPI (IDEM_WHEEL_EXTRAS: more extras)
	log "building the wheel"
	cp -r "$CLIENTS/python" "$IDEM_TMP/python-src"
	if ! (cd "$IDEM_TMP/python-src" && /usr/bin/python3 -m build --no-isolation --wheel -o "$IDEM_TMP/dist" . \
		>"$IDEM_TMP/build.log" 2>&1); then
		cat "$IDEM_TMP/build.log" >&2
		echo "not ok - python: the wheel builds"
		return 1
	fi
	local wheel
	wheel=$(ls "$IDEM_TMP"/dist/idem_pg-*.whl)
	echo "ok - python: the wheel builds ($(basename "$wheel"))"
	# a fresh venv, as the docs say: the wheel with its extras, and what the
	# stage runs besides (the callers' arguments), from PyPI
	/usr/bin/python3 -m venv "$IDEM_TMP/venv"
	if ! "$IDEM_TMP/venv/bin/pip" install -q --disable-pip-version-check "${wheel}[redis,pool,rabbitmq${IDEM_WHEEL_EXTRAS:+,$IDEM_WHEEL_EXTRAS}]" "$@" \
		>"$IDEM_TMP/pip.log" 2>&1; then
		cat "$IDEM_TMP/pip.log" >&2
		echo "not ok - python: the wheel and its dependencies install from PyPI into a fresh venv"
		return 1
	fi
	echo "ok - python: the wheel installs with its dependencies from PyPI into a fresh venv ($("$IDEM_TMP/venv/bin/python" -c 'import psycopg; print("psycopg", psycopg.__version__)'))"
	# shellcheck disable=SC2034  # the callers' interpreter
	PY=$IDEM_TMP/venv/bin/python
}

# build_node_client: npm pack, the tarball installed with its peers into a
# clean directory with the examples; sets NODE_APP
build_node_client() {
	log "npm pack clients/node; npm install into a clean directory"
	NODE_APP=$IDEM_TMP/node-app
	mkdir -p "$NODE_APP/test"
	local tarball
	if ! tarball=$(cd "$CLIENTS/node" && npm pack --silent --pack-destination "$IDEM_TMP" 2>"$IDEM_TMP/pack.log"); then
		cat "$IDEM_TMP/pack.log" >&2
		echo "not ok - node: npm pack"
		return 1
	fi
	echo '{"name": "idem-node-test", "private": true, "type": "module"}' >"$NODE_APP/package.json"
	if ! (cd "$NODE_APP" && npm install --no-audit --no-fund --silent "$IDEM_TMP/$tarball" pg@^8.13.0 redis@^4.7.0 \
		express@^5.1.0 >"$IDEM_TMP/npm.log" 2>&1); then
		cat "$IDEM_TMP/npm.log" >&2
		echo "not ok - node: the tarball and its peers install"
		return 1
	fi
	echo "ok - node: npm pack makes $tarball, installed with pg, redis and express"
	cp "$EXAMPLES/node/server.js" "$EXAMPLES/node/plain.js" "$NODE_APP/"
}

# build_java_client: the library as a user installs it, `mvn install` of
# clients/java (compiled with -Xlint:all -Werror; its JUnit tests, IdemTest,
# against this stage's server before the jar is installed; one line per
# Surefire test case), then the example against the installed jar; sets
# JAVA_BUILD, JAVA_JARCP (the jar and its dependencies, from the local
# Maven repository) and JAVA_APPCP (the example's classpath)
build_java_client() {
	local J=/usr/share/java version want
	JAVA_BUILD=$IDEM_TMP/java
	mkdir -p "$JAVA_BUILD/example"
	# the library's version is the extension's (idem.control) with a patch number
	want=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$IDEM_ROOT/idem.control").0
	version=$(sed -n '0,/<version>/s:.*<version>\(.*\)</version>.*:\1:p' "$CLIENTS/java/pom.xml")
	check "java: clients/java/pom.xml's version is idem.control's with a patch number ($want)" "$want" "$version"
	log "mvn install: clients/java (its tests against the stage's server)"
	if ! (cd "$CLIENTS/java" && mvn -B -ntp -Dmaven.test.failure.ignore=true install) >"$JAVA_BUILD/mvn.log" 2>&1; then
		tail -n 60 "$JAVA_BUILD/mvn.log" >&2
		echo "not ok - java: mvn install builds and installs idem-pg"
		return 1
	fi
	surefire_lines "java api" "$CLIENTS/java/target/surefire-reports"
	local jar=$HOME/.m2/repository/dev/idem/idem-pg/$version/idem-pg-$version.jar
	if [ ! -f "$jar" ]; then
		echo "not ok - java: mvn install puts idem-pg-$version.jar into the local Maven repository"
		return 1
	fi
	echo "ok - java: mvn install builds idem-pg-$version.jar (-Xlint:all -Werror) into the local Maven repository"
	(cd "$CLIENTS/java" && mvn -B -ntp -q dependency:build-classpath -Dmdep.includeScope=runtime \
		-Dmdep.outputFile="$JAVA_BUILD/deps.cp") >>"$JAVA_BUILD/mvn.log" 2>&1
	JAVA_JARCP=$jar:$(cat "$JAVA_BUILD/deps.cp")
	JAVA_APPCP=$JAVA_BUILD/example:$JAVA_JARCP:$J/tomcat10-embed-core.jar:$J/jakarta-annotation-api.jar
	if ! javac -Xlint:all -Werror -d "$JAVA_BUILD/example" -cp "$JAVA_APPCP" "$EXAMPLES/java/OrderServer.java" \
		>"$JAVA_BUILD/javac-ex.log" 2>&1; then
		cat "$JAVA_BUILD/javac-ex.log" >&2
		echo "not ok - java: examples/java/OrderServer.java compiles against the jar"
		return 1
	fi
}

# surefire_lines PREFIX DIR: one "ok - PREFIX: NAME" or "not ok - ..." line
# per test case of Surefire's XML reports in DIR ("not ok" when none ran)
surefire_lines() {
	/usr/bin/python3 - "$1" "$2" <<'PY'
import glob, re, sys, xml.etree.ElementTree as ET
prefix, folder = sys.argv[1], sys.argv[2]
cases = 0
for report in sorted(glob.glob(f"{folder}/TEST-*.xml")):
    for case in ET.parse(report).getroot().iter("testcase"):
        cases += 1
        name = re.sub(r"^\w+\(\) ", "", case.get("name"))	# "api() check" -> "check"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if case.find("skipped") is not None:
            print(f"skip - {prefix}: {name}")
        elif bad is not None:
            print(f"not ok - {prefix}: {name} ({(bad.get('message') or bad.get('type') or '').strip()[:300]})")
        else:
            print(f"ok - {prefix}: {name}")
if cases == 0:
    print(f"not ok - {prefix}: Surefire ran no test (no report in {folder})")
PY
}
