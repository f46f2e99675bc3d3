#!/usr/bin/env bash
# Differential fuzz of idem_canonical_json and idem_request_hash against
# npm's canonicalize (an independent RFC 8785 implementation) and node's
# SHA-256: COUNT random documents (default 20,000) from SEED (default: the
# time, printed), in chunks of 100,000.  Then PAIRS pairs of requests
# (default 5,000) that differ only in their numbers' spellings (exponents,
# zeros, -0, integers beyond 2^53, subnormals, neighbours one ulp apart,
# values outside the double range): the bytes a request digest is of must
# be equal exactly when the fingerprints are, as a conforming parser says.
# Needs a server (PGHOST/PGPORT/PGUSER) with idem; installs node and the
# npm package if missing.  Prints "ok - ..." / "not ok - ..." lines.
#
#   bash test/fuzz/fuzz.sh [COUNT] [SEED] [PAIRS]
source "$(dirname "$0")/../lib.sh"

COUNT=${1:-20000}
SEED=${2:-$(date +%s)}
PAIRS=${3:-5000}
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

# the digest's fast path against the fingerprint, over respelled numbers
echo "# seed $SEED, $PAIRS pairs of spellings"
total=0 equal=0 violations=0 crashes=0 chunk=0
start=$(date +%s)
while [ "$total" -lt "$PAIRS" ]; do
	n=$((PAIRS - total < CHUNK ? PAIRS - total : CHUNK))
	node "$here/jcs_fuzz.mjs" pairs "$n" $((SEED + chunk)) >"$work/pairs.csv"
	if "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" >"$work/psql.log" 2>&1 <<SQL
CREATE TEMP TABLE pairs (i integer, a text, b text, expected text);
\copy pairs FROM '$work/pairs.csv' CSV
CREATE FUNCTION pg_temp.digest_input(jsonb) RETURNS bytea AS 'idem', 'idem_test_digest_input' LANGUAGE C STRICT;
CREATE FUNCTION pg_temp.same(a text, b text, OUT fingerprint text, OUT fast text) LANGUAGE plpgsql AS \$\$
BEGIN
    BEGIN
        fingerprint := CASE WHEN idem_request_hash(a::jsonb) = idem_request_hash(b::jsonb) THEN 'equal' ELSE 'differ' END;
    EXCEPTION WHEN others THEN
        fingerprint := 'error';
    END;
    BEGIN
        fast := CASE WHEN pg_temp.digest_input(a::jsonb) = pg_temp.digest_input(b::jsonb) THEN 'equal' ELSE 'differ' END;
    EXCEPTION WHEN others THEN
        fast := 'error';
    END;
END \$\$;
\copy (SELECT i, (pg_temp.same(a, b)).* FROM pairs ORDER BY i) TO '$work/pair_results.csv' CSV
SQL
	then
		read -r _ eq bad <<<"$(node "$here/jcs_fuzz.mjs" compare-pairs "$work/pairs.csv" "$work/pair_results.csv" $((SEED + chunk)))"
		equal=$((equal + eq))
		violations=$((violations + bad))
	else
		crashes=$((crashes + 1))
		cat "$work/psql.log" >&2
	fi
	total=$((total + n))
	chunk=$((chunk + 1))
done
echo "# $total pairs in $(($(date +%s) - start)) s: $equal of them one request, $violations violations, $crashes failed chunks"
check "$total pairs of spellings (seed $SEED): the digest input is equal exactly when the fingerprint is, as a conforming parser says" 0 "$violations"
check "the pairs hold requests that are one and requests that are not" true \
	"$([ "$equal" -gt 0 ] && [ "$equal" -lt "$total" ] && echo true || echo "false ($equal of $total)")"
check "no chunk of pairs failed (no crash)" 0 "$crashes"
"$PG_BINDIR/dropdb" "$DB"
