#!/usr/bin/env bash
# The README's "Getting started in five minutes" runs as pasted: its sql
# blocks, in order, in a new database with idem installed, through psql as a
# superuser (as the README says), give the output in quickstart.out (the
# echoed statements and their answers: the debit done once, the retry
# replayed, IK001, the stored 422, the transient failure executing afresh).
# Needs a server (PGHOST/PGPORT/PGUSER; test/run_all.sh's).  Prints "ok - ..."
# / "not ok - ..." lines.
source "$(dirname "$0")/../lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
db=idem_readme
work=$(mktemp -d /tmp/idem-readme.XXXXXX)
trap 'rm -rf "$work"' EXIT
out=$work/quickstart.out

# the sql blocks of the section, in order
awk '/^## Getting started in five minutes/ {on = 1; next}
     on && /^## / {exit}
     on && /^```sql$/ {block = 1; next}
     block && /^```$/ {block = 0; print ""; next}
     block {print}' "$IDEM_ROOT/README.md" >"$work/quickstart.sql"
blocks=$(grep -c '^```sql$' <(awk '/^## Getting started in five minutes/ {on = 1; next} on && /^## / {exit} on {print}' "$IDEM_ROOT/README.md"))

"$PG_BINDIR/dropdb" --if-exists "$db" 2>/dev/null
"$PG_BINDIR/psql" -X -q -d postgres -c "DROP ROLE IF EXISTS shop_app" 2>/dev/null || true
"$PG_BINDIR/createdb" "$db"
"$PG_BINDIR/psql" -X -q -d "$db" -c "CREATE EXTENSION idem"
(cd "$work" && "$PG_BINDIR/psql" -X -a -d "$db" -f quickstart.sql >"$out" 2>&1) || true
if diff -u "$here/quickstart.out" "$out" >"$work/diff"; then
	echo "ok - the README's quickstart ($blocks sql blocks) runs as pasted and answers as quickstart.out"
else
	echo "not ok - the README's quickstart differs from test/readme/quickstart.out"
	cat "$work/diff"
fi
check "the quickstart debited the account once per key: 1000 - 100 - 50" "850" \
	"$("$PG_BINDIR/psql" -X -At -d "$db" -c "SELECT balance FROM account WHERE id = 7")"
"$PG_BINDIR/dropdb" "$db"
"$PG_BINDIR/psql" -X -q -d postgres -c "DROP ROLE shop_app"

# every relative link of the pages, and its #anchor, resolves
if links=$(/usr/bin/python3 "$here/links.py" "$IDEM_ROOT"); then
	echo "ok - the $(echo "$links" | head -n 1) relative links of README.md, docs/, test/README.md and examples/README.md resolve"
else
	echo "not ok - broken links in the Markdown pages:"
	echo "$links" | tail -n +2
fi
check "README.md is at most 40 KB" true "$([ "$(wc -c <"$IDEM_ROOT/README.md")" -le 40960 ] && echo true || echo "false ($(wc -c <"$IDEM_ROOT/README.md") bytes)")"
