#!/usr/bin/env bash
# The repository's own hygiene, for test/run_all.sh:
#
#   - every test file runs: each sql/*.sql is in the Makefile's REGRESS,
#     each test/specs/*.spec in its ISOLATION, each expected output belongs to
#     one of them (expected/ a test's, test/expected/ a spec's), and the TAP files are taken by their wildcard (test/t/*.pl),
#     as citus's ci/check_all_tests_are_run.sh checks;
#   - the released scripts are pinned and the next one's copies generated
#     (test/upgrade/scripts.py);
#   - the error table's copies are generated from docs/errors.tsv
#     (test/errors.py);
#   - every shell script of the repository passes shellcheck (warnings and
#     errors; Debian's shellcheck, installed if missing).
#
# Prints "ok - ..." / "not ok - ..." lines.
source "$(dirname "$0")/lib.sh"
cd "$IDEM_ROOT" || exit 1

list() { sed -n "s/^$1 = //p" Makefile | tr ' ' '\n' | grep -v '^$' | sort; }
files() { ls "$1" 2>/dev/null | sed -E "s/\\.$2\$//" | sort; }
regress=$(list REGRESS)
isolation=$(list ISOLATION)
check "every sql/*.sql is in REGRESS and every REGRESS test has its file ($(echo "$regress" | wc -l) tests)" \
	"" "$(diff <(files sql sql) <(echo "$regress") | grep '^[<>]' | tr '\n' ' ')"
check "every test/specs/*.spec is in ISOLATION and every ISOLATION spec has its file ($(echo "$isolation" | wc -l) specs)" \
	"" "$(diff <(files test/specs spec) <(echo "$isolation") | grep '^[<>]' | tr '\n' ' ')"
check "every expected/*.out belongs to a test and every test/expected/*.out to a spec" \
	"" "$(comm -23 <(ls expected | sed -E 's/(_[0-9])?\.out$//' | sort -u) <(printf '%s\n' $regress | sort -u) | tr '\n' ' ')$(comm -23 <(ls test/expected | sed -E 's/(_[0-9])?\.out$//' | sort -u) <(printf '%s\n' $isolation | sort -u) | tr '\n' ' ')"
check "the TAP files are run by their wildcard (test/t/*.pl: $(ls test/t/*.pl | wc -l) files)" \
	"test/t/*.pl" "$(sed -n 's/^PROVE_TESTS ?= //p' Makefile)"

# the scripts of released versions as released; the next update script's
# copies of idem.sql generated (test/upgrade/scripts.py)
/usr/bin/python3 test/upgrade/scripts.py || true

# docs/errors.tsv: the copies generated from it current, the pages that
# describe it complete (test/errors.py)
/usr/bin/python3 test/errors.py || true

# the two commands of the README run from a copy of the tree: neither
# builds nor writes in the checkout
check "test/run_all.sh and test/demo.sh run from a copy of the tree (run_in_copy)" "2" \
	"$(grep -lE '^run_in_copy test/(run_all|demo)\.sh "\$@"$' test/run_all.sh test/demo.sh | wc -l)"

# the libraries' versions are the extension's (idem.control: 1.13 -> 1.13.0)
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idem.control).0
check "the Python and Node libraries' versions are the extension's ($version)" \
	"$version $version $version" \
	"$(sed -n 's/^version = "\(.*\)"/\1/p' clients/python/pyproject.toml) $(sed -n 's/^__version__ = "\(.*\)"/\1/p' clients/python/src/idem_pg/__init__.py) $(sed -n 's/^  "version": "\(.*\)",/\1/p' clients/node/package.json)"

# a consumer's message: the fields of Python's and Node's Delivery are the
# ones docs/messaging.md names, and the docs name no other (message.id was
# one, and an AttributeError)
deliveries=$(/usr/bin/python3 - <<'PY'
import re
py = open("clients/python/src/idem_pg/consumer.py").read()
py_fields = re.findall(r"^    (\w+): ", py.split("class Delivery:", 1)[1].split("\n\n\n", 1)[0], flags=re.M)
ts = open("clients/node/consumer.d.ts").read()
ts_fields = re.findall(r"^  (\w+): ", ts.split("export class Delivery {", 1)[1].split("}", 1)[0], flags=re.M)
doc = open("docs/messaging.md").read()
named = set(re.findall(r"`message\.(\w+)`", doc))
missing = [f for f in py_fields + ts_fields if f not in named]
unknown = sorted(named - set(py_fields) - set(ts_fields))
print("yes" if py_fields and ts_fields and not missing and not unknown
      else "no: not in the docs %s, not in the code %s" % (missing, unknown))
PY
)
check "docs/messaging.md names the fields of the consumers' Delivery as the Python and Node code does" yes "$deliveries"

# every Python, JavaScript and Java snippet of the client pages opens with
# the import lines it needs (a newcomer had to find the module paths)
snippets=$(/usr/bin/python3 - <<'PY'
import re
bad = []
for page in ("docs/clients.md", "docs/messaging.md"):
    for lang, block in re.findall(r"```(python|js|java)\n(.*?)```", open(page).read(), flags=re.S):
        if not re.search(r"^(import |from \S+ import )", block, flags=re.M):
            bad.append("%s: %s" % (page, block.splitlines()[0][:50]))
print("yes" if not bad else "no: " + "; ".join(bad))
PY
)
check "the client pages' snippets have their import lines" yes "$snippets"

ensure_service_packages shellcheck
mapfile -t scripts < <(git ls-files '*.sh' 2>/dev/null || find . -name '*.sh' -not -path '*/node_modules/*')
if out=$(shellcheck -S warning -f gcc "${scripts[@]}" 2>&1); then
	echo "ok - shellcheck finds no warning in the ${#scripts[@]} shell scripts"
else
	echo "not ok - shellcheck: $(echo "$out" | grep -c ': \(warning\|error\):') warnings and errors in the shell scripts"
	echo "$out" | head -n 40 | sed 's/^/# /'
fi
