#!/usr/bin/env bash
# The outbox and the inbox through Apache Kafka: idem_pg.relay publishing
# with an idempotent producer, idem_pg.kafka's and idem-pg/kafka's
# consumers applying each message through the inbox, the offset committed
# after it (test/brokers/pipeline.py, dead_letters.py, fuzz_entries.py with
# "kafka"; kafka_checks.py).  The broker is Kafka 4.4.0 from Maven Central
# in KRaft combined mode (kafka_broker.sh), started here on loopback on
# private ports and stopped with the script; kafkajs 2.2.4 from npm.  One
# "ok - ..." / "not ok - ..." line per check.
#
#   bash test/brokers/kafka.sh
export CLIENTS_STAGE=brokers_kafka	# the name of this stage's checks (test/clients/common.sh)
source "$(dirname "$0")/../clients/common.sh"
here=$(cd "$(dirname "$0")" && pwd)
source "$here/kafka_broker.sh"

ensure_client_packages default-jdk-headless maven python3-build python3-setuptools python3-wheel python3-venv \
	python3-pip python3-psycopg nodejs npm
if ! kafka_java_ok; then
	echo "skip - brokers_kafka: the java here is older than 17 (Kafka 4's floor)"
	exit 0
fi
start_clients_server
"$PG_BINDIR/createdb" idem_brokers
"$PG_BINDIR/psql" -X -q -d idem_brokers -c "CREATE EXTENSION idem"
guard_idem_calls idem_brokers postgres
IDEM_WHEEL_EXTRAS=kafka,otel build_python_client confluent-kafka==2.16.2 "opentelemetry-sdk>=1.20,<2" || exit 0
if build_node_client && (cd "$NODE_APP" && npm install --no-audit --no-fund --silent kafkajs@2.2.4 >>"$IDEM_TMP/npm.log" 2>&1); then
	export NODE_APP
else
	echo "not ok - node: kafkajs installs"
fi
export PY IDEM_TMP
export PIPELINE_DSN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=idem_brokers"

log "fetching Kafka 4.4.0 from Maven Central (kafka/pom.xml)"
if ! kafka_install; then
	echo "not ok - kafka: Kafka 4.4.0 and its dependencies resolve from Maven Central and its storage formats"
	exit 0
fi
at_exit kafka_stop
started_at=$(date +%s%N)
if ! kafka_start; then
	echo "not ok - kafka: the broker starts"
	tail -n 40 "$KAFKA_DIR/log/server.log" "$KAFKA_DIR/log/server.out" >&2
	exit 0
fi
cold=$((($(date +%s%N) - started_at) / 1000000))
echo "ok - kafka: Kafka 4.4.0 (KRaft, broker and controller in one JVM, -Xmx512m) starts cold in $((cold / 1000)).$((cold % 1000 / 100)) s (at most 30 s)"
[ "$cold" -le 30000 ] || echo "not ok - kafka: the cold start took over 30 s"
url=kafka://127.0.0.1:$KAFKA_PORT
"$PY" "$here/pipeline.py" kafka "$url" bash "$here/kafka_broker.sh" restart ||
	echo "not ok - kafka: the pipeline ran to its end"
# the relays' producers may send 4 MB: the broker (1 MB) refuses the oversized message itself
"$PY" "$here/dead_letters.py" kafka "$url?message.max.bytes=4194304" bash "$here/kafka_broker.sh" restart ||
	echo "not ok - kafka: the dead-letter checks ran to their end"
"$PY" "$here/fuzz_entries.py" kafka "$url" ||
	echo "not ok - kafka: the malformed entries' checks ran to their end"
"$PY" "$here/kafka_checks.py" kafka "$url" ||
	echo "not ok - kafka: its own checks ran to their end"
"$PY" "$here/traces.py" kafka "$url" --header-only ||
	echo "not ok - kafka: the traces' checks ran to their end"
