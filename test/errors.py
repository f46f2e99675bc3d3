"""idem's one error table, docs/errors.tsv, and what is made from it.

    python3 test/errors.py [--write]

Generated from the table (--write rewrites them; without it, a region that
differs fails):

- src/base/idem.h: the IK SQLSTATEs' ERRCODE_IDEM_ macros;
- the error classes of each library, one per name, each with its SQLSTATE,
  HTTP status and problem type, and the deprecated names beside them:
  clients/python/src/idem_pg/errors.py, clients/node/src/errors.js and
  clients/node/index.d.ts, clients/java/src/main/java/idem/IdemException.java;
- the README's table and docs/clients.md's list of Python's classes.

Checked against it: docs/reference.md's table has a row for every SQLSTATE
and no other; clients/CONTRACT.md's table a row for every problem type,
with the table's status.  One "ok - ..." or "not ok - ..." line each.
"""
import os
import re
import sys
import textwrap

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.chdir(root)
write = "--write" in sys.argv[1:]

rows = []
for line in open("docs/errors.tsv", encoding="utf-8"):
    if line.startswith("#") or not line.strip():
        continue
    state, name, http, ietf, problem, retryable, aliases, when = line.rstrip("\n").split("\t")
    rows.append(dict(state=state, name=None if name == "-" else name, http=http, ietf=ietf,
                     problem=None if problem == "-" else problem, retryable=retryable == "yes",
                     aliases=[] if aliases == "-" else aliases.split(), when=when))

# one class per name, in the table's order
classes = []
for r in rows:
    if r["name"] and r["name"] not in [c["name"] for c in classes]:
        classes.append(dict(name=r["name"], states=[], rows=[], aliases=r["aliases"]))
    if r["name"]:
        c = next(c for c in classes if c["name"] == r["name"])
        c["states"].append(r["state"])
        c["rows"].append(r)


def snake(name):
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).upper()


def status_of(c):
    """The HTTP status a library answers (None: none of its own)."""
    m = re.match(r"\d{3}", c["rows"][0]["http"])
    return int(m.group(0)) if m else None


def plain(text):
    return text.replace("`", "")


def about(c):
    states = ", ".join(c["states"])
    if len(c["rows"]) == 1:
        return "%s: %s" % (states, plain(c["rows"][0]["when"]))
    return "%s: %s" % (states, "; ".join(plain(r["when"]) for r in c["rows"]))


def aliases(c, java):
    out = []
    for a in c["aliases"]:
        if a.startswith("java:"):
            if java:
                out.append(a[5:])
        elif a.startswith("pynode:"):
            if not java:
                out.append(a[7:])
        else:
            out.append(a)
    return out


def c_header():
    lines = ["/* SQLSTATEs of the protocol's own outcomes (class \"IK\": idempotency key). */"]
    for r in rows:
        if r["state"].startswith("IK"):
            macro = "ERRCODE_IDEM_" + snake(r["name"])
            lines.append("#define %s%sMAKE_SQLSTATE('%s')" % (macro, "\t" * max(1, (48 - len("#define " + macro) + 3) // 4),
                                                               "','".join(r["state"])))
    return lines


def python():
    out = []
    for c in classes:
        doc = textwrap.wrap(about(c).replace("\\", "\\\\"), 92)
        doc = ['    """' + doc[0]] + ["    " + d for d in doc[1:]]
        doc[-1] += '"""'
        out += ["", "", "class %s(IdemError):" % c["name"]] + doc + [
                "    sqlstate = %r" % c["states"][0],
                "    http_status: Optional[int] = %r" % status_of(c),
                "    problem_type: Optional[str] = %r" % c["rows"][0]["problem"],
                "    retryable = %r" % c["rows"][0]["retryable"]]
    out += ["", "", "# deprecated names, kept for the catch clauses that use them"]
    for c in classes:
        for a in aliases(c, False):
            out.append("%s = %s" % (a, c["name"]))
    out += ["", "_BY_STATE = {"]
    out += ["    %r: %s," % (r["state"], r["name"]) for r in rows if r["name"]]
    out += ["}"]
    return out[2:]


def node_js():
    out = []
    for c in classes:
        out.append("/** %s */" % about(c).replace("*/", "* /"))
        out.append("export class %s extends IdemError {}" % c["name"])
        out.append("Object.assign(%s.prototype, { httpStatus: %s, problemType: %s, retryable: %s });"
                   % (c["name"], "null" if status_of(c) is None else status_of(c),
                      "null" if c["rows"][0]["problem"] is None else "'%s'" % c["rows"][0]["problem"],
                      "true" if c["rows"][0]["retryable"] else "false"))
    out.append("// deprecated names, kept for the catch clauses that use them")
    for c in classes:
        for a in aliases(c, False):
            out.append("/** @deprecated use %s */" % c["name"])
            out.append("export const %s = %s;" % (a, c["name"]))
    out.append("const BY_STATE = {")
    out += ["  '%s': %s," % (r["state"], r["name"]) for r in rows if r["name"]]
    out.append("};")
    return out


def node_dts():
    out = []
    for c in classes:
        out.append("/** %s */" % about(c).replace("*/", "* /"))
        out.append("export class %s extends IdemError {}" % c["name"])
    for c in classes:
        for a in aliases(c, False):
            out.append("/** @deprecated use %s */" % c["name"])
            out.append("export const %s: typeof %s;" % (a, c["name"]))
            out.append("export type %s = %s;" % (a, c["name"]))
    return out


def java_classes():
    out = []
    deprecated = {}
    for c in classes:
        for a in aliases(c, True):
            deprecated.setdefault(a, []).append(c["name"])
    for a, news in deprecated.items():
        out += ["", "    /** Deprecated: catch %s. */" % " or ".join(news),
                "    @Deprecated",
                "    public static class %s extends IdemException {" % a,
                "        private static final long serialVersionUID = 1L;",
                "        %s(String m, String state, Throwable c) { super(m, state, c); }" % a,
                "    }"]
    for c in classes:
        parents = [a for a in aliases(c, True)]
        parent = parents[0] if parents else "IdemException"
        status = status_of(c)
        out += ["", "    /** %s */" % about(c).replace("*/", "* /").replace("\\u", "\\\\u"),
                "    @SuppressWarnings(\"deprecation\")",
                "    public static class %s extends %s {" % (c["name"], parent),
                "        private static final long serialVersionUID = 1L;",
                "        public %s(String m, String state, Throwable c) { super(m, state, c); }" % c["name"],
                "        @Override public int httpStatus() { return %d; }" % (status or 0),
                "        @Override public String problemType() { return %s; }"
                % ("null" if c["rows"][0]["problem"] is None else '"%s"' % c["rows"][0]["problem"]),
                "        @Override public boolean retryable() { return %s; }" % ("true" if c["rows"][0]["retryable"] else "false"),
                "    }"]
    return out[1:]


def java_switch():
    out = []
    for c in classes:
        out.append("            case %s: return new %s(m, state, e);"
                   % (", ".join('"%s"' % s for s in c["states"]).replace(", ", ": case "), c["name"]))
    return out


def readme():
    out = ["| SQLSTATE | when | HTTP (article) | HTTP (IETF draft) |", "|---|---|---|---|",
           "| — (`replayed = false`) | first execution | 201 | 201 |",
           "| — (`replayed = true`) | a repeat of a finished request | the stored status | the stored status |"]
    for r in rows:
        out.append("| `%s` | %s | %s | %s |" % (r["state"], r["when"], r["http"], r["ietf"]))
    return out


def clients_cell():
    parts = ["`%s` (%s)" % (c["name"], ", ".join(c["states"])) for c in classes]
    olds = ["`%s`" % a for c in classes for a in aliases(c, False)]
    return "%s; deprecated names: %s" % (", ".join(parts), ", ".join(olds))


def java_cell():
    olds = {}
    for c in classes:
        for a in aliases(c, True):
            olds.setdefault(a, []).append("`%s`" % c["name"])
    return ("`IdemException` and a class per name, the same names; deprecated, each the superclass of what "
            "replaces it: %s" % ", ".join("`%s` (of %s)" % (a, " and ".join(n)) for a, n in olds.items()))


problems, regions = [], 0


def region(path, key, lines, begin_fmt, end_fmt):
    """Replace the lines between the begin and end markers of key."""
    global regions
    text = open(path, encoding="utf-8").read()
    begin, end = begin_fmt % key, end_fmt % key
    if begin not in text or end not in text:
        problems.append("%s has no region %s" % (path, key))
        return
    head, rest = text.split(begin, 1)
    body, tail = rest.split(end, 1)
    indent = re.search(r"([ \t]*)$", head).group(1)
    new = "\n" + "\n".join(lines) + "\n" + indent
    regions += 1
    if body != new:
        if write:
            open(path, "w", encoding="utf-8").write(head + begin + new + end + tail)
        else:
            problems.append("%s: region %s differs (python3 test/errors.py --write)" % (path, key))


C = ("/* BEGIN generated by test/errors.py from docs/errors.tsv: %s */", "/* END generated: %s */")
HASH = ("# BEGIN generated by test/errors.py from docs/errors.tsv: %s", "# END generated: %s")
SLASH = ("// BEGIN generated by test/errors.py from docs/errors.tsv: %s", "// END generated: %s")
HTML = ("<!-- BEGIN generated by test/errors.py from docs/errors.tsv: %s -->", "<!-- END generated: %s -->")
region("src/base/idem.h", "sqlstates", c_header(), *C)
region("clients/python/src/idem_pg/errors.py", "classes", python(), *HASH)
region("clients/node/src/errors.js", "classes", node_js(), *SLASH)
region("clients/node/index.d.ts", "classes", node_dts(), *SLASH)
region("clients/java/src/main/java/idem/IdemException.java", "classes", java_classes(), *SLASH)
region("clients/java/src/main/java/idem/IdemException.java", "switch", java_switch(), *SLASH)
region("README.md", "sqlstates", readme(), *HTML)
# docs/clients.md's row of errors, in a table: its Python cell
text = open("docs/clients.md", encoding="utf-8").read()
m = re.search(r"^\| errors \| (.*?) \| the same classes \| (.*?) \|$", text, re.M)
regions += 1
if not m:
    problems.append("docs/clients.md has no row '| errors | ... | the same classes | ... |'")
elif (m.group(1), m.group(2)) != (clients_cell(), java_cell()):
    if write:
        text = text[:m.start(2)] + java_cell() + text[m.end(2):]
        text = text[:m.start(1)] + clients_cell() + text[m.end(1):]
        open("docs/clients.md", "w", encoding="utf-8").write(text)
    else:
        problems.append("docs/clients.md: the errors row differs (python3 test/errors.py --write)")
print(("ok - %d regions generated from docs/errors.tsv (%d SQLSTATEs, %d classes) are current" % (regions, len(rows), len(classes)))
      if not problems else "not ok - the error table's copies: " + "; ".join(problems))

# checked: docs/reference.md has a row for every SQLSTATE, and no other
ref = open("docs/reference.md", encoding="utf-8").read()
section = ref.split("## SQLSTATEs and HTTP", 1)[1].split("\n## ", 1)[0]
listed = set()
for m in re.finditer(r"^\| (`[0-9A-Z]{5}`(?: / `[0-9A-Z]{5}`)*) \|", section, re.M):
    listed.update(re.findall(r"`([0-9A-Z]{5})`", m.group(1)))
table = {r["state"] for r in rows}
bad = ["%s is not in docs/reference.md's table" % s for s in sorted(table - listed)]
bad += ["docs/reference.md lists %s, which docs/errors.tsv has not" % s for s in sorted(listed - table)]
print("ok - docs/reference.md's table has a row for each of the %d SQLSTATEs of docs/errors.tsv" % len(table)
      if not bad else "not ok - " + "; ".join(bad))

# checked: clients/CONTRACT.md's problem types, with the table's status
contract = open("clients/CONTRACT.md", encoding="utf-8").read()
bad = []
for c in classes:
    problem = c["rows"][0]["problem"]
    if problem in (None, "internal"):
        continue
    m = re.search(r"^\| `urn:idem:error:%s` \| ([^|]*) \|(.*)$" % re.escape(problem), contract, re.M)
    if not m:
        bad.append("no row for urn:idem:error:%s" % problem)
    elif not m.group(1).strip().startswith(str(status_of(c))):
        bad.append("urn:idem:error:%s answers %s, the table %s" % (problem, m.group(1).strip(), status_of(c)))
    elif not any(s in m.group(2) for s in c["states"]):
        bad.append("urn:idem:error:%s's row names none of %s" % (problem, ", ".join(c["states"])))
print("ok - clients/CONTRACT.md has each problem type of docs/errors.tsv with its status and SQLSTATE"
      if not bad else "not ok - clients/CONTRACT.md: " + "; ".join(bad))
