# shellcheck shell=bash
# test/brokers/kafka_broker.sh: an Apache Kafka broker of the test's own:
# Kafka 4.4.0 from Maven Central (kafka/pom.xml, resolved by Maven and
# copied into the run's directory), KRaft combined mode (broker and
# controller, one voter, formatted --standalone), on Java 17 with
# -Xmx512m, on free loopback ports, its data and logs under $IDEM_TMP.
# Sourced by kafka.sh (kafka_install, kafka_start, kafka_stop); run as
# "bash kafka_broker.sh restart" by the tests to restart that broker.

KAFKA_DIR=${KAFKA_DIR:-}

# the java of the machine, major 17 or newer (Kafka 4's floor); else false
kafka_java_ok() {
	local v
	v=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
	[ -n "$v" ] && [ "${v%%.*}" -ge 17 ]
}

# kafka_install: the broker's jars into $KAFKA_DIR/libs (Maven's local
# repository caches them), the configuration, the storage formatted
kafka_install() {
	KAFKA_DIR=$(mktemp -d "$IDEM_TMP/kafka.XXXXXX")
	KAFKA_PORT=$(free_port)
	KAFKA_CONTROLLER_PORT=$(free_port)
	export KAFKA_DIR KAFKA_PORT KAFKA_CONTROLLER_PORT
	mkdir -p "$KAFKA_DIR/libs" "$KAFKA_DIR/data" "$KAFKA_DIR/log"
	if ! mvn -B -q -ntp -f "$(dirname "${BASH_SOURCE[0]}")/kafka/pom.xml" dependency:copy-dependencies \
		-DoutputDirectory="$KAFKA_DIR/libs" >"$KAFKA_DIR/log/mvn.log" 2>&1; then
		tail -n 30 "$KAFKA_DIR/log/mvn.log" >&2
		return 1
	fi
	cat >"$KAFKA_DIR/log4j2.properties" <<-PROPS
		appender.file.type = File
		appender.file.name = file
		appender.file.fileName = $KAFKA_DIR/log/server.log
		appender.file.layout.type = PatternLayout
		appender.file.layout.pattern = [%d] %p %m (%c)%n
		rootLogger.level = INFO
		rootLogger.appenderRef.file.ref = file
	PROPS
	# one node, every replication factor and ISR 1; consumers rejoin at once
	# (no initial rebalance delay) and may have 6 s sessions; messages over
	# 1 MB refused (test/brokers/dead_letters.py's oversized one)
	cat >"$KAFKA_DIR/server.properties" <<-PROPS
		process.roles=broker,controller
		node.id=1
		controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
		listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
		advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
		controller.listener.names=CONTROLLER
		listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
		inter.broker.listener.name=PLAINTEXT
		log.dirs=$KAFKA_DIR/data
		num.partitions=1
		offsets.topic.replication.factor=1
		offsets.topic.num.partitions=1
		transaction.state.log.replication.factor=1
		transaction.state.log.min.isr=1
		share.coordinator.state.topic.replication.factor=1
		share.coordinator.state.topic.min.isr=1
		min.insync.replicas=1
		default.replication.factor=1
		group.initial.rebalance.delay.ms=0
		group.min.session.timeout.ms=6000
		message.max.bytes=1048576
		auto.create.topics.enable=false
	PROPS
	(kafka_java kafka.tools.StorageTool format --standalone -t "$(/usr/bin/python3 -c \
		'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')" \
		-c "$KAFKA_DIR/server.properties") >>"$KAFKA_DIR/log/format.log" 2>&1
}

# kafka_java CLASS ARG...: in a subshell, the subshell becomes that JVM
kafka_java() {
	exec java -Xmx512m -Xms256m -Djava.io.tmpdir="$KAFKA_DIR" \
		-Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" -cp "$KAFKA_DIR/libs/*" "$@"
}

# kafka_start: the broker started; returns once it says it started (its
# server.log's "Kafka Server started" after this start), false after IDEM_WAIT s
kafka_start() {
	local seen=0
	[ -f "$KAFKA_DIR/log/server.log" ] && seen=$(grep -c 'Kafka Server started' "$KAFKA_DIR/log/server.log")
	(kafka_java kafka.Kafka "$KAFKA_DIR/server.properties") >>"$KAFKA_DIR/log/server.out" 2>&1 &
	echo $! >"$KAFKA_DIR/kafka.pid"
	kafka_started_after "$seen"
}
kafka_started_after() { until_ok kafka_starts_seen_over "$1"; }
kafka_starts_seen_over() { [ "$(grep -c 'Kafka Server started' "$KAFKA_DIR/log/server.log")" -gt "$1" ]; }

# kafka_stop: SIGTERM (a controlled shutdown), awaited; SIGKILL after IDEM_WAIT s
kafka_stop() {
	[ -f "$KAFKA_DIR/kafka.pid" ] || return 0
	local pid
	pid=$(cat "$KAFKA_DIR/kafka.pid")
	kill "$pid" 2>/dev/null || true
	until_ok test ! -e "/proc/$pid" || kill -9 "$pid" 2>/dev/null
	rm -f "$KAFKA_DIR/kafka.pid"
}

if [ "${1:-}" = "restart" ]; then
	IDEM_WAIT=${IDEM_WAIT:-180}
	until_ok() {
		local deadline=$((SECONDS + IDEM_WAIT))
		while [ "$SECONDS" -lt "$deadline" ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
		return 1
	}
	kafka_stop
	# dead_letters.py: say the broker is down, and keep it down 6 s (longer than the relays' lease)
	if [ -n "${IDEM_BROKER_DOWN_FLAG:-}" ]; then
		touch "$IDEM_BROKER_DOWN_FLAG"
		sleep 6
	fi
	kafka_start
fi
