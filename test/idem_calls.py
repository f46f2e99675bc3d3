"""Reads a server log written with log_statement = all: every statement that
calls one of idem's functions names idem's schema and casts each of its
parameters ($n::type).  Prints one "ok - ..." or "not ok - ..." line.

    python3 test/idem_calls.py LOG OFFSET SCHEMA FUNCTIONS NAME

FUNCTIONS: idem's function names, comma-separated; OFFSET: where in LOG the
stage began (bytes).
"""
import re
import sys

log_path, offset, schema, names, label = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
functions = set(names.split(","))
entry = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
statement = re.compile(r"\bLOG:  (?:statement|execute [^:]*): (.*)$")
call = re.compile(r'((?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)\s*\.\s*)?\b(idem_[a-z_]+)\s*\(')
qualified = {schema, '"%s"' % schema.replace('"', '""')}

with open(log_path, "rb") as f:
    f.seek(offset)
    text = f.read().decode("utf-8", "replace")

statements, current = [], None
for line in text.splitlines():
    if entry.match(line):
        if current is not None:
            statements.append(current)
        m = statement.search(line)
        current = m.group(1) if m else None
    elif current is not None:
        current += "\n" + line
if current is not None:
    statements.append(current)

literal = re.compile(r"'(?:[^']|'')*'")
bad, calls = [], 0
for s in statements:
    # a name in a string literal is no call (has_function_privilege's argument)
    code = literal.sub("''", s)
    named = [(m.group(1), m.group(2)) for m in call.finditer(code) if m.group(2) in functions]
    if not named:
        continue
    calls += 1
    unqualified = [n for q, n in named if q is None or q.rstrip(". \t") not in qualified]
    uncast = re.findall(r"\$\d+(?!\d|\s*::)", code)
    if unqualified or uncast:
        bad.append("%s%s: %s" % ("unqualified %s " % ",".join(unqualified) if unqualified else "",
                                 "uncast %s" % ",".join(uncast) if uncast else "", " ".join(s.split())[:300]))
if calls == 0:
    print("not ok - %s: the server logged no statement calling an idem function (log_statement = all?)" % label)
elif bad:
    print("not ok - %s: every statement calling an idem function names its schema and casts each parameter"
          " (%d of %d do not)" % (label, len(bad), calls))
    for b in sorted(set(bad))[:20]:
        print("# " + b)
else:
    print("ok - %s: every statement calling an idem function names its schema and casts each parameter"
          " (%d statements)" % (label, calls))
