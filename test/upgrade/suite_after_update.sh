#!/usr/bin/env bash
# The whole pg_regress suite against databases created at each released
# version of idem (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 1.10, 1.11, 1.12) and brought to the current one with
# ALTER EXTENSION idem UPDATE: an updated installation behaves as a fresh
# one.  Uses the server of PGHOST/PGPORT/PGUSER (test/run_all.sh's); prints
# "ok - ..." / "not ok - ..." lines.
set -euo pipefail
IDEM_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
PG_BINDIR=$("$PG_CONFIG" --bindir)
PG_REGRESS=$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress
TESTS=$(sed -n 's/^REGRESS = //p' "$IDEM_ROOT/Makefile")
OUT=$(mktemp -d /tmp/idem-upgrade-suite.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

for version in 1.0 1.1 1.2 1.3 1.4 1.5 1.6 1.7 1.8 1.9 1.10 1.11 1.12; do
	db=idem_from_${version/./_}
	"$PG_BINDIR/dropdb" --if-exists "$db" 2>/dev/null
	"$PG_BINDIR/createdb" --template=template0 "$db"
	"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$db" \
		-c "CREATE EXTENSION pgcrypto" \
		-c "CREATE EXTENSION idem VERSION '$version'" \
		-c "ALTER EXTENSION idem UPDATE" >/dev/null
	current=$("$PG_BINDIR/psql" -X -At -d "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'idem'")
	mkdir -p "$OUT/$version"
	# shellcheck disable=SC2086
	if "$PG_REGRESS" --inputdir="$IDEM_ROOT" --outputdir="$OUT/$version" \
		--use-existing --dbname="$db" $TESTS >"$OUT/$version/log" 2>&1; then
		echo "ok - the pg_regress suite passes on a database created at $version and updated to $current"
	else
		echo "not ok - the pg_regress suite on a database created at $version and updated to $current"
		grep -E '\.\.\. ' "$OUT/$version/log" || cat "$OUT/$version/log"
		cat "$OUT/$version/regression.diffs" 2>/dev/null | head -80
	fi
	"$PG_BINDIR/dropdb" "$db"
done
