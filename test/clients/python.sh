#!/usr/bin/env bash
# The Python library (clients/python) as a user gets it: the wheel built
# offline (python3 -m build --no-isolation) from a copy of the tree,
# installed into a fresh venv with its dependencies and the frameworks from
# PyPI; its API tests (pytest) against a real server; the examples on
# its three middlewares (Flask/WSGI, FastAPI/ASGI, Django) through the HTTP
# contract (test/clients/contract.py); the Redis fast layer (Flask); Flask
# behind PgBouncer in transaction mode with server-side prepares off; the
# order page's double click in headless Chromium.  One "ok - ..." or
# "not ok - ..." line per check.
#
#   bash test/clients/python.sh          (after the build: test/run_all.sh runs it)
source "$(dirname "$0")/common.sh"

# Debian's: what builds the wheel offline and makes the venv, psycopg for
# the contract's own checks (/usr/bin/python3), the servers; the venv gets
# the library's dependencies and the frameworks from PyPI
ensure_client_packages python3-build python3-setuptools python3-wheel python3-venv python3-pip \
	python3-psycopg redis-server pgbouncer chromium nodejs npm
start_clients_server

build_python_client "flask>=3,<4" "fastapi>=0.110,<1" "uvicorn>=0.29,<1" "django>=5.1,<6" "pytest>=8,<9" || exit 0
# as docs/clients.md says, from a checkout: pip install ./clients/python in a venv
/usr/bin/python3 -m venv "$IDEM_TMP/venv-checkout"
check "python: pip install ./clients/python works in a fresh venv, as the docs say (psycopg from PyPI)" "$(lib_version)" \
	"$( (cd "$IDEM_TMP" && cp -r "$CLIENTS/python" checkout-python &&
		"$IDEM_TMP/venv-checkout/bin/pip" install -q --disable-pip-version-check ./checkout-python >/dev/null 2>&1 &&
		"$IDEM_TMP/venv-checkout/bin/python" -c 'import idem_pg, psycopg; print(idem_pg.__version__)') 2>&1 | tail -n 1)"
check "python: the wheel installs into a fresh venv, and that is what is imported" "$IDEM_TMP/venv" \
	"$(cd / && "$PY" -c 'import idem_pg, os; print(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(idem_pg.__file__))))))')"

log "pytest clients/python/tests"
(cd "$IDEM_TMP" && "$PY" -m pytest -v -p no:cacheprovider "$CLIENTS/python/tests" >"$IDEM_TMP/pytest.log" 2>&1) ||
	{ log "pytest failed:"; tail -n 40 "$IDEM_TMP/pytest.log" >&2; }
sed -n -E 's/^[^ ]*::([a-z_0-9]+) (PASSED|FAILED|ERROR).*/\2 \1/p' "$IDEM_TMP/pytest.log" |
	sed -E 's/^PASSED (.*)/ok - python api: \1/; s/^(FAILED|ERROR) (.*)/not ok - python api: \2/'

owner=1000
for app in flask_app fastapi_app django_app; do
	log "the contract: examples/python/$app.py"
	contract_of "python-${app%_app}" "$owner" "$PY" "$EXAMPLES/python/$app.py"
	owner=$((owner + 100))
done

log "the fast layer: examples/python/flask_app.py with Redis"
fast_layer_of python-flask 5000 "$PY" "$EXAMPLES/python/flask_app.py"

log "behind PgBouncer (transaction pooling, 10 server connections), server-side prepares off"
bport=$(free_port)
mkdir -p "$IDEM_TMP/pgbouncer"
cat >"$IDEM_TMP/pgbouncer/pgbouncer.ini" <<INI
[databases]
idem_clients = host=127.0.0.1 port=$PGPORT dbname=idem_clients user=$SERVICE_USER
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 10
max_client_conn = 200
ignore_startup_parameters = options
logfile = $IDEM_TMP/pgbouncer/pgbouncer.log
pidfile = $IDEM_TMP/pgbouncer/pgbouncer.pid
INI
chown -R postgres: "$IDEM_TMP/pgbouncer"
runuser -u postgres -- pgbouncer "$IDEM_TMP/pgbouncer/pgbouncer.ini" >/dev/null 2>&1 &
bouncer_pid=$!
until_ok "$PG_BINDIR/psql" -X -q -h 127.0.0.1 -p "$bport" -U "$SERVICE_USER" -d idem_clients -c 'SELECT 1' || true
port=$(free_port)
if start_service python-pgbouncer "$port" PGPORT="$bport" IDEM_SERVER_PREPARE=off -- "$PY" "$EXAMPLES/python/flask_app.py"; then
	contract python-pgbouncer "http://127.0.0.1:$port" 6000
	check "python-pgbouncer: the service's sessions went through PgBouncer's pool (at most 10 server connections)" yes \
		"$("$PG_BINDIR/psql" -X -At -c "SELECT CASE WHEN count(*) BETWEEN 1 AND 10 THEN 'yes' ELSE count(*)::text END
		     FROM pg_stat_activity WHERE usename = '$SERVICE_USER'")"
else
	echo "not ok - python-pgbouncer: the service starts behind PgBouncer"
fi
stop_services
kill "$bouncer_pid" 2>/dev/null || true
bouncer_pid=

browser_double_click browser python-page "$PY" "$EXAMPLES/python/flask_app.py"
stop_services
