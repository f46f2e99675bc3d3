#!/usr/bin/python3
"""The same bodies through every stack (issue 39): contract.py stored the
fingerprint bodies through each stack and wrote NAME.json (body -> stored
request_hash) into a directory; every stack must have stored the same
hashes.  Prints one "ok"/"not ok" line per stack, and one for each stack
named on the command line that left no file ("not ok" when --all, which a
full run passes: every stage ran; else "skip").

  fingerprints.py DIR [--all] STACK...
"""
import json
import os
import sys

folder, args = sys.argv[1], sys.argv[2:]
strict = "--all" in args
required = [a for a in args if a != "--all"]
stored = {}
for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    if name.endswith(".json"):
        with open(os.path.join(folder, name)) as f:
            stored[name[:-5]] = json.load(f)
failures = 0
for stack in required:
    if stack not in stored:
        if strict:
            failures += 1
            print("not ok - fingerprints: %s stored the fingerprint bodies (no file)" % stack)
        else:
            print("skip - fingerprints: %s did not run here (the full test command runs every stack)" % stack)
reference = required[0] if required and required[0] in stored else (sorted(stored)[0] if stored else None)
for stack in sorted(stored):
    if stack == reference:
        continue
    same = stored[stack] == stored[reference]
    failures += 0 if same else 1
    detail = "" if same else " (%s)" % {b: (h, stored[reference].get(b)) for b, h in stored[stack].items()
                                        if h != stored[reference].get(b)}
    print("%s - fingerprints: %s stored the same request_hash as %s for the %d bodies%s"
          % ("ok" if same else "not ok", stack, reference, len(stored[reference]), detail))
if reference is None:
    failures += 1
    print("not ok - fingerprints: no stack stored the fingerprint bodies")
sys.exit(1 if failures else 0)
