#!/usr/bin/env bash
# The Node library (clients/node) as a user gets it: `npm pack`, the
# tarball installed with pg, redis and express from npm into a clean
# directory; its API tests (node --test) against a real server; the Express
# and node:http examples through the HTTP contract (test/clients/contract.py);
# the Redis fast layer (Express).  One "ok - ..." or "not ok - ..." line per check.
#
#   bash test/clients/node.sh          (after the build: test/run_all.sh runs it)
source "$(dirname "$0")/common.sh"

ensure_client_packages nodejs npm python3-psycopg redis-server
start_clients_server

log "npm pack clients/node; npm install into a clean directory"
app=$IDEM_TMP/node-app
mkdir -p "$app/test"
if ! tarball=$(cd "$CLIENTS/node" && npm pack --silent --pack-destination "$IDEM_TMP" 2>"$IDEM_TMP/pack.log"); then
	cat "$IDEM_TMP/pack.log" >&2
	echo "not ok - node: npm pack"
	exit 0
fi
echo '{"name": "idem-node-test", "private": true, "type": "module"}' >"$app/package.json"
if ! (cd "$app" && npm install --no-audit --no-fund --silent "$IDEM_TMP/$tarball" pg@^8.13.0 redis@^4.7.0 express@^5.1.0 \
	>"$IDEM_TMP/npm.log" 2>&1); then
	cat "$IDEM_TMP/npm.log" >&2
	echo "not ok - node: the tarball and its peers install"
	exit 0
fi
echo "ok - node: npm pack makes $tarball, installed with pg, redis and express"
cp "$EXAMPLES/node/server.js" "$EXAMPLES/node/plain.js" "$app/"
cp "$CLIENTS/node/test/api.test.js" "$app/test/"
check "node: the installed package is the tarball's (no path into the tree)" yes \
	"$([ -f "$app/node_modules/idem-pg/src/index.js" ] && [ ! -L "$app/node_modules/idem-pg" ] && echo yes || echo no)"

log "node --test clients/node/test"
(cd "$app" && node --test --test-reporter=tap test/ >"$IDEM_TMP/node-test.log" 2>&1) ||
	{ log "node --test failed:"; tail -n 40 "$IDEM_TMP/node-test.log" >&2; }
grep -E '^(not )?ok [0-9]+ - ' "$IDEM_TMP/node-test.log" | tap_lines "node api"

contract_of node-express 8000 node "$app/server.js"
contract_of node-http 8100 node "$app/plain.js"
log "the fast layer: examples/node/server.js with Redis"
fast_layer_of node-express 8500 node "$app/server.js"
