#!/usr/bin/env bash
# Runs the pg_regress and isolation suites against a server running under
# valgrind memcheck, and reports every error whose stack passes through
# idem.so.  Slow (minutes); not part of test/run_all.sh.
#
#   bash test/valgrind.sh
source "$(dirname "$0")/lib.sh"

ensure_packages
command -v valgrind >/dev/null || { apt-get update -qq; apt-get install -y -qq valgrind >/dev/null; }
build_install

IDEM_TMP=$(mktemp -d /tmp/idem-valgrind.XXXXXX)
chmod 755 "$IDEM_TMP"
[ "$(id -u)" -eq 0 ] && chown postgres: "$IDEM_TMP"
as_pg_user "$PG_BINDIR/initdb" -D "$IDEM_TMP/data" -U postgres --auth=trust \
	--encoding=UTF8 --locale=C.UTF-8 --no-sync >/dev/null
cat >>"$IDEM_TMP/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$IDEM_TMP'
shared_preload_libraries = 'idem'
fsync = off
max_connections = 30
CONF
as_pg_user mkdir "$IDEM_TMP/vg"
as_pg_user bash -c "valgrind --quiet --trace-children=yes --leak-check=no \
	--num-callers=30 --log-file=$IDEM_TMP/vg/%p.log \
	$PG_BINDIR/postgres -D $IDEM_TMP/data >$IDEM_TMP/server.log 2>&1 &"
export PGHOST=$IDEM_TMP PGPORT=5432 PGUSER=postgres
trap stop_server EXIT
for _ in $(seq 1 120); do
	"$PG_BINDIR/pg_isready" -q && break
	sleep 1
done

make -C "$IDEM_ROOT" -s installcheck TAP_TESTS= || true
# idem's own code in the stack of an error report
hits=$(grep -l 'idem\.so' "$IDEM_TMP"/vg/*.log 2>/dev/null || true)
if [ -n "$hits" ]; then
	for f in $hits; do cat "$f"; done
	echo "valgrind: errors in idem's code (above)"
	exit 1
fi
echo "valgrind: no error with idem.so in its stack ($(ls "$IDEM_TMP"/vg | wc -l) processes traced)"
