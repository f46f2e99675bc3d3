#!/usr/bin/env bash
# The structure of src/ as src/LAYERS states it: every file of src/
# belongs to exactly one module and sits in its module's folder; each
# folder holds one layer; a file includes idem's own headers only of its
# own module, of modules listed above it, and (for an api module) of no
# other api module; every SQL-callable C function (PG_FUNCTION_INFO_V1) is
# in src/api/; no .c file is over 600 lines and no function over 80 (from
# its return type to its closing brace); and docs/architecture.md's module
# list is the one src/LAYERS gives (`bash test/layers.sh --write` writes
# it).  Prints "ok - ..." / "not ok - ..." lines.
set -euo pipefail
IDEM_ROOT=$(cd "$(dirname "$0")/.." && pwd)
exec /usr/bin/python3 - "$IDEM_ROOT" "${1:-}" <<'PY'
import os
import re
import sys

root, write = sys.argv[1], sys.argv[2] == '--write'
order, layer, folder, owner, about, extras = [], {}, {}, {}, {}, {}
with open(os.path.join(root, 'src', 'LAYERS')) as f:
    for raw in f:
        line, _, comment = raw.partition('#')
        line = line.split()
        if not line:
            continue
        lay, fold, mod, extra = line[0], line[1], line[2], line[3:]
        order.append(mod)
        layer[mod], folder[mod] = lay, fold
        about[mod], extras[mod] = comment.strip(), extra
        files = extra if mod == 'init' else [mod + '.c', mod + '.h'] + extra
        for name in files:
            owner[name] = mod

def c_files():
    # src/ and the module's entry, idem.c at the top (contrib's layout)
    yield root, ['idem.c']
    for dirpath, _, names in os.walk(os.path.join(root, 'src')):
        yield dirpath, names

problems, files, includes = [], 0, 0
for dirpath, names in c_files():
    for name in sorted(names):
        if not name.endswith(('.c', '.h')):
            continue
        files += 1
        rel = os.path.relpath(dirpath, root)
        mod = owner.get(name)
        if mod is None:
            problems.append('%s/%s belongs to no module of src/LAYERS' % (rel, name))
            continue
        if rel != folder[mod]:
            problems.append('%s/%s is in %s, its module %s in %s' % (rel, name, rel, mod, folder[mod]))
        with open(os.path.join(dirpath, name)) as f:
            text = f.read()
        for inc in re.findall(r'^#include "([^"]+)"', text, flags=re.M):
            dep = owner.get(os.path.basename(inc))
            if dep is None:
                continue        # a PostgreSQL header
            includes += 1
            if dep == mod:
                continue
            if order.index(dep) > order.index(mod):
                problems.append('%s/%s (%s, %s) includes %s of %s, a module above it'
                                % (rel, name, mod, layer[mod], inc, dep))
            elif layer[mod] == 'api' and layer[dep] == 'api':
                problems.append('%s/%s (entry point %s) includes %s of entry point %s'
                                % (rel, name, mod, inc, dep))
for mod in order:
    if not any(o == mod for o in owner.values()):
        problems.append('module %s of src/LAYERS has no file' % mod)

# function lengths: a definition starts at its return type after a blank or
# comment line, opens with "{" alone, ends with "}" alone
longest, too_long = (0, ''), []
for dirpath, names in c_files():
    for name in sorted(n for n in names if n.endswith('.c')):
        lines = open(os.path.join(dirpath, name)).read().split('\n')
        for i, line in enumerate(lines):
            if line != '{':
                continue
            j = i - 1
            while j >= 0 and lines[j].strip() and not lines[j].startswith(('/*', ' */', '#')):
                j -= 1
            decl = ' '.join(lines[j + 1:i])
            m = re.search(r'(\w+)\(', decl)
            if not m or '=' in decl:
                continue
            k = i
            while k < len(lines) and lines[k] != '}':
                k += 1
            n = k - j
            where = '%s (%s/%s)' % (m.group(1), os.path.relpath(dirpath, root), name)
            longest = max(longest, (n, where))
            if n > 80:
                too_long.append('%s: %d lines' % (where, n))
if too_long:
    print('not ok - functions of src/ over 80 lines: ' + '; '.join(too_long))
else:
    print('ok - no function of src/ is over 80 lines (the longest: %s, %d)' % (longest[1], longest[0]))

# one layer per folder
layers_of = {}
for mod in order:
    layers_of.setdefault(folder[mod], set()).add(layer[mod])
mixed = ['%s holds layers %s' % (fold, ', '.join(sorted(ls))) for fold, ls in layers_of.items() if len(ls) > 1]
if mixed:
    print('not ok - a folder of src/ holds more than one layer: ' + '; '.join(mixed))
else:
    print('ok - each folder of src/ holds one layer (%d folders)' % len(layers_of))

# every SQL-callable C function under src/api/, and no .c file over 600 lines
outside, big, nfuncs, largest = [], [], 0, (0, '')
for dirpath, names in c_files():
    for name in sorted(n for n in names if n.endswith('.c')):
        rel = os.path.relpath(os.path.join(dirpath, name), root)
        text = open(os.path.join(dirpath, name)).read()
        funcs = re.findall(r'^PG_FUNCTION_INFO_V1\((\w+)\)', text, flags=re.M)
        nfuncs += len(funcs)
        if funcs and not rel.startswith('src/api/'):
            outside.append('%s (%s)' % (rel, ', '.join(funcs)))
        n = text.count('\n')
        largest = max(largest, (n, rel))
        if n > 600:
            big.append('%s: %d lines' % (rel, n))
check = lambda ok, good, bad: print(('ok - ' + good) if ok else ('not ok - ' + bad))
check(not outside, 'every SQL-callable C function (%d) is in src/api/' % nfuncs,
      'SQL-callable C functions outside src/api/: ' + '; '.join(outside))
check(not big, 'no .c file of src/ is over 600 lines (the largest: %s, %d)' % (largest[1], largest[0]),
      '.c files of src/ over 600 lines: ' + '; '.join(big))

# docs/architecture.md's module list, generated from src/LAYERS
lines, seen = [], []
for mod in order:
    if folder[mod] not in seen:
        seen.append(folder[mod])
        lines.append('%-22s %s' % (folder[mod] + '/', layer[mod]))
    lines.append('  %-20s %s' % (mod, about[mod]))
    if extras[mod]:
        lines.append('  %-20s   (%s)' % ('', ', '.join(extras[mod] if mod == 'init' else [mod + '.c'] + extras[mod])))
block = '```\n' + '\n'.join(lines) + '\n```'
doc_path = os.path.join(root, 'docs', 'architecture.md')
doc = open(doc_path).read()
begin, end = '<!-- the modules: generated from src/LAYERS by bash test/layers.sh --write -->', '<!-- end of the modules -->'
if begin in doc and end in doc:
    current = doc[doc.index(begin) + len(begin):doc.index(end)].strip()
    if write and current != block:
        doc = doc[:doc.index(begin) + len(begin)] + '\n' + block + '\n' + doc[doc.index(end):]
        open(doc_path, 'w').write(doc)
        current = block
    check(current == block, "docs/architecture.md's module list is src/LAYERS' (%d modules)" % len(order),
          "docs/architecture.md's module list differs from src/LAYERS: run bash test/layers.sh --write")
else:
    check(False, '', 'docs/architecture.md has no generated module list (%s ... %s)' % (begin, end))

if problems:
    print('not ok - the layer rule of src/LAYERS: %d violation(s)' % len(problems))
    for p in problems:
        print('#   ' + p)
else:
    print('ok - the layer rule of src/LAYERS holds: %d files in %d modules, %d includes of idem headers, none up or sideways'
          % (files, len(order), includes))
PY
