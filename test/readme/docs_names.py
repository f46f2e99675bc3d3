"""Names in the pages that follow the version, and idem's tables in code.

    python3 test/readme/docs_names.py [--write]

The version a page names in a package file, an artifact or a jar
(postgresql-15-idem_X.Y.Z_amd64.deb, dev.idem:idem-pg:X.Y.Z, <version> of
an idem artifact, ...) is idem.control's with a patch number: --write puts
it there; without it, one "ok - ..." or "not ok - ..." line says whether
every page does.  A second line: every code block that reads or writes
one of idem's tables names it in idem_internal (a newcomer's copy of
"FROM idem_outbox" fails: relation "idem_outbox" does not exist).
"""
import glob
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
os.chdir(root)
control = open("idem.control").read()
version = re.search(r"^default_version = '(.*)'", control, re.M).group(1) + ".0"
pages = sorted(set(["README.md"] + glob.glob("docs/*.md") + glob.glob("clients/**/*.md", recursive=True)
                   + glob.glob("examples/**/*.md", recursive=True)))
pages = [p for p in pages if "node_modules" not in p and "/target/" not in p]

V = r"\d+\.\d+\.\d+"
patterns = [
    re.compile(r"(postgresql-\d+-idem_)(%s)(_amd64\.deb)" % V),
    re.compile(r"(dev\.idem:idem-[a-z0-9-]+:)(%s)()" % V),
    re.compile(r"(<artifactId>idem-[a-z0-9-]+</artifactId>(?:\s*<!--.*?-->)?\s*<version>)(%s)(</version>)" % V, re.S),
    re.compile(r"(dev/idem/idem-[a-z0-9-]+/)(%s)(/)" % V),
    re.compile(r"(idem-[a-z0-9-]+-)(%s)(\.(?:jar|tgz|whl|tar\.gz))" % V),
    re.compile(r"(idem_pg-)(%s)(-py3)" % V),
    re.compile(r"(\()(%s)( for idem \d+\.\d+)" % V),
]
write = "--write" in sys.argv[1:]
stale = []
for page in pages:
    text = open(page).read()
    new = text
    for p in patterns:
        for m in p.finditer(text):
            if m.group(2) != version:
                stale.append("%s: %s" % (page, " ".join(m.group(0).split())))
        new = p.sub(lambda m: m.group(1) + version + m.group(3), new)
    new = re.sub(r"(\(%s for idem )\d+\.\d+" % re.escape(version), lambda m: m.group(1) + version[:-2], new)
    if write and new != text:
        open(page, "w").write(new)
if write:
    print("wrote %s into the pages" % version)
elif stale:
    print("not ok - the pages name idem's version %s where they name one (test/readme/docs_names.py --write): %s"
          % (version, "; ".join(stale[:10])))
else:
    print("ok - the pages name idem's version %s where they name one (package files, artifacts, jars)" % version)

tables = ("idempotency_record|purchase_order|idem_outbox_dead|idem_outbox_topic|idem_outbox|idem_inbox_failure"
          "|idem_inbox|idem_history|idem_policy|idem_digest_secret")
use = re.compile(r"\b(FROM|JOIN|INTO|UPDATE|TABLE|ON)\s+(?!idem_internal\.)(%s)\b(?!\s*\()" % tables, re.I)
bare = []
for page in pages:
    for block in re.findall(r"```\w*\n(.*?)```", open(page).read(), re.S):
        for m in use.finditer(block):
            bare.append("%s: %s" % (page, m.group(0)))
if bare:
    print("not ok - the pages' code names idem's tables in idem_internal: %s" % "; ".join(bare[:10]))
else:
    print("ok - the pages' code names idem's tables in idem_internal")
