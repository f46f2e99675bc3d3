#!/usr/bin/python3
"""The article's HTTP API in FastAPI, on idem_pg's ASGI middleware (the
same routes and environment as flask_app.py).  Run: python3 fastapi_app.py"""
import os

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

from idem_pg.asgi import IdempotencyMiddleware, context
from idem_pg.http import Routes, Settings


def owner_of(scope):
    value = dict(scope["headers"]).get(b"x-owner-id", b"").decode()
    return int(value) if value.isdigit() else None


pool = AsyncConnectionPool(kwargs={"options": os.environ.get("IDEM_PG_OPTIONS", "")}, min_size=2, max_size=8,
                           open=False)
app = FastAPI(on_startup=[pool.open], on_shutdown=[pool.close])
routes = (Routes()
          .add("POST", "/api/orders", "CREATE_ORDER", request=["skuId", "quantity"])
          .add("POST", "/api/accounts/{id}/debit", "DEBIT",
               request=lambda body, params: {"account": int(params["id"]), "amount": (body or {}).get("amount")}))
app.add_middleware(IdempotencyMiddleware, routes=routes, settings=Settings(
    owner=owner_of, connection=pool.connection,
    conflict_status=int(os.environ.get("IDEM_CONFLICT_STATUS", "409")),
    errors_url=os.environ.get("IDEM_ERRORS_URL"),
    server_prepare=os.environ.get("IDEM_SERVER_PREPARE") != "off"))


@app.post("/api/orders")
async def create_order(request: Request):
    idem, order = context(request.scope), await request.json()
    sku, qty = order.get("skuId"), order.get("quantity")
    if type(sku) is not int or type(qty) is not int or not 1 <= qty <= 100:
        return JSONResponse({"error": "skuId must be an integer and quantity one from 1 to 100"}, 400)
    cur = await idem.conn.execute("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (%s, %s, %s)"
                                  " RETURNING id", (idem.owner, sku, qty))
    (order_id,) = await cur.fetchone()
    idem.resource_id = order_id
    response = JSONResponse({"orderId": order_id, "skuId": sku, "quantity": qty, "status": "CREATED"}, 201,
                            {"Location": "/api/orders/%d" % order_id})
    response.set_cookie("last_order", str(order_id))        # not replayed: Set-Cookie is not stored
    return response


@app.post("/api/accounts/{account}/debit")
async def debit(account: int, request: Request):
    idem = context(request.scope)
    if type(idem.request["amount"]) not in (int, float):
        return JSONResponse({"error": "amount must be a number"}, 400)
    cur = await idem.conn.execute("SELECT * FROM debit_account(%s, %s)", (account, idem.request["amount"]))
    debit_id, balance = await cur.fetchone()
    if debit_id is None:
        return JSONResponse({"error": "insufficient funds"}, 422)
    idem.resource_id = debit_id
    return JSONResponse({"debitId": debit_id, "balance": float(balance)}, 201,
                        {"Location": "/api/debits/%d" % debit_id})


if os.environ.get("IDEM_BENCH"):
    @app.post("/bare/orders")
    async def bare_order(request: Request):
        """The same order without idem (test/bench/clients_bench.sh's baseline)."""
        order = await request.json()
        async with pool.connection() as conn:
            cur = await conn.execute("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (%s, %s, %s)"
                                     " RETURNING id", (owner_of(request.scope), order["skuId"], order["quantity"]))
            (order_id,) = await cur.fetchone()
        return JSONResponse({"orderId": order_id, "skuId": order["skuId"], "quantity": order["quantity"],
                             "status": "CREATED"}, 201)


if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8080")), log_level="warning")
