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

# a cleanup round every second, so the worker runs under valgrind too; in the
# postgres database only, where it does not race cleanup.sql's counts
init_server "max_connections = 30" "idem.cleanup_interval = 1" "idem.cleanup_databases = 'postgres'"
as_pg_user mkdir "$IDEM_TMP/vg"
as_pg_user bash -c "valgrind --quiet --trace-children=yes --leak-check=no \
	--num-callers=30 --log-file=$IDEM_TMP/vg/%p.log \
	$PG_BINDIR/postgres -D $IDEM_TMP/data >$IDEM_TMP/server.log 2>&1 &"
for _ in $(seq 1 120); do
	"$PG_BINDIR/pg_isready" -q && break
	sleep 1
done

psql -X -q -d postgres -c "CREATE EXTENSION idem" -c "
	INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
	SELECT 1, 'vg', 'vg-' || g, repeat('0', 64), 'SUCCEEDED', now() - interval '1 s'
	FROM generate_series(1, 5000) g"
make -C "$IDEM_ROOT" -s installcheck TAP_TESTS= || true
left=$(psql -X -At -d postgres -c "SELECT count(*) FROM idem_internal.idempotency_record")
deleted=$(psql -X -At -d postgres -c "SELECT total_deleted FROM idem_cleanup_status() WHERE datname = 'postgres'")
echo "valgrind: the worker deleted ${deleted:-nothing} of 5000 records in postgres ($left left)"
# idem's own code in the stack of an error report
hits=$(grep -l 'idem\.so' "$IDEM_TMP"/vg/*.log 2>/dev/null || true)
if [ -n "$hits" ]; then
	for f in $hits; do cat "$f"; done
	echo "valgrind: errors in idem's code (above)"
	exit 1
fi
echo "valgrind: no error with idem.so in its stack ($(ls "$IDEM_TMP"/vg | wc -l) processes traced)"
