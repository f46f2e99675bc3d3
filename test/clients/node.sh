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

build_node_client || exit 0
app=$NODE_APP
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
