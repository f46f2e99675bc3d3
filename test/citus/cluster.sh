# shellcheck shell=bash
# test/citus/cluster.sh: a Citus cluster on loopback for the Citus stage and
# its benchmark, sourced after test/lib.sh.
#
# citus_cluster_start starts a coordinator and two workers, each its own
# throwaway PostgreSQL 15 (citus and idem preloaded, TCP on 127.0.0.1 only,
# free ports), creates database "idem" with citus and idem on every node
# (Citus propagates CREATE EXTENSION idem), adds the workers and runs
# idem_distribute().  Sets CITUS_TMP, COORD_PORT, WORKER1_PORT,
# WORKER2_PORT; citus_cluster_stop stops the three servers by their data
# directories.

# Is Citus installed for the server under test ($PG_CONFIG)?  Returns 0 if
# so; otherwise prints why and returns 1.  The project never builds Citus:
# install it from Citus's own packages (postgresql-15-citus-13.2 from the
# Citus apt repository, as Citus's documentation describes), or build it from
# its source as its README says, for the same PostgreSQL.
citus_installed() {
	local sharedir pkglibdir
	sharedir=$("$PG_CONFIG" --sharedir)
	pkglibdir=$("$PG_CONFIG" --pkglibdir)
	if [ ! -f "$sharedir/extension/citus.control" ]; then
		echo "no citus.control in $sharedir/extension"
		return 1
	fi
	if [ ! -f "$pkglibdir/citus.so" ]; then
		echo "citus.control is there but no citus.so in $pkglibdir"
		return 1
	fi
	return 0
}

# The line a skipped Citus stage prints: why, and how to get Citus.
citus_skip_line() {
	echo "skip - citus: $1: Citus is not installed for $("$PG_CONFIG" --version);" \
		"install it from Citus's own packages (postgresql-$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')-citus-13.2" \
		"from the Citus apt repository) or from its source, then run bash test/citus/run.sh"
}

# psql on node port $1, database idem, as postgres, quiet, unaligned.
cq() {
	local port=$1
	shift
	"$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d idem "$@"
}

citus_node_init() {	# citus_node_init NAME PORT
	local dir=$CITUS_TMP/$1
	as_pg_user "$PG_BINDIR/initdb" -D "$dir" -U postgres --auth=trust --encoding=UTF8 \
		--locale=C.UTF-8 --no-sync >"$CITUS_TMP/initdb-$1.log" 2>&1
	{
		echo "listen_addresses = '127.0.0.1'"
		echo "port = $2"
		echo "unix_socket_directories = '$CITUS_TMP'"
		echo "shared_preload_libraries = 'citus,idem'"
		echo "max_connections = 200"
		echo "fsync = off"
		echo "log_min_messages = warning"
		echo "citus.node_conninfo = 'sslmode=disable'"
		echo "citus.log_remote_commands = off"
		echo "idem.cleanup_interval = ${CITUS_CLEANUP_INTERVAL:-0}"
		echo "idem.cleanup_databases = 'idem'"
		echo "idem.wait_timeout = ${CITUS_WAIT_TIMEOUT:-5s}"
	} >>"$dir/postgresql.conf"
}

citus_node_start() {	# citus_node_start NAME
	as_pg_user "$PG_BINDIR/pg_ctl" -D "$CITUS_TMP/$1" -l "$CITUS_TMP/$1.log" -w -s start
}

citus_cluster_start() {
	CITUS_TMP=$(mktemp -d -t idem-citus.XXXXXX)
	chmod 755 "$CITUS_TMP"
	[ "$(id -u)" -eq 0 ] && chown postgres: "$CITUS_TMP"
	COORD_PORT=$(free_port)
	WORKER1_PORT=$(free_port)
	WORKER2_PORT=$(free_port)
	if [ -z "${CITUS_STOP_AT_EXIT:-}" ]; then
		at_exit citus_cluster_stop
		CITUS_STOP_AT_EXIT=1
	fi
	local node port
	for node in coord:$COORD_PORT worker1:$WORKER1_PORT worker2:$WORKER2_PORT; do
		citus_node_init "${node%%:*}" "${node##*:}"
		citus_node_start "${node%%:*}"
	done
	for port in $COORD_PORT $WORKER1_PORT $WORKER2_PORT; do
		"$PG_BINDIR/createdb" -h 127.0.0.1 -p "$port" -U postgres idem
		cq "$port" -c "CREATE EXTENSION citus"
	done
	cq "$COORD_PORT" <<-SQL >/dev/null
		SELECT citus_set_coordinator_host('127.0.0.1', $COORD_PORT);
		SELECT citus_add_node('127.0.0.1', $WORKER1_PORT);
		SELECT citus_add_node('127.0.0.1', $WORKER2_PORT);
		CREATE EXTENSION idem${CITUS_IDEM_VERSION:+ VERSION '$CITUS_IDEM_VERSION'};
		CREATE EXTENSION pgcrypto;
		SELECT idem_distribute();
	SQL
}

citus_cluster_stop() {
	local node
	[ -n "${CITUS_TMP:-}" ] || return 0
	for node in coord worker1 worker2; do
		if [ -f "$CITUS_TMP/$node/postmaster.pid" ]; then
			as_pg_user "$PG_BINDIR/pg_ctl" -D "$CITUS_TMP/$node" -m fast -w -s stop || true
		fi
	done
	[ -n "${IDEM_KEEP_TMP:-}" ] || rm -rf "$CITUS_TMP"
}
