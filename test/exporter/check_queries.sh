#!/usr/bin/env bash
# The postgres_exporter queries (contrib/postgres_exporter/idem.yaml) run
# against a database with idem as a pg_monitor role, and return every
# column the file declares as a metric or label.  Needs a server
# (PGHOST/PGPORT/PGUSER) with idem.  Prints "ok - ..." / "not ok - ..." lines.
source "$(dirname "$0")/../lib.sh"

DB=idem_exporter
new_idem_database "$DB"
"$PG_BINDIR/psql" -X -q -d "$DB" -c "SET client_min_messages = warning" -c "DROP ROLE IF EXISTS idem_exporter_probe" \
	-c "CREATE ROLE idem_exporter_probe LOGIN IN ROLE pg_monitor" \
	-c "SELECT idem_outbox_emit('t', '{}')" -c "SELECT idem_consume('c', 'm')" >/dev/null 2>&1
/usr/bin/python3 - "$IDEM_ROOT/contrib/postgres_exporter/idem.yaml" "$DB" "$PG_BINDIR/psql" <<'PY'
import re, subprocess, sys
path, db, psql = sys.argv[1:]
text = open(path).read()
blocks = re.split(r'^(?=\w+:\s*$)', text, flags=re.M)
n = 0
for block in blocks:
    m = re.match(r'^(\w+):\s*$', block, flags=re.M)
    if not m:
        continue
    name = m.group(1)
    query = re.search(r'^\s+query:\s*"(.*)"\s*$', block, flags=re.M).group(1)
    declared = re.findall(r'^\s+- (\w+):\s*$', block, flags=re.M)
    out = subprocess.run([psql, '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', db, '-U', 'idem_exporter_probe',
                          '-c', 'COPY (' + query + ') TO STDOUT WITH (FORMAT csv, HEADER)'],
                         capture_output=True, text=True)
    n += 1
    if out.returncode != 0:
        print('not ok - query %s runs as a pg_monitor role (%s)' % (name, out.stderr.strip()))
        continue
    columns = out.stdout.splitlines()[0].split(',')
    missing = [c for c in declared if c not in columns]
    if missing:
        print('not ok - query %s returns its metrics (missing %s)' % (name, ', '.join(missing)))
    else:
        print('ok - query %s runs as a pg_monitor role and returns its %d metrics and labels' % (name, len(declared)))
if n < 2:
    print('not ok - the file holds the queries (found %d)' % n)
PY
"$PG_BINDIR/dropdb" "$DB"
"$PG_BINDIR/psql" -X -q -d postgres -c "DROP ROLE idem_exporter_probe"
