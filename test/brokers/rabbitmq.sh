# shellcheck shell=bash
# test/brokers/rabbitmq.sh: a RabbitMQ node of the test's own (Debian's
# rabbitmq-server): its node name, AMQP and distribution ports, epmd port,
# data directory and cookie under $IDEM_TMP, nothing of the machine's.
# Sourced by run.sh (rabbit_start, rabbit_stop); run as
# "bash rabbitmq.sh restart" by the pipeline to restart that node.
#
# Installing the package must not start the machine's service: a
# policy-rc.d that refuses service starts is in place while apt runs.

# a directory of its own: the rabbitmq user cannot enter $IDEM_TMP (mode 700)
RABBIT_DIR=${RABBIT_DIR:-}
rabbit_env() {
	export RABBITMQ_NODENAME=idem-test@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	export RABBITMQ_NODE_PORT=$RABBIT_PORT RABBITMQ_DIST_PORT=$RABBIT_DIST_PORT ERL_EPMD_PORT=$RABBIT_EPMD_PORT
	export RABBITMQ_MNESIA_BASE=$RABBIT_DIR/mnesia RABBITMQ_LOG_BASE=$RABBIT_DIR/log
	export RABBITMQ_CONFIG_FILE=$RABBIT_DIR/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE=$RABBIT_DIR/enabled_plugins
	export RABBITMQ_PID_FILE=$RABBIT_DIR/rabbit.pid HOME=$RABBIT_DIR
}
# commands as the rabbitmq user, with the node's environment
as_rabbit() {
	rabbit_env
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u rabbitmq -- env RABBITMQ_NODENAME="$RABBITMQ_NODENAME" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
			RABBITMQ_NODE_PORT="$RABBIT_PORT" RABBITMQ_DIST_PORT="$RABBIT_DIST_PORT" ERL_EPMD_PORT="$RABBIT_EPMD_PORT" \
			RABBITMQ_MNESIA_BASE="$RABBITMQ_MNESIA_BASE" RABBITMQ_LOG_BASE="$RABBITMQ_LOG_BASE" \
			RABBITMQ_CONFIG_FILE="$RABBITMQ_CONFIG_FILE" RABBITMQ_ENABLED_PLUGINS_FILE="$RABBITMQ_ENABLED_PLUGINS_FILE" \
			RABBITMQ_PID_FILE="$RABBITMQ_PID_FILE" HOME="$RABBIT_DIR" "$@"
	else
		"$@"
	fi
}

rabbit_install() {
	ensure_service_packages rabbitmq-server
}

rabbit_start() {
	rabbit_install || return 1
	if [ -z "${RABBIT_PORT:-}" ]; then
		RABBIT_DIR=$(mktemp -d -t idem-rabbitmq.XXXXXX)
		chmod 755 "$RABBIT_DIR"
		RABBIT_PORT=$(free_port)
		RABBIT_DIST_PORT=$(free_port)
		RABBIT_EPMD_PORT=$(free_port)
		export RABBIT_PORT RABBIT_DIST_PORT RABBIT_EPMD_PORT RABBIT_DIR
		mkdir -p "$RABBIT_DIR/mnesia" "$RABBIT_DIR/log"
		# messages over 1 MB refused (406): test/brokers/dead_letters.py's oversized one
		printf 'loopback_users.guest = true\nlisteners.tcp.default = 127.0.0.1:%s\nmax_message_size = 1048576\n' \
			"$RABBIT_PORT" >"$RABBIT_DIR/rabbitmq.conf"
		echo '[].' >"$RABBIT_DIR/enabled_plugins"
		head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RABBIT_DIR/.erlang.cookie"
		chmod 400 "$RABBIT_DIR/.erlang.cookie"
		[ "$(id -u)" -eq 0 ] && chown -R rabbitmq: "$RABBIT_DIR"
	fi
	(as_rabbit /usr/lib/rabbitmq/bin/rabbitmq-server >>"$RABBIT_DIR/log/server.out" 2>&1 &)
	# await_startup fails at once while the node is not up yet: ask again
	local _
	for _ in $(seq 1 120); do
		as_rabbit timeout 30 /usr/lib/rabbitmq/bin/rabbitmqctl -q await_startup >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	return 1
}

rabbit_stop() {
	[ -n "${RABBIT_PORT:-}" ] || return 0
	as_rabbit timeout 60 /usr/lib/rabbitmq/bin/rabbitmqctl -q stop >/dev/null 2>&1 || true
	# the epmd this node started: the one whose environment has its port
	local pid
	for pid in $(pgrep -u rabbitmq -x epmd 2>/dev/null); do
		tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "ERL_EPMD_PORT=$RABBIT_EPMD_PORT" && kill "$pid" 2>/dev/null
	done
	[ -n "${IDEM_KEEP_TMP:-}" ] || rm -rf "$RABBIT_DIR"
	RABBIT_PORT=
	return 0
}

if [ "${1:-}" = "restart" ]; then
	free_port() { /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../ports.py"; }
	log() { echo "==> $*" >&2; }
	ensure_service_packages() { :; }	# installed by the run that started the node
	# the node stopped and started again: a broker restart
	as_rabbit timeout 60 /usr/lib/rabbitmq/bin/rabbitmqctl -q stop >/dev/null 2>&1
	# dead_letters.py: say the node is down, and keep it down 6 s (longer than the relays' lease)
	if [ -n "${IDEM_BROKER_DOWN_FLAG:-}" ]; then
		touch "$IDEM_BROKER_DOWN_FLAG"
		sleep 6
	fi
	rabbit_start
fi
