#!/usr/bin/env bash
# The example services (examples/) tested by real HTTP requests, on their
# own throwaway server listening on loopback TCP: for Python (psycopg 3, the
# standard library's HTTP server), Node (pg, node:http) and Java (pgjdbc,
# the JDK's HTTP server), the article's seven tests over HTTP, 20 concurrent
# identical POSTs, the status mapping, and a read-only instance with
# IDEM_CONFLICT_STATUS=422; a double click in headless Chromium on the
# Python service's order page (screenshot kept); and the Python service's
# Redis fast layer under a Redis that stops, restarts, is flushed and
# pauses, with hot-key replays measured with and without it.
#
# Installs what it needs (Debian packages, npm modules) when missing.
# Prints one "ok - ..." or "not ok - ..." line per check.
#
#   bash test/examples/run.sh          (after the build: test/run_all.sh runs it)
source "$(dirname "$0")/../lib.sh"

here=$(cd "$(dirname "$0")" && pwd)
ex=$IDEM_ROOT/examples
SHOTS=${IDEM_SCREENSHOT_DIR:-$IDEM_ROOT/test/examples/screenshots}

missing=()
/usr/bin/python3 -c 'import psycopg_pool' 2>/dev/null || missing+=(python3-psycopg-pool)
/usr/bin/python3 -c 'import redis' 2>/dev/null || missing+=(python3-redis)
command -v redis-server >/dev/null || missing+=(redis-server)
[ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
command -v javac >/dev/null || missing+=(default-jdk-headless)
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# a redis-server package starts the system's instance: ours is separate
[ -f "$(/usr/bin/pg_config --pkglibdir)/idem.so" ] || build_install

log "npm install (pg, playwright-core)"
(cd "$ex/node" && npm install --no-audit --no-fund --silent >/dev/null 2>&1) || log "npm install failed in examples/node"
(cd "$here" && npm install --no-audit --no-fund --silent >/dev/null 2>&1) || log "npm install failed in test/examples"
log "javac examples/java/IdemServer.java"
mkdir -p "$ex/java/classes"
javac -d "$ex/java/classes" -cp /usr/share/java/postgresql.jar "$ex/java/IdemServer.java"

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pg_port=$(free_port)
start_server "listen_addresses = '127.0.0.1'" "port = $pg_port" "idem.cleanup_interval = 0"
export PGHOST=127.0.0.1 PGPORT=$pg_port PGUSER=postgres PGDATABASE=idem_examples
"$PG_BINDIR/createdb" idem_examples
"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -f "$ex/schema.sql" >/dev/null
# a duplicate waits for its in-flight original 1 s before IK002
"$PG_BINDIR/psql" -X -q -c "ALTER DATABASE idem_examples SET idem.wait_timeout = '1s'"

pids=()
stop_services() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	pids=()
}
redis_port=
cleanup() {
	stop_services
	[ -n "$redis_port" ] && redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1
	stop_server
}
trap cleanup EXIT

start_service() {	# start_service LANG PORT [ENV=VALUE ...]: starts it, waits until it answers
	local lang=$1 port=$2
	shift 2
	# exec: $! is then the service itself, which stop_services ends
	case $lang in
	python) exec env PORT="$port" "$@" /usr/bin/python3 "$ex/python/server.py" ;;
	node) exec env PORT="$port" "$@" node "$ex/node/server.js" ;;
	java) exec env PORT="$port" "$@" java -cp "$ex/java/classes:/usr/share/java/postgresql.jar" IdemServer ;;
	esac >>"$IDEM_TMP/$lang-$port.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 100); do
		/usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && return 0
		sleep 0.1
	done
	log "$lang service on port $port did not start:"
	cat "$IDEM_TMP/$lang-$port.log" >&2
	return 1
}

owner=1000
for lang in python node java; do
	log "the $lang service"
	export IDEM_RUN=$RANDOM$RANDOM
	port=$(free_port)
	if start_service "$lang" "$port"; then
		/usr/bin/python3 "$here/http_checks.py" "$lang" "http://127.0.0.1:$port" "$owner" || true
		vport=$(free_port)
		if start_service "$lang" "$vport" IDEM_CONFLICT_STATUS=422 \
			IDEM_PG_OPTIONS="-c default_transaction_read_only=on"; then
			/usr/bin/python3 "$here/http_checks.py" "$lang" "http://127.0.0.1:$vport" "$owner" --variant || true
		else
			echo "not ok - $lang: the read-only instance starts"
		fi
	else
		echo "not ok - $lang: the service starts"
	fi
	grep -E 'Traceback|Exception in|at [a-z.]+\(' "$IDEM_TMP/$lang-"*.log >/dev/null &&
		log "(the $lang service logged errors server side, as it should: details stay in its log)"
	stop_services
	owner=$((owner + 100))
done

# a double click in a real browser
log "a double click in headless chromium"
port=$(free_port)
mkdir -p "$SHOTS"
if start_service python "$port"; then
	out=$(cd "$here" && node browser.mjs "http://127.0.0.1:$port/" "$SHOTS/double-click.png" 2>"$IDEM_TMP/browser.err") ||
		{ log "the browser test failed:"; cat "$IDEM_TMP/browser.err" >&2; }
	echo "# browser: $out"
	k=$(printf '%s' "$out" | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])' 2>/dev/null)
	check "browser: the double click sent two POSTs with one key" "201 201" \
		"$(printf '%s' "$out" | /usr/bin/python3 -c 'import json, sys; print(*json.load(sys.stdin)["posts"])' 2>/dev/null)"
	check "browser: one order for the key" 1 \
		"$("$PG_BINDIR/psql" -X -At -c "SELECT count(*) FROM idempotency_record r JOIN purchase_order o ON o.id = r.resource_id
		                          WHERE r.owner_id = 7 AND r.idempotency_key = '$k'")"
	# the page lists the answers as they arrive: the replay, woken by the
	# original's commit, may come in first, so the order is not checked
	check "browser: the page shows the first answer and the replayed one, the same order" yes \
		"$(printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
lines = json.load(sys.stdin)["lines"]
by = {l["cls"]: l["text"] for l in lines}
ok = (len(lines) == 2 and sorted(by) == ["fresh", "replayed"]
      and by["replayed"] == by["fresh"].replace("201 ", "201 (replayed) ", 1))
print("yes" if ok else "no: %r" % lines)' 2>&1)"
	check "browser: a screenshot was saved" yes "$([ -s "$SHOTS/double-click.png" ] && echo yes || echo no)"
else
	echo "not ok - browser: the python service starts"
fi
stop_services

# the fast layer
log "the Python service's Redis fast layer"
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes >/dev/null
plain_port=$(free_port)
fast_port=$(free_port)
export IDEM_RUN=$RANDOM$RANDOM
if start_service python "$plain_port" && start_service python "$fast_port" REDIS_URL="redis://127.0.0.1:$redis_port/0"; then
	/usr/bin/python3 "$here/http_checks.py" python-redis "http://127.0.0.1:$fast_port" 5000 \
		--redis "http://127.0.0.1:$plain_port" "$redis_port" || true
else
	echo "not ok - python-redis: the services start"
fi
