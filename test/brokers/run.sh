#!/usr/bin/env bash
# The outbox and the inbox through real brokers: idem_pg.relay publishing
# to Redis Streams and to RabbitMQ, idem_pg.consumer applying each
# message through the inbox, with relays killed, the broker restarted and a
# consumer exiting between its commit and its broker ack
# (test/brokers/pipeline.py).  Both brokers are Debian's, started here on
# loopback on private ports, and stopped with the script.  Prints one
# "ok - ..." / "not ok - ..." line per check.
#
#   bash test/brokers/run.sh
export CLIENTS_STAGE=brokers	# the name of this stage's checks (test/clients/common.sh)
source "$(dirname "$0")/../clients/common.sh"
here=$(cd "$(dirname "$0")" && pwd)

ensure_client_packages python3-build python3-setuptools python3-wheel python3-venv python3-pip \
	python3-psycopg python3-redis python3-pika redis-server nodejs npm
start_clients_server
"$PG_BINDIR/createdb" idem_brokers
"$PG_BINDIR/psql" -X -q -d idem_brokers -c "CREATE EXTENSION idem"
guard_idem_calls idem_brokers postgres
# the wheel's rabbitmq, redis and otel extras (pika, redis, opentelemetry-api), and the SDK for traces.py
IDEM_WHEEL_EXTRAS=otel build_python_client "opentelemetry-sdk>=1.20,<2" || exit 0
# the Node library too, with amqplib: one of the two consumers is Node's
# (and OpenTelemetry's API, SDK and async context for traces.mjs)
if build_node_client && (cd "$NODE_APP" && npm install --no-audit --no-fund --silent amqplib@^0.10.4 \
	@opentelemetry/api@^1.9.0 @opentelemetry/sdk-trace-base@^2.0.0 @opentelemetry/context-async-hooks@^2.0.0 \
	>>"$IDEM_TMP/npm.log" 2>&1); then
	export NODE_APP
else
	echo "not ok - node: amqplib installs"
fi
export PY IDEM_TMP
export PIPELINE_DSN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=idem_brokers"

# ---- Redis Streams: append-only file fsynced on every write, so that a
# restart keeps every message the relay had confirmed; requests longer than
# 1 MB refused (dead_letters.py's oversized message) ----
redis_dir=$IDEM_TMP/redis
mkdir -p "$redis_dir"
redis_port=$(free_port)
redis_start() {
	redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$redis_dir" --save '' \
		--appendonly yes --appendfsync always --daemonize yes --pidfile "$redis_dir/redis.pid" \
		--proto-max-bulk-len 1mb >/dev/null
	until_ok redis-cli -p "$redis_port" ping
}
redis_stop() {
	redis-cli -p "$redis_port" shutdown >/dev/null 2>&1 || true
	until_ok test ! -f "$redis_dir/redis.pid" || true
}
rabbit_stop() { :; }	# until rabbitmq.sh is sourced
at_exit 'redis_stop; rabbit_stop'	# rabbit_stop as rabbitmq.sh defines it by then
redis_start
export -f redis_start redis_stop until_ok	# for the bash -c restarts below
export redis_port redis_dir
log "Redis Streams on 127.0.0.1:$redis_port"
"$PY" "$here/pipeline.py" redis "redis://127.0.0.1:$redis_port/0" bash -c 'redis_stop && redis_start' ||
	echo "not ok - redis: the pipeline ran to its end"
# dead letters: the broker stopped for longer than the relays' 2 s lease
# (the broker down: the flag touched, then 6 s more, longer than the 2 s lease)
"$PY" "$here/dead_letters.py" redis "redis://127.0.0.1:$redis_port/0" \
	bash -c 'redis_stop && touch "$IDEM_BROKER_DOWN_FLAG" && sleep 6 && redis_start' ||
	echo "not ok - redis: the dead-letter checks ran to their end"
"$PY" "$here/fuzz_entries.py" redis "redis://127.0.0.1:$redis_port/0" ||
	echo "not ok - redis: the malformed entries' checks ran to their end"
"$PY" "$here/traces.py" redis "redis://127.0.0.1:$redis_port/0" ||
	echo "not ok - redis: the traces' checks ran to their end"
if [ -n "${NODE_APP:-}" ]; then
	cp "$here/traces.mjs" "$NODE_APP/traces.mjs"
	(cd "$NODE_APP" && node traces.mjs "redis://127.0.0.1:$redis_port/0") ||
		echo "not ok - redis: the Node traces' checks ran to their end"
fi
redis_stop

# ---- RabbitMQ: its own node name, ports, data directory and cookie ----
# (rabbit_start installs Debian's rabbitmq-server when it is missing)
source "$here/rabbitmq.sh"
if rabbit_start; then
	log "RabbitMQ on 127.0.0.1:$RABBIT_PORT"
	"$PY" "$here/pipeline.py" rabbitmq "amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2F" bash "$here/rabbitmq.sh" restart ||
		echo "not ok - rabbitmq: the pipeline ran to its end"
	"$PY" "$here/dead_letters.py" rabbitmq "amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2F" bash "$here/rabbitmq.sh" restart ||
		echo "not ok - rabbitmq: the dead-letter checks ran to their end"
	"$PY" "$here/fuzz_entries.py" rabbitmq "amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2F" ||
		echo "not ok - rabbitmq: the malformed entries' checks ran to their end"
	"$PY" "$here/traces.py" rabbitmq "amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2F" --header-only ||
		echo "not ok - rabbitmq: the traces' checks ran to their end"
else
	echo "not ok - rabbitmq: the broker starts"
	tail -n 30 "$RABBIT_DIR/log/server.out" >&2
fi
