"""The extension's scripts: released ones pinned, the next one's copies generated.

    python3 test/upgrade/scripts.py [--write | --pin]

Two checks, one "ok - ..." or "not ok - ..." line each:

- Every script of a released version is byte for byte what was released:
  extension/SHA256SUMS lists each one's sha256.  The scripts not pinned
  are the full script's source (extension/idem.sql) and the update script
  to the version being built (idem.control's default_version), until the
  CHANGELOG dates that version's release.  --pin adds the scripts of a
  version just released.
- The update script to the version being built copies no object's
  definition by hand: a region

      -- from idem.sql: CREATE FUNCTION @extschema@.idem_health(
      ...
      -- end

  holds the statement of extension/idem.sql that starts with that line,
  as it is there ("from idem.sql, replaced:" writes CREATE OR REPLACE).
  --write regenerates the regions; the check fails if one differs.
"""
import hashlib
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ext = os.path.join(root, "extension")
control = open(os.path.join(root, "idem.control")).read()
current = re.search(r"^default_version = '(.*)'", control, re.M).group(1)
mode = sys.argv[1] if len(sys.argv) > 1 else ""


def ok(good, problems, bad):
    print(("ok - " + good) if not problems else ("not ok - %s: %s" % (bad, "; ".join(problems))))
    return not problems


# the pins
sums_path = os.path.join(ext, "SHA256SUMS")
pins = {}
if os.path.exists(sums_path):
    for line in open(sums_path):
        digest, name = line.split()
        pins[name] = digest
# the version being built, unless the CHANGELOG dates its release: then
# its update script is released too, and pinned
changelog = open(os.path.join(root, "CHANGELOG.md")).read()
dated = re.search(r"^## %s \u2014 \d{4}-\d{2}-\d{2}" % re.escape(current), changelog, re.M)
building = [] if dated else [n for n in os.listdir(ext)
                             if re.fullmatch(r"idem--[0-9.]+--%s\.sql" % re.escape(current), n)]
released = sorted((n for n in os.listdir(ext)
                   if (re.fullmatch(r"idem--[0-9.]+--[0-9.]+\.sql", n) or n == "idem--1.0.sql")
                   and n not in building),
                  key=lambda n: [int(x) for x in re.findall(r"\d+", n)])
digest = {n: hashlib.sha256(open(os.path.join(ext, n), "rb").read()).hexdigest() for n in released}
if mode == "--pin":
    for n in released:
        pins.setdefault(n, digest[n])
    with open(sums_path, "w") as f:
        for n in sorted(pins, key=lambda n: [int(x) for x in re.findall(r"\d+", n)]):
            f.write("%s  %s\n" % (pins[n], n))
problems = ["%s is not pinned (--pin, once it is released)" % n for n in released if n not in pins]
problems += ["%s changed after its release" % n for n in released if n in pins and pins[n] != digest[n]]
problems += ["%s is pinned but gone" % n for n in pins if n not in digest]
good = ok("the %d scripts of released versions are byte for byte as released (extension/SHA256SUMS)" % len(released),
          problems, "released scripts")

# the regions
full = open(os.path.join(ext, "idem.sql")).read().split("\n")


def statement(first):
    """The statement of idem.sql whose first line starts with first."""
    starts = [i for i, line in enumerate(full) if line.startswith(first)]
    if len(starts) != 1:
        return None, "%d statements of idem.sql start with %r" % (len(starts), first)
    out, quote, atomic = [], None, False
    for line in full[starts[0]:]:
        out.append(line)
        for tag in re.findall(r"\$[A-Za-z_]*\$", line):
            quote = None if quote == tag else (quote or tag)
        # a BEGIN ATOMIC body ends at its END;
        atomic = atomic or (quote is None and line.strip() == "BEGIN ATOMIC")
        if quote is None and line.rstrip().endswith(";") and (not atomic or line.strip() == "END;"):
            return out, None
    return None, "the statement starting with %r never ends" % first


begin = re.compile(r"^-- from idem\.sql(, replaced)?: (.*)$")
problems, regions = [], 0
for name in building:
    path = os.path.join(ext, name)
    lines = open(path).read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = begin.match(lines[i])
        out.append(lines[i])
        i += 1
        if not m:
            continue
        regions += 1
        j = i
        while j < len(lines) and lines[j] != "-- end":
            j += 1
        if j == len(lines):
            problems.append("%s: the region of %r has no '-- end'" % (name, m.group(2)))
            break
        body, err = statement(m.group(2))
        if err:
            problems.append("%s: %s" % (name, err))
            body = lines[i:j]
        elif m.group(1):
            body = [re.sub(r"^CREATE (FUNCTION|VIEW)", r"CREATE OR REPLACE \1", body[0])] + body[1:]
        if body != lines[i:j]:
            problems.append("%s: the region of %r differs from idem.sql" % (name, m.group(2)))
        out.extend(body)
        i = j
    if mode == "--write" and out != lines:
        open(path, "w").write("\n".join(out))
        problems = [p for p in problems if "differs" not in p]
if dated:
    good = ok("%s is released (the CHANGELOG dates it): its update script is pinned, no longer generated" % current,
              problems, "the update script's regions") and good
else:
    good = ok("the update script to %s copies idem.sql's definitions through %d generated region(s)" % (current, regions),
              problems, "the update script's regions (test/upgrade/scripts.py --write)") and good
sys.exit(0 if good else 1)
