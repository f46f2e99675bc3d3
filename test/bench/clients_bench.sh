#!/usr/bin/env bash
# What each middleware costs: the example services of examples/ on the
# client libraries, built and installed as test/clients does, each with
# IDEM_BENCH=1 (which adds POST /bare/orders: the same order handler
# without idem, in its own transaction).  Per service and repetition, in
# the same process tree and run, after an untimed pass of each (the JIT's
# warm-up): requests per second of the bare handler,
# of the middleware on a fresh request (a new key each time: claim,
# handler, finish) and on a replay (one key); printed with the ratios to
# the bare handler, and the medians of the per-repetition ratios.
#
#   IDEM_BENCH_SECONDS=3 IDEM_BENCH_REPS=3 IDEM_BENCH_PROCS=4 bash test/bench/clients_bench.sh
#   IDEM_BENCH_STACKS="java-tomcat spring-boot spring-boot4" bash test/bench/clients_bench.sh   # some services only
source "$(dirname "$0")/../clients/common.sh"

SECONDS_EACH=${IDEM_BENCH_SECONDS:-3}
REPS=${IDEM_BENCH_REPS:-3}
PROCS=${IDEM_BENCH_PROCS:-4}
ensure_client_packages python3-build python3-venv python3-pip python3-psycopg python3-psycopg-pool python3-flask \
	python3-fastapi python3-uvicorn python3-django python3-psycopg2 nodejs npm default-jdk-headless \
	maven libtomcat10-embed-java libjakarta-annotation-api-java
start_clients_server
build_python_client "flask>=3,<4" "fastapi>=0.110,<1" "uvicorn>=0.29,<1" "django>=5.1,<6" >/dev/null
build_node_client >/dev/null
build_java_client >/dev/null
# the Spring Boot starters and examples/spring's jar on each line (POST
# /bare/orders with IDEM_BENCH=1)
(cd "$CLIENTS/java/spring" && mvn -B -ntp -q -DskipTests install && cd "$IDEM_ROOT/examples/spring" &&
	mvn -B -ntp -q -DskipTests clean package && cp "target/spring-orders-$(lib_version).jar" "$IDEM_TMP/spring-boot-3.5.jar" &&
	mvn -B -ntp -q -DskipTests -Pboot4 clean package && cp "target/spring-orders-$(lib_version).jar" "$IDEM_TMP/spring-boot-4.1.jar") \
	>"$IDEM_TMP/mvn-spring.log" 2>&1 || { cat "$IDEM_TMP/mvn-spring.log" >&2; exit 1; }

bench() {	# bench NAME COMMAND...
	local name=$1 port fresh=() replay=() bare=() r b f p m
	shift
	[ -z "${IDEM_BENCH_STACKS:-}" ] || [[ " $IDEM_BENCH_STACKS " == *" $name "* ]] || return 0
	port=$(free_port)
	start_service "$name" "$port" IDEM_BENCH=1 -- "$@" || return 0
	# one untimed pass of each first: a JVM's JIT warms up on it, or the
	# first measure of each repetition (bare) would be the slower for it
	for m in bare fresh replay; do
		/usr/bin/python3 "$IDEM_ROOT/test/bench/clients_load.py" "http://127.0.0.1:$port" "$m" "$SECONDS_EACH" "$PROCS" 90000 >/dev/null
	done
	for r in $(seq 1 "$REPS"); do
		b=$(/usr/bin/python3 "$IDEM_ROOT/test/bench/clients_load.py" "http://127.0.0.1:$port" bare "$SECONDS_EACH" "$PROCS" 90000)
		f=$(/usr/bin/python3 "$IDEM_ROOT/test/bench/clients_load.py" "http://127.0.0.1:$port" fresh "$SECONDS_EACH" "$PROCS" 90000)
		p=$(/usr/bin/python3 "$IDEM_ROOT/test/bench/clients_load.py" "http://127.0.0.1:$port" replay "$SECONDS_EACH" "$PROCS" 90000)
		bare+=("$b"); fresh+=("$f"); replay+=("$p")
		printf '%-16s rep %d: bare %6s/s  fresh %6s/s (%s x)  replay %6s/s (%s x)\n' "$name" "$r" "$b" "$f" \
			"$(per_repetition_ratios "$f" "$b")" "$p" "$(per_repetition_ratios "$p" "$b")"
	done
	printf '%-16s median: fresh %s x bare, replay %s x bare\n' "$name" \
		"$(per_repetition_ratios "${fresh[*]}" "${bare[*]}" | median)" \
		"$(per_repetition_ratios "${replay[*]}" "${bare[*]}" | median)"
	stop_services
}

echo "# $PROCS client processes, $SECONDS_EACH s per measure, $REPS repetitions; ratios against the bare handler"
bench python-flask "$PY" "$EXAMPLES/python/flask_app.py"
bench python-fastapi "$PY" "$EXAMPLES/python/fastapi_app.py"
bench python-django "$PY" "$EXAMPLES/python/django_app.py"
bench node-express node "$NODE_APP/server.js"
bench node-http node "$NODE_APP/plain.js"
bench java-tomcat java -cp "$JAVA_APPCP" OrderServer
IDEM_SERVICE_WAIT=600 bench spring-boot java -Djava.io.tmpdir="$TMPDIR" -jar "$IDEM_TMP/spring-boot-3.5.jar"
IDEM_SERVICE_WAIT=600 bench spring-boot4 java -Djava.io.tmpdir="$TMPDIR" -jar "$IDEM_TMP/spring-boot-4.1.jar"
