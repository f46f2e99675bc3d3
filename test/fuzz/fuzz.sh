#!/usr/bin/env bash
# Differential fuzz of idem_canonical_json and idem_request_hash against
# npm's canonicalize (an independent RFC 8785 implementation) and node's
# SHA-256: COUNT random documents (default 20,000) from SEED (default: the
# time, printed), in chunks of 100,000.  Needs a server (PGHOST/PGPORT/
# PGUSER) with idem; installs node and the npm package if missing.
# Prints "ok - ..." / "not ok - ..." lines.
#
#   bash test/fuzz/fuzz.sh [COUNT] [SEED]
source "$(dirname "$0")/../lib.sh"

COUNT=${1:-20000}
SEED=${2:-$(date +%s)}
CHUNK=100000
DB=idem_fuzz
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d -t idem-fuzz.XXXXXX)
chmod 755 "$work"
at_exit 'rm -rf "$work"' 

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	log "installing nodejs and npm"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
if [ ! -d "$here/node_modules/canonicalize" ]; then
	(cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

new_idem_database "$DB"
echo "# seed $SEED, $COUNT documents"
total=0 mismatches=0 errors=0 crashes=0 chunk=0
start=$(date +%s)
while [ "$total" -lt "$COUNT" ]; do
	n=$((COUNT - total < CHUNK ? COUNT - total : CHUNK))
	node "$here/jcs_fuzz.mjs" generate "$n" $((SEED + chunk)) >"$work/docs.csv"
	if PGCLIENTENCODING=UTF8 "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" >"$work/psql.log" 2>&1 <<SQL
CREATE TEMP TABLE docs (i integer, doc text, canonical text, hash text);
\copy docs FROM '$work/docs.csv' CSV
CREATE FUNCTION pg_temp.try(doc text, OUT canonical text, OUT hash text) LANGUAGE plpgsql AS \$\$
BEGIN
    canonical := idem_canonical_json(doc::jsonb);
    hash := idem_request_hash(doc::jsonb);
EXCEPTION WHEN others THEN
    canonical := 'ERROR: ' || SQLSTATE || ' ' || SQLERRM;
END \$\$;
\copy (SELECT i, (pg_temp.try(doc)).* FROM docs ORDER BY i) TO '$work/results.csv' CSV
SQL
	then
		read -r _ bad err <<<"$(node "$here/jcs_fuzz.mjs" compare "$work/docs.csv" "$work/results.csv" $((SEED + chunk)))"
		mismatches=$((mismatches + bad))
		errors=$((errors + err))
	else
		crashes=$((crashes + 1))
		cat "$work/psql.log" >&2
	fi
	total=$((total + n))
	chunk=$((chunk + 1))
done
echo "# $total documents in $(($(date +%s) - start)) s: $mismatches mismatches, $errors errors, $crashes failed chunks"
check "$total random documents (seed $SEED): canonical text and hash equal canonicalize's" 0 "$mismatches"
check "no document raised an error in idem" 0 "$errors"
check "no chunk failed (no crash)" 0 "$crashes"
"$PG_BINDIR/dropdb" "$DB"
