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
listen_addresses = '127.0.0.1'
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
# C edition's files NAMES of EXT from SRC (expected outputs from EXPECTED),
# translated into OUT/INDIR and OUT/expected, but the outputs OVERLAY holds
copy_subset() {	# copy_subset OUT INDIR EXT SRC EXPECTED OVERLAY NAMES...
	local out=$1 indir=$2 ext=$3 src=$4 expected=$5 overlay=$6 f
	shift 6
	mkdir -p "$out/$indir" "$out/expected"
	for f in "$@"; do
		translate "$src/$f.$ext" >"$out/$indir/$f.$ext"
		if [ -f "$overlay/$f.out" ]; then
			cp "$overlay/$f.out" "$out/expected/"
		else
			translate "$expected/$f.out" >"$out/expected/$f.out"
		fi
	done
}
# each file's line of the run in OUT, one check named WHAT, the diffs
subset_result() {	# subset_result OUT WHAT
	grep -E '\.\.\. ' "$1/log" | sed 's/^/# /'
	check "$2" 0 "$(grep -cE '\.\.\. FAILED|\.\.\. failed' "$1/log" || true)"
	if [ -s "$1/out/regression.diffs" ]; then head -n 100 "$1/out/regression.diffs"; fi
}
sub=$root/subset
# shellcheck disable=SC2086
copy_subset "$sub" sql sql "$IDEM_ROOT/sql" "$IDEM_ROOT/expected" "$here/expected_regress" $REGRESS_SUBSET
new_sql_edition_database idem_subset
sql -d idem_subset -c "CREATE EXTENSION pgcrypto SCHEMA public"
# shellcheck disable=SC2086
"$regress" --use-existing --bindir="$bin" --host="$root" --port="$port" --user=postgres --dbname=idem_subset \
	--inputdir="$sub" --outputdir="$sub/out" $REGRESS_SUBSET >"$sub/log" 2>&1 || true
subset_result "$sub" "the C edition's pg_regress files $REGRESS_SUBSET pass against the SQL edition"

# ------------------------------------------------------------ isolation
# The C edition's specs of what the slice has, run against the SQL edition
# as written (idem_internal. read as idem., idem.wait_timeout as
# idem_sql.wait_timeout), with the C edition's expected output but for the
# files in test/managed/expected_iso, whose differences docs/managed.md
# lists.
SPECS="api-begin-race api-expired-cleanup bypass-writer claim-race-2 cleanup-skip-locked
	expired-race expired-wait expired-archive-race in-flight-timeout key-deadlock mismatch-race outbox-ack-emit-race outbox-commit-order
	outbox-cross-keys outbox-fetch-race outbox-lease-lapse refuse-cleanup-race repeatable-read savepoint"
iso=$root/iso
# shellcheck disable=SC2086
copy_subset "$iso" specs spec "$IDEM_ROOT/test/specs" "$IDEM_ROOT/test/expected" "$here/expected_iso" $SPECS
new_sql_edition_database idem_iso
# shellcheck disable=SC2086
"$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress" --use-existing --bindir="$bin" \
	--host="$root" --port="$port" --user=postgres --dbname=idem_iso \
	--inputdir="$iso" --outputdir="$iso/out" $SPECS >"$iso/log" 2>&1 || true
subset_result "$iso" "$(echo $SPECS | wc -w) isolation specs of the C edition pass against the SQL edition"

# ------------------------------------------------------------ escalation
# test/t/014_schema_hijack.pl's attack on the SQL edition: in a database
# another role owns (and so public), with a role that may create schemas
# named after every caller, the attackers plant look-alikes of every idem
# object, operators and catalog functions (test/hijack.sql) in every schema
# on the callers' search_path and in their pg_temp; then every entry point
# is called by the role of its kind (test/managed/hijack_calls.sql).
# Nothing planted may run, and no role may gain a right.
rights="SELECT string_agg(r.rolname || ':' || r.rolsuper || r.rolcreaterole || r.rolcreatedb || r.rolbypassrls || ':'
          || coalesce((SELECT string_agg(g.rolname, ',' ORDER BY g.rolname) FROM pg_auth_members m
                        JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid), ''), ' ' ORDER BY r.rolname)
          FROM pg_roles r WHERE r.rolname !~ '^pg_'"
sql -d postgres <<'SQL'
CREATE ROLE evil_owner LOGIN;
CREATE ROLE evil_creator LOGIN;
CREATE ROLE h_app LOGIN;
CREATE ROLE h_publisher LOGIN;
CREATE ROLE h_granted;
CREATE DATABASE idem_hijack OWNER evil_owner;
GRANT CREATE ON DATABASE idem_hijack TO evil_creator;
SQL
rights_before=$(sql -d postgres -c "$rights")
sql -d idem_hijack -f "$IDEM_ROOT/test/hijack.sql" >/dev/null
sql -d idem_hijack -c "CREATE SCHEMA idem AUTHORIZATION idem_owner"
"$bin/psql" -X -q -v ON_ERROR_STOP=1 -U idem_installer -d idem_hijack -f "$IDEM_ROOT/managed/idem.sql"
"$bin/psql" -X -q -At -v ON_ERROR_STOP=1 -U idem_installer -d idem_hijack >/dev/null <<'SQL'
SELECT idem.idem_grant('h_app', 'app');
SELECT idem.idem_grant('h_publisher', 'publisher');
SELECT idem.idem_set_policy('SHORT', ttl => interval '10 milliseconds', audit_ttl => interval '1 hour', reuse_after_expiry => 'refuse');
SELECT idem.idem_set_policy('BRIEF', ttl => interval '10 milliseconds', audit_ttl => interval '1 hour');
SQL
hijack_out=$root/hijack.out
{
	as_role() { "$bin/psql" -X -q -At -U "$1" -d idem_hijack -c "$2" 2>&1 || true; }
	as_role evil_owner "ALTER SCHEMA idem RENAME TO idem_renamed"
	as_role evil_owner "CREATE FUNCTION idem.idem_begin(bigint, text, text, jsonb) RETURNS void LANGUAGE sql AS 'SELECT'"
	as_role evil_creator "CREATE TABLE idem.idem_policy_x (id int)"
	as_role evil_owner "SELECT hijack_log.plant('public')"
	for s in postgres idem_installer idem_owner h_app h_publisher; do
		as_role evil_creator "CREATE SCHEMA $s; GRANT USAGE ON SCHEMA $s TO PUBLIC; SELECT hijack_log.plant('$s')"
	done
} >"$hijack_out.attack"
check "the database's owner cannot rename idem's schema, nor any attacker create in it" 3 \
	"$(grep -cE 'must be owner of schema idem|permission denied for schema idem' "$hijack_out.attack")"
check "the attackers planted look-alikes in public and in the schemas named after every caller" t \
	"$(sql -d idem_hijack -c "SELECT count(*) >= 5 * 40 FROM pg_proc p WHERE p.prosrc ~ 'hijack_log.hit' AND p.pronamespace::regnamespace::text IN ('public', 'postgres', 'idem_installer', 'idem_owner', 'h_app', 'h_publisher')")"
log_from=$(stat -c %s "$root/server.log")
hijack_status=0
"$bin/psql" -X -q -At -d idem_hijack -f "$here/hijack_calls.sql" >"$hijack_out" 2>&1 || hijack_status=$?
check "every call of the SQL edition's entry points by the roles of their kinds succeeds (but IK007 and IK005, as meant)" "0 IK007 IK005" \
	"$hijack_status $(grep -oE 'idempotency key expired|did not finish it' "$hijack_out" | sed 's/idempotency key expired/IK007/; s/did not finish it/IK005/' | tr '\n' ' ' | sed 's/ $//')"
check "every function of schema idem but the internal idem_sql_* is called there" "" \
	"$(sql -d idem_hijack -c "SELECT string_agg(p.proname, ' ' ORDER BY p.proname) FROM pg_proc p
	                          WHERE p.pronamespace = 'idem'::regnamespace AND p.proname !~ '^idem_sql_'" | tr ' ' '\n' |
		while read -r f; do grep -q "idem\.$f(" "$here/hijack_calls.sql" || echo "$f"; done | tr '\n' ' ' | sed 's/ $//')"
check "no plant ran" "" \
	"$(cat "$hijack_out" <(tail -c +$((log_from + 1)) "$root/server.log") | grep -o 'hijack: plant .*' | sort -u | head -n 5)"
check "no role gained a right" "$rights_before" "$(sql -d postgres -c "$rights")"
grep -E '^(ERROR|psql)' "$hijack_out" | grep -vE 'idempotency key expired|did not finish it' | head -n 10 || true
check "control: a call that does not name idem's schema runs the plant the attacker put on h_app's search_path" \
	"hijack: plant function h_app.idem_canonical_json ran as h_app" \
	"$("$bin/psql" -X -q -At -U h_app -d idem_hijack -c "SELECT idem_canonical_json('{}')" 2>&1 | grep -o 'hijack: plant .*' | head -n 1)"

# ------------------------------------------------------------ the libraries
# Python from the tree; Node from its npm package (the clients stage's
# install when there is one); Java from its jar (the clients stage's mvn
# install, else one here), over TCP.
PYTHONPATH=$IDEM_ROOT/clients/python/src /usr/bin/python3 "$here/libraries.py" \
	"host=$root port=$port user=postgres dbname=idem_managed"
node_app=${IDEM_TMP:-$root}/node-app
if [ ! -d "$node_app/node_modules/idem-pg" ]; then
	node_app=$root/node-app
	mkdir -p "$node_app"
	echo '{"name": "idem-managed-test", "private": true, "type": "module"}' >"$node_app/package.json"
	tarball=$(cd "$IDEM_ROOT/clients/node" && npm pack --silent --pack-destination "$root")
	(cd "$node_app" && npm install --no-audit --no-fund --silent "$root/$tarball" pg@^8.13.0 >/dev/null 2>&1) ||
		echo "not ok - node: the package and pg install"
fi
cp "$here/libraries.mjs" "$node_app/managed-libraries.mjs"
ran() {	# ran NAME CHECKS OUTPUT: the output, and a line if a check is missing
	echo "$3"
	[ "$(grep -cE '^(not )?ok - ' <<<"$3")" -eq "$2" ] || { echo "not ok - $1 ran its $2 checks"; sed 's/^/# /' <<<"$3" | tail -n 20; }
}
ran "node: test/managed/libraries.mjs" 4 "$(node "$node_app/managed-libraries.mjs" "$root" "$port" idem_managed 2>&1)"
java_version=$(sed -n '0,/<version>/s:.*<version>\(.*\)</version>.*:\1:p' "$IDEM_ROOT/clients/java/pom.xml")
java_jar=$HOME/.m2/repository/dev/idem/idem-pg/$java_version/idem-pg-$java_version.jar
[ -f "$java_jar" ] || (cd "$IDEM_ROOT/clients/java" && mvn -B -ntp -q -DskipTests install >"$root/mvn.log" 2>&1) ||
	{ tail -n 30 "$root/mvn.log"; echo "not ok - java: mvn install builds idem-pg"; }
(cd "$IDEM_ROOT/clients/java" && mvn -B -ntp -q dependency:build-classpath -Dmdep.includeScope=runtime \
	-Dmdep.outputFile="$root/java.cp" >>"$root/mvn.log" 2>&1) || true
ran "java: test/managed/Libraries.java" 4 "$(java -cp "$java_jar:$(cat "$root/java.cp" 2>/dev/null)" "$here/Libraries.java" \
	"jdbc:postgresql://127.0.0.1:$port/idem_managed?user=postgres" 2>&1)"

# ------------------------------------------------------------ the seven tests
# The article's seven tests (docs/protocol.md) against the SQL edition, for
# the order and for the generic API (pay(): idem_begin, a ledger row,
# idem_finish); the second, 20 concurrent callers, is same_key.sh's below.
new_sql_edition_database idem_seven
s7() { sql -d idem_seven -c "$1"; }
sqlstate() { "$bin/psql" -X -q -At -d idem_seven -v VERBOSITY=sqlstate -c "$1" 2>&1 | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\).*/\1/p'; }
s7 "CREATE TABLE public.ledger (owner_id bigint, amount int);
    CREATE FUNCTION public.pay(o bigint, k text, amount int) RETURNS TABLE (http_status int, body json, replayed boolean)
    LANGUAGE plpgsql AS \$\$
    DECLARE b record;
    BEGIN
        SELECT * INTO b FROM idem.idem_begin(o, 'PAY', k, jsonb_build_object('amount', amount));
        IF NOT b.replayed THEN
            INSERT INTO public.ledger VALUES (o, amount);
            SELECT f.http_status, f.body INTO b.http_status, b.body
              FROM idem.idem_finish_stored(o, 'PAY', k, 201, json_build_object('paid', amount, 'at', clock_timestamp())) f;
        END IF;
        RETURN QUERY SELECT b.http_status, b.body, b.replayed;
    END \$\$"
first=$(s7 "SELECT order_id, order_no, status, http_status, replayed FROM idem.idem_create_order(1, 'seven-order-0000001', 5, 2)")
second=$(s7 "SELECT order_id, order_no, status, http_status, replayed FROM idem.idem_create_order(1, 'seven-order-0000001', 5, 2)")
check "1. create_order twice in a row: one order" 1 "$(s7 "SELECT count(*) FROM idem.purchase_order WHERE owner_id = 1")"
check "6. create_order: the replay returns the first answer" "${first%|f}|t" "$second"
check "3. create_order: the key with another request is IK001" IK001 \
	"$(sqlstate "SELECT * FROM idem.idem_create_order(1, 'seven-order-0000001', 5, 3)")"
first=$(s7 "SELECT http_status, body::text, replayed FROM public.pay(1, 'seven-pay-00000001', 10)")
second=$(s7 "SELECT http_status, body::text, replayed FROM public.pay(1, 'seven-pay-00000001', 10)")
check "1. idem_begin / idem_finish twice in a row: one ledger row" 1 "$(s7 "SELECT count(*) FROM public.ledger WHERE owner_id = 1")"
check "6. idem_begin: the replay returns the first status and body, byte for byte" "${first%|f}|t" "$second"
check "3. idem_begin: the key with another request is IK001" IK001 \
	"$(sqlstate "SELECT * FROM public.pay(1, 'seven-pay-00000001', 11)")"
sql -d idem_seven -c "BEGIN" -c "SELECT * FROM idem.idem_create_order(1, 'seven-order-0000002', 6, 1)" -c "ROLLBACK" >/dev/null
sql -d idem_seven -c "BEGIN" -c "SELECT * FROM public.pay(1, 'seven-pay-00000002', 3)" -c "ROLLBACK" >/dev/null
check "4. after a rolled-back first attempt the retry executes (order, payment), one ledger row" "f f 1" \
	"$(s7 "SELECT replayed FROM idem.idem_create_order(1, 'seven-order-0000002', 6, 1)") $(s7 "SELECT replayed FROM public.pay(1, 'seven-pay-00000002', 3)") $(s7 "SELECT count(*) FROM public.ledger WHERE amount = 3")"
check "5. no cache in front: a duplicate record written around idem fails on the unique index (23505)" 23505 \
	"$(sqlstate "INSERT INTO idem.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
	             VALUES (1, 'CREATE_ORDER', 'seven-order-0000002', repeat('0', 64), 'PROCESSING', now() + interval '1 day')")"
for o in 2 3 4; do
	s7 "SELECT * FROM idem.idem_create_order($o, 'seven-shared-key-01', 7, 1)" >/dev/null
	s7 "SELECT * FROM public.pay($o, 'seven-shared-key-01', 7)" >/dev/null
done
check "7. three owners, one key: three orders and three payments, none replayed" "3 3 3" \
	"$(s7 "SELECT count(DISTINCT resource_id) FILTER (WHERE operation = 'CREATE_ORDER'), count(*) FILTER (WHERE operation = 'PAY')
	       FROM idem.idempotency_record WHERE idempotency_key = 'seven-shared-key-01'" | tr '|' ' ') $(s7 "SELECT count(*) FROM public.ledger WHERE amount = 7")"

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
