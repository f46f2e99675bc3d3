"""Every relative link of idem's Markdown pages names a file that exists,
and every #anchor a heading of the page it points to (GitHub's slugs).
Prints the number of links checked, then each broken one; exits 1 if any."""
import glob
import os
import re
import sys

root = sys.argv[1]
pages = ['README.md', 'CHANGELOG.md', 'test/README.md', 'examples/README.md', 'clients/CONTRACT.md',
         'clients/python/README.md', 'clients/node/README.md', 'clients/java/README.md'] + \
    sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, 'docs', '*.md')))


def text(path):
    with open(path, encoding='utf-8') as f:
        return re.sub(r'^```.*?^```', '', f.read(), flags=re.S | re.M)


def slugs(path):
    out = set()
    for h in re.findall(r'^#{1,6} (.*)$', text(path), flags=re.M):
        s = re.sub(r'[^\w\- ]', '', h.replace('`', '').lower()).replace(' ', '-')
        out.add(s)
    return out


checked, broken = 0, []
for page in pages:
    path = os.path.join(root, page)
    if not os.path.exists(path):
        broken.append(page + ': the page is missing')
        continue
    for url in re.findall(r'\[[^\]]*\]\(([^)\s]+)\)', text(path)):
        if re.match(r'^(https?|mailto):', url):
            continue
        checked += 1
        target, _, anchor = url.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        if not os.path.exists(dest):
            broken.append('%s: %s (no such file)' % (page, url))
        elif anchor and dest.endswith('.md') and anchor not in slugs(dest):
            broken.append('%s: %s (no such heading)' % (page, url))
print(checked)
for b in broken:
    print(b)
sys.exit(1 if broken else 0)
