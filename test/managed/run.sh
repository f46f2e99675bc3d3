#!/usr/bin/env bash
# The SQL edition (managed/idem.sql) on a server where idem's library is
# neither preloaded nor installed: a copy of the PostgreSQL tree without
# idem's files.  Its installer as an ordinary role; its pg_regress file
# (test/managed/sql); the C edition's isolation specs of the slice; the
# Python library's IK002 (libraries.py); the JCS fuzz; 20 clients on one
# key; one transaction of many claims; then the differential harness
# against the C edition of the server PGHOST/PGPORT names (preloaded): 300
# sequences, and two spoiled copies of the SQL edition that it must catch.
#
#   bash test/managed/run.sh [SEQUENCES] [SEED]
source "$(dirname "$0")/../lib.sh"

SEQUENCES=${1:-300}
SEED=${2:-$(date +%s)}
here=$(cd "$(dirname "$0")" && pwd)
c_host=$PGHOST c_port=$PGPORT

# ------------------------------------------------------------ the server
root=$(mktemp -d -t idem-managed.XXXXXX)
chmod 755 "$root"
at_exit 'rm -rf "$root"'
for dir in "$("$PG_CONFIG" --bindir)" "$("$PG_CONFIG" --pkglibdir)" "$("$PG_CONFIG" --sharedir)"; do
	mkdir -p "$root/tree$(dirname "$dir")"
	cp -al "$dir" "$root/tree$dir" 2>/dev/null || cp -a "$dir" "$root/tree$dir"
done
rm -rf "$root/tree$("$PG_CONFIG" --pkglibdir)"/idem.so "$root/tree$("$PG_CONFIG" --pkglibdir)"/bitcode/idem* \
	"$root/tree$("$PG_CONFIG" --sharedir)"/extension/idem[.-]*
bin=$root/tree$("$PG_CONFIG" --bindir)
[ "$(id -u)" -eq 0 ] && chown postgres: "$root"
as_pg_user "$bin/initdb" -D "$root/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 --no-sync >"$root/initdb.log" 2>&1
port=$(free_port)
cat >>"$root/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$root'
port = $port
fsync = off
max_connections = 60
log_min_messages = warning
CONF
as_pg_user "$bin/pg_ctl" -D "$root/data" -l "$root/server.log" -w -s start
at_exit "as_pg_user '$bin/pg_ctl' -D '$root/data' -m immediate -w -s stop"
export PGHOST=$root PGPORT=$port PGUSER=postgres
PG_BINDIR=$bin
sql() { "$bin/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

check "the SQL edition's server has no idem library, preloaded or installed" "||0" \
	"$(sql -d postgres -c "SELECT current_setting('shared_preload_libraries') || '|' || current_setting('session_preload_libraries') || '|' ||
	                          (SELECT count(*) FROM pg_available_extensions WHERE name = 'idem')")"

# ------------------------------------------------------------ the installer
sql -d postgres <<'SQL'
CREATE ROLE idem_owner NOLOGIN;
CREATE ROLE idem_installer LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE IN ROLE idem_owner;
CREATE ROLE intruder LOGIN;
CREATE DATABASE idem_managed;
SQL
install() { "$bin/psql" -X -q -v ON_ERROR_STOP=1 -U "$1" -d idem_managed -f "$IDEM_ROOT/managed/idem.sql" 2>&1; }
sql -d idem_managed -c "CREATE SCHEMA idem AUTHORIZATION intruder"
out=$(install idem_installer) || true
check "the installer refuses a schema another role owns (55000), naming it" true \
	"$(grep -q 'schema "idem" is owned by role intruder' <<<"$out" && echo true || echo "$out")"
sql -d idem_managed -c "DROP SCHEMA idem; CREATE SCHEMA idem AUTHORIZATION idem_owner; GRANT CREATE ON SCHEMA idem TO intruder"
out=$(install idem_installer) || true
check "the installer refuses a schema where another role has CREATE (55000), naming it" true \
	"$(grep -q 'roles other than the owner of schema "idem" can create objects in it: intruder' <<<"$out" && echo true || echo "$out")"
check "nothing was installed by the refused runs" 0 "$(sql -d idem_managed -c "SELECT count(*) FROM pg_class WHERE relnamespace = 'idem'::regnamespace")"
sql -d idem_managed -c "REVOKE CREATE ON SCHEMA idem FROM intruder"
out=$(install idem_installer) || true
check "an ordinary role that is a member of the schema's owner installs it" "" "$out"
check "every object of the SQL edition is owned by idem_owner" 0 \
	"$(sql -d idem_managed -c "SELECT count(*) FROM pg_class c WHERE c.relnamespace = 'idem'::regnamespace AND c.relowner <> 'idem_owner'::regrole
	                           UNION ALL SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'idem'::regnamespace AND p.proowner <> 'idem_owner'::regrole" | awk '{n += $1} END {print n}')"
check "every SECURITY DEFINER function sets search_path = pg_catalog, pg_temp" 0 \
	"$(sql -d idem_managed -c "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'idem'::regnamespace AND p.prosecdef
	                           AND NOT coalesce(p.proconfig, '{}') @> '{\"search_path=pg_catalog, pg_temp\"}'")"
check "no function of the SQL edition has an EXCEPTION block (no subtransaction per call)" 0 \
	"$(grep -ciE '^\s*EXCEPTION\s*$|^\s*EXCEPTION WHEN' "$IDEM_ROOT/managed/idem.sql" || true)"

# ------------------------------------------------------------ pg_regress
regress=$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/regress/pg_regress
out=$root/regress
mkdir -p "$out"
[ "$(id -u)" -eq 0 ] && chown postgres: "$out"
if "$regress" --use-existing --bindir="$bin" --host="$root" --port="$port" --user=postgres --dbname=idem_managed \
		--inputdir="$here" --outputdir="$out" managed >"$out/log" 2>&1; then
	echo "ok - pg_regress test/managed/sql/managed.sql against the SQL edition"
else
	echo "not ok - pg_regress test/managed/sql/managed.sql against the SQL edition"
	cat "$out/log" "$out/regression.diffs" 2>/dev/null | head -n 150
fi

# The C edition's pg_regress files of what the slice has, as written (the
# same reading of names and settings), with pgcrypto for their digest()
# checks; test/managed/expected_regress holds the outputs that differ.
REGRESS_SUBSET="jcs jcs_numbers order"
translate() { sed 's/idem_internal\./idem./g; s/idem\.wait_timeout/idem_sql.wait_timeout/g; s/idem\.ttl/idem_sql.ttl/g; s/idem\.failure_ttl/idem_sql.failure_ttl/g' "$@"; }
sub=$root/subset
mkdir -p "$sub/sql" "$sub/expected"
for f in $REGRESS_SUBSET; do
	translate "$IDEM_ROOT/sql/$f.sql" >"$sub/sql/$f.sql"
	if [ -f "$here/expected_regress/$f.out" ]; then
		cp "$here/expected_regress/$f.out" "$sub/expected/"
	else
		translate "$IDEM_ROOT/expected/$f.out" >"$sub/expected/$f.out"
	fi
done
new_sql_edition_database idem_subset
sql -d idem_subset -c "CREATE EXTENSION pgcrypto SCHEMA public"
# shellcheck disable=SC2086
"$regress" --use-existing --bindir="$bin" --host="$root" --port="$port" --user=postgres --dbname=idem_subset \
	--inputdir="$sub" --outputdir="$sub/out" $REGRESS_SUBSET >"$sub/log" 2>&1 || true
grep -E '\.\.\. ' "$sub/log" | sed 's/^/# /'
check "the C edition's pg_regress files $REGRESS_SUBSET pass against the SQL edition" 0 \
	"$(grep -cE '\.\.\. FAILED|\.\.\. failed' "$sub/log" || true)"
[ -s "$sub/out/regression.diffs" ] && head -n 100 "$sub/out/regression.diffs"

# ------------------------------------------------------------ isolation
# The C edition's specs of what the slice has, run against the SQL edition
# as written (idem_internal. read as idem., idem.wait_timeout as
# idem_sql.wait_timeout), with the C edition's expected output but for the
# files in test/managed/expected_iso, whose differences docs/managed.md
# lists.
SPECS="api-begin-race api-expired-cleanup bypass-writer claim-race-2 cleanup-skip-locked
	expired-race in-flight-timeout key-deadlock mismatch-race outbox-ack-emit-race outbox-commit-order
	outbox-cross-keys outbox-fetch-race outbox-lease-lapse refuse-cleanup-race repeatable-read savepoint"
iso=$root/iso
mkdir -p "$iso/specs" "$iso/expected"
for spec in $SPECS; do
	translate "$IDEM_ROOT/test/specs/$spec.spec" >"$iso/specs/$spec.spec"
	if [ -f "$here/expected_iso/$spec.out" ]; then
		cp "$here/expected_iso/$spec.out" "$iso/expected/"
	else
		translate "$IDEM_ROOT/test/expected/$spec.out" >"$iso/expected/$spec.out"
	fi
done
new_sql_edition_database idem_iso
# shellcheck disable=SC2086
"$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" --use-existing --bindir="$bin" \
	--host="$root" --port="$port" --user=postgres --dbname=idem_iso \
	--inputdir="$iso" --outputdir="$iso/out" $SPECS >"$iso/log" 2>&1 || true
grep -E '\.\.\. ' "$iso/log" | sed 's/^/# /'
check "$(echo $SPECS | wc -w) isolation specs of the C edition pass against the SQL edition" 0 \
	"$(grep -cE '\.\.\. FAILED|\.\.\. failed' "$iso/log" || true)"
[ -s "$iso/out/regression.diffs" ] && head -n 100 "$iso/out/regression.diffs"

# ------------------------------------------------------------ the libraries
PYTHONPATH=$IDEM_ROOT/clients/python/src /usr/bin/python3 "$here/libraries.py" \
	"host=$root port=$port user=postgres dbname=idem_managed"

# ------------------------------------------------------------ the same load
IDEM_EDITION=sql bash "$IDEM_ROOT/test/fuzz/fuzz.sh" 5000 "$SEED"
IDEM_EDITION=sql bash "$IDEM_ROOT/test/load/same_key.sh"

# One transaction of many claims (begin and finish), orders and keyed
# emits, with the default lock settings: the locks it holds before COMMIT
# are those of ten calls of each kind; the COMMIT's time (its one IK005
# check, its one outbox flush) is printed.
BIG=${IDEM_BIG_CALLS:-100000}
big() {	# big CLAIMS OTHERS TAG
	sql -d idem_managed <<SQL
\\timing on
BEGIN;
SELECT count(*) FROM generate_series(1, $1) g,
       LATERAL idem.idem_begin(1, 'BIG_PAIR', '$3-pair-' || lpad(g::text, 12, '0'), '{}') b,
       LATERAL idem.idem_finish(1, 'BIG_PAIR', '$3-pair-' || lpad(g::text, 12, '0'), 200, '{}') f
 WHERE NOT b.replayed;
SELECT count(*) FROM generate_series(1, $2) g,
       LATERAL idem.idem_create_order(1, '$3-order-' || lpad(g::text, 12, '0'), 5, 1) o WHERE NOT o.replayed;
SELECT count(idem.idem_outbox_emit('$3', jsonb_build_object('n', g), 'key-' || g)) FROM generate_series(1, $2) g;
SELECT 'locks ' || count(*) FROM pg_locks WHERE pid = pg_backend_pid();
COMMIT;
SQL
}
big 10 10 small >"$root/small.out" 2>&1
big "$BIG" $((BIG / 10)) big >"$root/big.out" 2>&1
sed 's/^/# /' "$root/big.out"
check "one transaction of $BIG claims, $((BIG / 10)) orders and $((BIG / 10)) keyed emits commits" \
	"$BIG $((BIG / 10)) $((BIG / 10))" \
	"$(sql -d idem_managed -c "SELECT (SELECT count(*) FROM idem.idempotency_record WHERE idempotency_key LIKE 'big-pair-%' AND status = 'SUCCEEDED')
	                               || ' ' || (SELECT count(*) FROM idem.idempotency_record WHERE idempotency_key LIKE 'big-order-%')
	                               || ' ' || (SELECT count(*) FROM idem.idem_outbox WHERE topic = 'big' AND ready AND commit_seq > 0)")"
check "it held as many locks before COMMIT as a transaction of ten calls of each kind" \
	"$(grep '^locks ' "$root/small.out")" "$(grep '^locks ' "$root/big.out")"

# ------------------------------------------------------------ the harness
new_c_database() {
	PGHOST=$c_host PGPORT=$c_port "$PG_BINDIR/dropdb" --if-exists "$1" 2>/dev/null
	PGHOST=$c_host PGPORT=$c_port "$PG_BINDIR/createdb" "$1"
	# its hundreds of operation names would fill the server's idem_stats,
	# which later stages read: not counted
	PGHOST=$c_host PGPORT=$c_port "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -d "$1" \
		-c "CREATE SCHEMA idem; CREATE EXTENSION idem SCHEMA idem" -c "ALTER DATABASE $1 SET idem.stats_track = off"
}
harness() {	# harness SCRIPT SEQUENCES [env...]
	local script=$1 n=$2
	shift 2
	new_c_database idem_diff_c
	new_sql_edition_database idem_diff_sql "$script"
	env "$@" /usr/bin/python3 "$here/differential.py" \
		"host=$c_host port=$c_port user=postgres dbname=idem_diff_c" \
		"host=$root port=$port user=postgres dbname=idem_diff_sql" "$n" "$SEED"
}
harness "$IDEM_ROOT/managed/idem.sql" "$SEQUENCES"

# spoiled copies: a replay where IK001 is due; no IK005 at COMMIT
spoil() {	# spoil NAME FROM TO
	/usr/bin/python3 - "$IDEM_ROOT/managed/idem.sql" "$root/spoiled-$1.sql" "$2" "$3" <<'PY'
import sys
src, dst, old, new = sys.argv[1:5]
text = open(src).read()
assert old in text, old
open(dst, "w").write(text.replace(old, new.replace("\\n", "\n")))
PY
	harness "$root/spoiled-$1.sql" 60 IDEM_DIFF_EXPECT=differences IDEM_DIFF_SPOIL="$1"
}
spoil "a replay where IK001 is due" \
	"IF rec.request_hash::text OPERATOR(pg_catalog.<>) fp THEN" "IF false THEN"
spoil "no IK005 at COMMIT" \
	"CREATE CONSTRAINT TRIGGER idem_check_claims AFTER INSERT" "CREATE CONSTRAINT TRIGGER idem_check_claims AFTER DELETE"

PGHOST=$c_host PGPORT=$c_port "$PG_BINDIR/dropdb" idem_diff_c
