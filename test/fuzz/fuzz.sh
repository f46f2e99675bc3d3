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
# npm package if missing.  Prints "ok - ..." / "not ok - ..." lines.  With
# IDEM_EDITION=sql, against the SQL edition (managed/idem.sql), documents
# only: it has no request digest.
#
#   [IDEM_EDITION=sql] bash test/fuzz/fuzz.sh [COUNT] [SEED] [PAIRS]
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

if [ "${IDEM_EDITION:-c}" = sql ]; then
	DB=idem_fuzz_sql
	new_sql_edition_database "$DB"
	PAIRS=0
	what="the SQL edition's"
else
	new_idem_database "$DB"
	what=idem
fi

# chunks COUNT MODE COMPARE SQL: COUNT items in chunks of CHUNK, each
# written by "jcs_fuzz.mjs MODE" to $work/in.csv, run through psql with SQL
# (which writes $work/out.csv) and counted by "jcs_fuzz.mjs COMPARE", whose
# two figures are summed into found1 and found2; a psql run that fails is a
# crash.  Sets total, found1, found2, crashes and took (seconds).
chunks() {
	local count=$1 mode=$2 compare=$3 sql=$4 n a b chunk=0 start
	total=0 found1=0 found2=0 crashes=0
	start=$(date +%s)
	while [ "$total" -lt "$count" ]; do
		n=$((count - total < CHUNK ? count - total : CHUNK))
		node "$here/jcs_fuzz.mjs" "$mode" "$n" $((SEED + chunk)) >"$work/in.csv"
		if PGCLIENTENCODING=UTF8 "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$DB" >"$work/psql.log" 2>&1 <<<"$sql"; then
			read -r _ a b <<<"$(node "$here/jcs_fuzz.mjs" "$compare" "$work/in.csv" "$work/out.csv" $((SEED + chunk)))"
			found1=$((found1 + a))
			found2=$((found2 + b))
		else
			crashes=$((crashes + 1))
			cat "$work/psql.log" >&2
		fi
		total=$((total + n))
		chunk=$((chunk + 1))
	done
	took=$(($(date +%s) - start))
}

echo "# seed $SEED, $COUNT documents"
chunks "$COUNT" generate compare "$(cat <<SQL
CREATE TEMP TABLE docs (i integer, doc text, canonical text, hash text);
\copy docs FROM '$work/in.csv' CSV
CREATE FUNCTION pg_temp.try(doc text, OUT canonical text, OUT hash text) LANGUAGE plpgsql AS \$\$
BEGIN
    canonical := idem_canonical_json(doc::jsonb);
    hash := idem_request_hash(doc::jsonb);
EXCEPTION WHEN others THEN
    canonical := 'ERROR: ' || SQLSTATE || ' ' || SQLERRM;
END \$\$;
\copy (SELECT i, (pg_temp.try(doc)).* FROM docs ORDER BY i) TO '$work/out.csv' CSV
SQL
)"
echo "# $total documents in $took s: $found1 mismatches, $found2 errors, $crashes failed chunks"
check "$total random documents (seed $SEED): $what canonical text and hash equal canonicalize's" 0 "$found1"
check "no document raised an error in $what functions" 0 "$found2"
check "no chunk failed (no crash)" 0 "$crashes"

# the digest's fast path against the fingerprint, over respelled numbers
if [ "$PAIRS" -gt 0 ]; then
echo "# seed $SEED, $PAIRS pairs of spellings"
chunks "$PAIRS" pairs compare-pairs "$(cat <<SQL
CREATE TEMP TABLE pairs (i integer, a text, b text, expected text);
\copy pairs FROM '$work/in.csv' CSV
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
\copy (SELECT i, (pg_temp.same(a, b)).* FROM pairs ORDER BY i) TO '$work/out.csv' CSV
SQL
)"
echo "# $total pairs in $took s: $found1 of them one request, $found2 violations, $crashes failed chunks"
check "$total pairs of spellings (seed $SEED): the digest input is equal exactly when the fingerprint is, as a conforming parser says" 0 "$found2"
check "the pairs hold requests that are one and requests that are not" true \
	"$([ "$found1" -gt 0 ] && [ "$found1" -lt "$total" ] && echo true || echo "false ($found1 of $total)")"
check "no chunk of pairs failed (no crash)" 0 "$crashes"
fi
"$PG_BINDIR/dropdb" "$DB"
