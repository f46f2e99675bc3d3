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
work=$(mktemp -d -t idem-readme.XXXXXX)
at_exit 'rm -rf "$work"' 
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

# test/README.md's stage budgets: one for each stage test/run_all.sh runs
# (and its set-up), none for a stage it does not run, at most 45 minutes in
# all (test/run_all.sh prints each stage's time beside its budget)
budgets=$(/usr/bin/python3 - "$IDEM_ROOT" <<'PY'
import re, sys
root = sys.argv[1]
run_all = open(f"{root}/test/run_all.sh").read()
stages = ["setup"] + re.findall(r"^(?:stage|run_shell_check) ([a-z0-9_]+) ", run_all, flags=re.M)
readme = open(f"{root}/test/README.md").read()
section = readme.split("\n## Stage budgets", 1)[1].split("\n## ", 1)[0]
budget = {m[0]: int(m[1]) for m in re.findall(r"^\| `([a-z0-9_]+)` \| (\d+) \|", section, flags=re.M)}
missing = [s for s in dict.fromkeys(stages) if s not in budget]
extra = [b for b in budget if b not in stages]
total = sum(budget.values())
print(f"{len(budget)} {total} {'yes' if not missing and not extra and total <= 45 * 60 else 'no'}"
      f" missing={','.join(missing) or '-'} extra={','.join(extra) or '-'}")
PY
)
check "test/README.md gives each of the test command's stages a budget, $(echo "$budgets" | awk '{print $1}') in all, summing to $(echo "$budgets" | awk '{printf "%d min %d s", $2 / 60, $2 % 60}') (at most 45 min)" \
	yes "$(echo "$budgets" | awk '{print ($3 == "yes") ? "yes" : $0}')"

# the README's row for Debian's 15 (every stage, every commit) counts
# today's test files: REGRESS, ISOLATION, test/t/*.pl, the releases the
# upgrade suite creates and updates
counts=$(/usr/bin/python3 - "$IDEM_ROOT" <<'PY'
import glob, re, sys
root = sys.argv[1]
mk = open(f"{root}/Makefile").read()
regress = len(re.search(r"^REGRESS = (.*)$", mk, flags=re.M).group(1).split())
isolation = len(re.search(r"^ISOLATION = (.*)$", mk, flags=re.M).group(1).split())
tap = len(glob.glob(f"{root}/test/t/*.pl"))
releases = len({re.sub(r".*idem--(.*)--.*", r"\1", f) for f in glob.glob(f"{root}/extension/idem--*--*.sql")})
row = re.search(r"^\| 15 \(Debian [^|]*\| [^|]*\| yes \| (\d+) \| (\d+) \| (\d+) files \| (\d+) versions \|",
                open(f"{root}/README.md").read(), flags=re.M)
want = f"{regress} {isolation} {tap} {releases}"
print(want, "yes" if row and " ".join(row.groups()) == want else "no: the README says " + (" ".join(row.groups()) if row else "nothing"))
PY
)
check "the README's row for PostgreSQL 15 counts today's tests: $(echo "$counts" | awk '{printf "%s regress, %s isolation, %s TAP files, %s versions", $1, $2, $3, $4}')" \
	yes "$(echo "$counts" | awk '{print ($5 == "yes") ? "yes" : $0}')"

# the README's performance table quotes docs/performance.md: each of its
# rows is a row of that page, word for word (one source for the figures)
perf=$(/usr/bin/python3 - "$IDEM_ROOT" <<'PY'
import re, sys
root = sys.argv[1]
section = open(f"{root}/README.md").read().split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
rows = [l for l in section.splitlines() if l.startswith("| ") and not l.startswith("| idem path") and not l.startswith("|--")]
page = set(open(f"{root}/docs/performance.md").read().splitlines())
stale = [r for r in rows if r not in page]
print(len(rows), "yes" if rows and not stale else "no: " + (" / ".join(stale) or "no rows"))
PY
)
check "the README's performance table ($(echo "$perf" | awk '{print $1}') rows) quotes docs/performance.md's rows word for word" \
	yes "$(echo "$perf" | awk '{print ($2 == "yes") ? "yes" : $0}')"

# the version in package files and artifacts, idem's tables in code snippets
/usr/bin/python3 "$here/docs_names.py"

# each library's page says in its first lines that it is on no registry,
# with the one command that installs it from a checkout
for page in clients/python/README.md clients/node/README.md clients/java/README.md clients/java/spring/README.md; do
	check "$page says in its first 15 lines that the library is on no registry, and how to install it from a checkout" yes \
		"$(head -n 15 "$IDEM_ROOT/$page" | grep -qi 'on no registry' && head -n 15 "$IDEM_ROOT/$page" | grep -qE '(pip install|npm install|mvn .*install)' && echo yes || echo no)"
done
