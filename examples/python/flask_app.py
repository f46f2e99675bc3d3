#!/usr/bin/python3
"""The article's HTTP API in Flask, on idem_pg's WSGI middleware.

  POST /api/orders                 {"skuId": 1, "quantity": 2}
  POST /api/accounts/{id}/debit    {"amount": 100}
  GET  /                           the order page (examples/web/index.html)

Both POSTs need an Idempotency-Key and an X-Owner-Id header (a stand-in
for real authentication: a real service takes the owner from its session).
Environment: PORT, the libpq variables, IDEM_CONFLICT_STATUS (409 or 422),
IDEM_SERVER_PREPARE=off (behind PgBouncer in transaction mode), REDIS_URL
(the fast layer), IDEM_PG_OPTIONS (libpq options).
"""
import os

from flask import Flask, request, send_file
from psycopg_pool import ConnectionPool

from idem_pg.http import Routes, Settings
from idem_pg.wsgi import IdempotencyMiddleware, context


def owner_of(environ):
    value = environ.get("HTTP_X_OWNER_ID", "")
    return int(value) if value.isdigit() else None


app = Flask(__name__)
app.config["PROPAGATE_EXCEPTIONS"] = True    # a failing handler's error reaches the middleware, which answers it
pool = ConnectionPool(kwargs={"options": os.environ.get("IDEM_PG_OPTIONS", "")}, min_size=2, max_size=8)
fast = None
if os.environ.get("REDIS_URL"):
    import redis
    from idem_pg.fast import FastLayer
    fast = FastLayer(redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=0.05,
                                          socket_connect_timeout=0.05))
routes = (Routes()
          .add("POST", "/api/orders", "CREATE_ORDER", request=["skuId", "quantity"])
          .add("POST", "/api/accounts/{id}/debit", "DEBIT",
               request=lambda body, params: {"account": int(params["id"]), "amount": (body or {}).get("amount")}))
app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, routes, Settings(
    owner=owner_of, connection=pool.connection, fast=fast,
    conflict_status=int(os.environ.get("IDEM_CONFLICT_STATUS", "409")),
    errors_url=os.environ.get("IDEM_ERRORS_URL"),
    server_prepare=os.environ.get("IDEM_SERVER_PREPARE") != "off"))


@app.get("/")
def page():
    return send_file(os.path.join(os.path.dirname(__file__), "..", "web", "index.html"))


@app.post("/api/orders")
def create_order():
    idem, order = context(request.environ), request.get_json()
    sku, qty = order.get("skuId"), order.get("quantity")
    if type(sku) is not int or type(qty) is not int or not 1 <= qty <= 100:
        return {"error": "skuId must be an integer and quantity one from 1 to 100"}, 400
    (order_id,) = idem.conn.execute("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (%s, %s, %s)"
                                    " RETURNING id", (idem.owner, sku, qty)).fetchone()
    idem.resource_id = order_id
    response = app.json.response({"orderId": order_id, "skuId": sku, "quantity": qty, "status": "CREATED"})
    response.status_code = 201
    response.headers["Location"] = "/api/orders/%d" % order_id
    response.set_cookie("last_order", str(order_id))         # not replayed: Set-Cookie is not stored
    return response


@app.post("/api/accounts/<int:account>/debit")
def debit(account):
    idem = context(request.environ)
    if type(idem.request["amount"]) not in (int, float):
        return {"error": "amount must be a number"}, 400
    debit_id, balance = idem.conn.execute("SELECT * FROM debit_account(%s, %s)",
                                          (account, idem.request["amount"])).fetchone()
    if debit_id is None:
        return {"error": "insufficient funds"}, 422
    idem.resource_id = debit_id
    return {"debitId": debit_id, "balance": float(balance)}, 201, {"Location": "/api/debits/%d" % debit_id}


if os.environ.get("IDEM_BENCH"):
    @app.post("/bare/orders")
    def bare_order():
        """The same order without idem (test/bench/clients_bench.sh's baseline)."""
        order = request.get_json()
        with pool.connection() as conn:
            (order_id,) = conn.execute("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (%s, %s, %s)"
                                       " RETURNING id", (owner_of(request.environ), order["skuId"],
                                                         order["quantity"])).fetchone()
        return {"orderId": order_id, "skuId": order["skuId"], "quantity": order["quantity"], "status": "CREATED"}, 201


if __name__ == "__main__":
    from werkzeug.serving import run_simple
    run_simple("127.0.0.1", int(os.environ.get("PORT", "8080")), app, threaded=True)
