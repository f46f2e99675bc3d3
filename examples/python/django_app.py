#!/usr/bin/python3
"""The article's HTTP API in Django (one file), on idem_pg's Django
middleware and Django's own database connection (the same routes and
environment as flask_app.py).  Run: python3 django_app.py"""
import os

import django
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.urls import path

settings.configure(
    DEBUG=False, ALLOWED_HOSTS=["127.0.0.1", "localhost"], ROOT_URLCONF=__name__, SECRET_KEY="example-only",
    MIDDLEWARE=["django.middleware.common.CommonMiddleware", "idem_pg.django.IdempotencyMiddleware"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": os.environ.get("PGDATABASE", ""),
                           "CONN_MAX_AGE": 60,
                           "OPTIONS": {"options": os.environ.get("IDEM_PG_OPTIONS", "")}}},
    IDEM_PG={"OWNER": lambda request: int(request.headers.get("X-Owner-Id", "x"))
             if request.headers.get("X-Owner-Id", "").isdigit() else None,
             "CONFLICT_STATUS": int(os.environ.get("IDEM_CONFLICT_STATUS", "409")),
             "ERRORS_URL": os.environ.get("IDEM_ERRORS_URL")})
django.setup()

from idem_pg.django import context, idempotent  # noqa: E402 - after settings


@idempotent("CREATE_ORDER", request=["skuId", "quantity"])
def create_order(request):
    idem, order = context(request), context(request).body
    sku, qty = order.get("skuId"), order.get("quantity")
    if type(sku) is not int or type(qty) is not int or not 1 <= qty <= 100:
        return JsonResponse({"error": "skuId must be an integer and quantity one from 1 to 100"}, status=400)
    with connection.cursor() as cur:                     # in the claim's transaction
        cur.execute("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (%s, %s, %s) RETURNING id",
                    (idem.owner, sku, qty))
        (order_id,) = cur.fetchone()
    idem.resource_id = order_id
    response = JsonResponse({"orderId": order_id, "skuId": sku, "quantity": qty, "status": "CREATED"}, status=201)
    response["Location"] = "/api/orders/%d" % order_id
    response.set_cookie("last_order", str(order_id))      # not replayed: Set-Cookie is not stored
    return response


@idempotent("DEBIT", request=lambda body, params: {"account": int(params["account"]),
                                                    "amount": (body or {}).get("amount")})
def debit(request, account):
    idem = context(request)
    if type(idem.request["amount"]) not in (int, float):
        return JsonResponse({"error": "amount must be a number"}, status=400)
    with connection.cursor() as cur:
        cur.execute("SELECT * FROM debit_account(%s, %s)", (account, idem.request["amount"]))
        debit_id, balance = cur.fetchone()
    if debit_id is None:
        return JsonResponse({"error": "insufficient funds"}, status=422)
    idem.resource_id = debit_id
    response = JsonResponse({"debitId": debit_id, "balance": float(balance)}, status=201)
    response["Location"] = "/api/debits/%d" % debit_id
    return response


def bare_order(request):
    """The same order without idem (test/bench/clients_bench.sh's baseline)."""
    import json
    order = json.loads(request.body)
    with connection.cursor() as cur:
        cur.execute("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (%s, %s, %s) RETURNING id",
                    (int(request.headers["X-Owner-Id"]), order["skuId"], order["quantity"]))
        (order_id,) = cur.fetchone()
    return JsonResponse({"orderId": order_id, "skuId": order["skuId"], "quantity": order["quantity"],
                         "status": "CREATED"}, status=201)


urlpatterns = [path("api/orders", create_order), path("api/accounts/<int:account>/debit", debit)]
if os.environ.get("IDEM_BENCH"):
    urlpatterns.append(path("bare/orders", bare_order))

if __name__ == "__main__":
    from django.core.servers.basehttp import WSGIRequestHandler, WSGIServer, run
    from django.core.wsgi import get_wsgi_application
    WSGIServer.request_queue_size = 128                 # a burst of clients, not 5
    WSGIRequestHandler.disable_nagle_algorithm = True   # headers and body go out as written (keep-alive)
    run("127.0.0.1", int(os.environ.get("PORT", "8080")), get_wsgi_application(), threading=True)
