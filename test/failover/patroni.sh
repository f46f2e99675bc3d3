#!/usr/bin/env bash
# idem across a Patroni failover (issue 27): etcd and two PostgreSQL nodes
# under Patroni on loopback, idem preloaded on both, 20 libpq clients
# (psycopg) through a multi-host connection string with
# target_session_attrs=read-write.  Three rounds, each a failover in the
# middle of the load: synchronous replication with the primary's
# postmaster killed (kill -9), synchronous with its Patroni stopped, and
# asynchronous with the postmaster killed.  The checks are failover.py's.
#
# Prints one "ok - ..." or "not ok - ..." line per check.
#
#   bash test/failover/patroni.sh        (test/run_all.sh runs it)
source "$(dirname "$0")/../lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

ensure_packages
ensure_service_packages patroni etcd-server python3-psycopg
[ -n "${IDEM_PG_ORIGIN:-}" ] || build_install	# run alone: a build of its own

FO_DIR=$(mktemp -d -t idem-failover.XXXXXX)
chmod 755 "$FO_DIR"
chown postgres: "$FO_DIR"
export FO_DIR PG_BINDIR
cleanup() {
	# every process this stage started: Patroni, the servers, etcd
	pkill -KILL -f "patroni $FO_DIR/" 2>/dev/null || true
	for d in "$FO_DIR"/node*/data; do
		[ -f "$d/postmaster.pid" ] && kill -KILL "$(head -1 "$d/postmaster.pid")" 2>/dev/null
	done
	pkill -KILL -f "etcd --name idem-failover --data-dir $FO_DIR/" 2>/dev/null || true
	sleep 0.5
	[ -n "${IDEM_KEEP_TMP:-}" ] || rm -rf "$FO_DIR"
}
at_exit cleanup
/usr/bin/python3 "$here/failover.py"
