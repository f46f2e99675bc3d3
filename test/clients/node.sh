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
cp "$CLIENTS/node/test/"*.test.js "$app/test/"
check "node: the installed package is the tarball's (no path into the tree)" yes \
	"$([ -f "$app/node_modules/idem-pg/src/index.js" ] && [ ! -L "$app/node_modules/idem-pg" ] && echo yes || echo no)"

# as docs/clients.md says, from a checkout: npm install ./clients/node pg
mkdir -p "$IDEM_TMP/node-checkout"
check "node: npm install ./clients/node pg works in an empty folder, as the docs say" "$(lib_version)" \
	"$( (cd "$IDEM_TMP/node-checkout" && cp -r "$CLIENTS/node" ./idem-node &&
		echo '{"name": "checkout-test", "private": true, "type": "module"}' >package.json &&
		npm install --no-audit --no-fund --silent ./idem-node pg >/dev/null 2>&1 &&
		node -e "import('idem-pg').then(async (m) => { const fs = await import('node:fs'); console.log(JSON.parse(fs.readFileSync('node_modules/idem-pg/package.json')).version + (typeof m.begin === 'function' ? '' : ' no begin')); })") 2>&1 | tail -n 1)"

log "node --test clients/node/test"
(cd "$app" && node --test --test-reporter=tap test/ >"$IDEM_TMP/node-test.log" 2>&1) ||
	{ log "node --test failed:"; tail -n 40 "$IDEM_TMP/node-test.log" >&2; }
grep -E '^(not )?ok [0-9]+ - ' "$IDEM_TMP/node-test.log" | tap_lines "node api"

contract_of node-express 8000 node "$app/server.js"
contract_of node-http 8100 node "$app/plain.js"
# a body parser before the middleware (express.json() and the others):
# answered as without one, never a request left hanging (each request of
# the contract gives up after 30 s)
owner=9100
for parser in json json-verify text raw; do
	log "the contract's article tests with app.use(express.${parser%-verify}(...)) before the middleware"
	IDEM_RUN=$(new_run)
	export IDEM_RUN
	port=$(free_port)
	if start_service "node-express-$parser" "$port" IDEM_BODY_PARSER="$parser" -- node "$app/server.js"; then
		contract "node-express-$parser" "http://127.0.0.1:$port" "$owner" --quick
	else
		echo "not ok - node-express-$parser: the service starts"
	fi
	stop_services
	owner=$((owner + 100))
done
unset IDEM_RUN
log "the fast layer: examples/node/server.js with Redis"
fast_layer_of node-express 8500 node "$app/server.js"
