#!/usr/bin/env bash
# The layer rule of src/LAYERS holds: every file of src/ belongs to exactly
# one module, sits in its module's folder, and includes idem's own headers
# only of its own module, of modules listed above it, and (for an api
# module) of no other api module; and no function of src/ is longer than
# 80 lines (from its return type to its closing brace).  Prints "ok - ..."
# / "not ok - ..." lines.
set -euo pipefail
IDEM_ROOT=$(cd "$(dirname "$0")/.." && pwd)
exec /usr/bin/python3 - "$IDEM_ROOT" <<'PY'
import os
import re
import sys

root = sys.argv[1]
order, layer, folder, owner = [], {}, {}, {}
with open(os.path.join(root, 'src', 'LAYERS')) as f:
    for line in f:
        line = line.split('#', 1)[0].split()
        if not line:
            continue
        lay, fold, mod, extra = line[0], line[1], line[2], line[3:]
        order.append(mod)
        layer[mod], folder[mod] = lay, fold
        files = extra if mod == 'init' else [mod + '.c', mod + '.h'] + extra
        for name in files:
            owner[name] = mod

problems, files, includes = [], 0, 0
for dirpath, _, names in os.walk(os.path.join(root, 'src')):
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
for dirpath, _, names in os.walk(os.path.join(root, 'src')):
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

if problems:
    print('not ok - the layer rule of src/LAYERS: %d violation(s)' % len(problems))
    for p in problems:
        print('#   ' + p)
else:
    print('ok - the layer rule of src/LAYERS holds: %d files in %d modules, %d includes of idem headers, none up or sideways'
          % (files, len(order), includes))
PY
