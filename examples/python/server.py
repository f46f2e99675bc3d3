#!/usr/bin/python3
"""The article's HTTP API on idem, in Python: the standard library's HTTP
server, psycopg 3 with its connection pool (Debian: python3-psycopg,
python3-psycopg-pool), and an optional Redis fast layer (python3-redis).

  POST /api/orders                  Idempotency-Key, X-Owner-Id; {"skuId": 1, "quantity": 2}
  POST /api/accounts/{id}/debit     Idempotency-Key, X-Owner-Id; {"amount": 100}
  GET  /                            the order page (examples/web/index.html)

X-Owner-Id stands in for real authentication: a real service takes the
owner from its session or token, never from what the client says.

Environment: PORT (8080), the libpq variables (PGHOST, PGPORT, PGUSER,
PGDATABASE, ...), IDEM_PG_OPTIONS (libpq options, e.g. "-c
default_transaction_read_only=on"), IDEM_CONFLICT_STATUS (409, or 422 as
the IETF draft has it), REDIS_URL (the fast layer; none if unset),
IDEM_POOL_SIZE (8).
"""
import hashlib
import json
import logging
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg_pool import ConnectionPool

try:
    import redis
except ImportError:  # the fast layer is optional
    redis = None

log = logging.getLogger("idem-example")
HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(HERE, "..", "web", "index.html")
DEBIT_PATH = re.compile(r"^/api/accounts/(\d{1,18})/debit$")
CONFLICT_STATUS = int(os.environ.get("IDEM_CONFLICT_STATUS", "409"))


class ApiError(Exception):
    """An answer other than the operation's own: status, body, headers."""

    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status = status
        self.body = json.dumps({"error": message})
        self.headers = headers or {}


def error_of(e):
    """The HTTP answer to a database error (never its text beyond errmsg)."""
    state = e.sqlstate or ""
    if state == "IK001":
        return ApiError(CONFLICT_STATUS, "idempotency key reused with a different request")
    if state == "IK002":
        return ApiError(409, "a request with this idempotency key is in progress",
                        {"Retry-After": "1"})
    if state in ("22023", "22004", "22003"):
        return ApiError(400, e.diag.message_primary or "invalid request")
    if state == "42501":
        return ApiError(403, "not allowed")
    if state == "25006":
        return ApiError(503, "the service is read-only for now", {"Retry-After": "5"})
    log.error("database error %s: %s", state, e.diag.message_primary)
    return ApiError(500, "internal error")


class FastLayer:
    """Redis in front of idem for hot keys.  It never decides correctness:
    a cached response is used only when its request fingerprint matches
    this request's; a miss, an error or a timeout falls through to the
    database, which decides (IK001 included)."""

    def __init__(self, url, ttl):
        self.r = redis.Redis.from_url(url, socket_timeout=0.05, socket_connect_timeout=0.05)
        self.ttl = ttl

    @staticmethod
    def name(owner, operation, key):
        return "idem:%d:%s:%s" % (owner, operation, key)

    def cached(self, owner, operation, key, fingerprint):
        try:
            raw = self.r.get(self.name(owner, operation, key))
        except redis.RedisError:
            return None
        if raw is None:
            return None
        entry = json.loads(raw)
        return entry if entry.get("fp") == fingerprint else None

    def claim_in_flight(self, owner, operation, key, fingerprint):
        """False if another request with this fingerprint is being executed
        now: the caller answers "processing" at once.  True otherwise
        (Redis down included): the database decides."""
        try:
            held = self.r.set(self.name(owner, operation, key) + ":flight", fingerprint,
                              nx=True, px=2000)
            if held:
                return True
            return self.r.get(self.name(owner, operation, key) + ":flight") != fingerprint.encode()
        except redis.RedisError:
            return True

    def done(self, owner, operation, key, fingerprint, status, body, headers):
        try:
            pipe = self.r.pipeline()
            if status is not None:
                # no later than the record's expiry: cached for at most the
                # record's ttl, counted from its creation, which was now
                pipe.set(self.name(owner, operation, key),
                         json.dumps({"fp": fingerprint, "status": status, "body": body,
                                     "headers": headers}), ex=self.ttl)
            pipe.delete(self.name(owner, operation, key) + ":flight")
            pipe.execute()
        except redis.RedisError:
            pass


class Service:
    def __init__(self):
        options = os.environ.get("IDEM_PG_OPTIONS", "")
        kwargs = {"options": options} if options else {}
        self.pool = ConnectionPool(kwargs=kwargs, min_size=2,
                                   max_size=int(os.environ.get("IDEM_POOL_SIZE", "8")), open=True)
        self.fast = None
        if os.environ.get("REDIS_URL"):
            if redis is None:
                sys.exit("REDIS_URL is set but python3-redis is not installed")
            with self.pool.connection() as conn:
                ttl = int(conn.execute("SELECT extract(epoch FROM current_setting('idem.ttl')::interval)")
                          .fetchone()[0])
            self.fast = FastLayer(os.environ["REDIS_URL"], min(ttl, 300))

    def call(self, sql, params):
        """One statement in a transaction of its own, per request."""
        try:
            with self.pool.connection() as conn:
                with conn.transaction():
                    return conn.execute(sql, params).fetchone()
        except psycopg.Error as e:
            raise error_of(e) from None

    def create_order(self, owner, key, request):
        sku, qty = request.get("skuId"), request.get("quantity")
        if not (isinstance(sku, int) and isinstance(qty, int)) or isinstance(sku, bool) or isinstance(qty, bool):
            raise ApiError(400, "skuId and quantity must be integers")
        # idem's fingerprint of this request: SHA-256 of its canonical JSON
        fingerprint = hashlib.sha256(('{"qty":%d,"sku":%d}' % (qty, sku)).encode()).hexdigest()
        if self.fast:
            hit = self.fast.cached(owner, "CREATE_ORDER", key, fingerprint)
            if hit:
                return hit["status"], hit["body"], dict(hit["headers"], **{"X-Idem-Cache": "hit"}), True
            if not self.fast.claim_in_flight(owner, "CREATE_ORDER", key, fingerprint):
                raise ApiError(409, "a request with this idempotency key is in progress",
                               {"Retry-After": "1", "X-Idem-Cache": "in-flight"})
        status = None
        try:
            order_id, order_no, state, status, replayed = self.call(
                "SELECT order_id, order_no, status, http_status, replayed"
                " FROM idem_create_order(%s, %s, %s, %s)", (owner, key, sku, qty))
            body = json.dumps({"orderId": order_id, "orderNo": order_no, "status": state})
            headers = {"Location": "/api/orders/%d" % order_id}
            return status, body, headers, replayed
        finally:
            if self.fast:
                # a fresh execution is cached (its record expires a ttl from now)
                fresh = status is not None and not replayed
                self.fast.done(owner, "CREATE_ORDER", key, fingerprint,
                               status if fresh else None, body if fresh else None,
                               headers if fresh else None)

    def debit(self, owner, key, account, request):
        amount = request.get("amount")
        if not isinstance(amount, (int, float)) or isinstance(amount, bool):
            raise ApiError(400, "amount must be a number")
        replayed, status, body, headers, _ = self.call(
            "SELECT replayed, http_status, body::text, headers, resource_id"
            " FROM idem_run(%s, 'DEBIT', %s, %s::jsonb, 'debit_handler(jsonb)')",
            (owner, key, json.dumps({"account": account, "amount": amount})))
        return status, body, headers or {}, replayed


SERVICE = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True     # headers and body go out as they are written

    def log_message(self, fmt, *args):
        log.debug(fmt, *args)

    def answer(self, status, body, headers=None, replayed=False):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        ctype = "text/html; charset=utf-8" if status == 200 and self.path == "/" else "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/":
            with open(PAGE, "rb") as f:
                self.answer(200, f.read())
        else:
            self.answer(404, json.dumps({"error": "not found"}))

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            match = DEBIT_PATH.match(self.path)
            if self.path != "/api/orders" and not match:
                raise ApiError(404, "not found")
            key = self.headers.get("Idempotency-Key")
            if not key:
                raise ApiError(400, "the Idempotency-Key header is required")
            try:
                owner = int(self.headers.get("X-Owner-Id", ""))
            except ValueError:
                raise ApiError(400, "the X-Owner-Id header must be an integer") from None
            try:
                request = json.loads(raw or b"null")
            except ValueError:
                raise ApiError(400, "the body must be JSON") from None
            if not isinstance(request, dict):
                raise ApiError(400, "the body must be a JSON object")
            if match:
                result = SERVICE.debit(owner, key, int(match.group(1)), request)
            else:
                result = SERVICE.create_order(owner, key, request)
            status, body, headers, replayed = result
            self.answer(status, body, headers, replayed)
        except ApiError as e:
            self.answer(e.status, e.body, e.headers)
        except Exception:  # never a stack trace in a response
            log.exception("request failed")
            self.answer(500, json.dumps({"error": "internal error"}))


def main():
    global SERVICE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    SERVICE = Service()
    port = int(os.environ.get("PORT", "8080"))
    ThreadingHTTPServer.request_queue_size = 128   # a burst of clients, not 5
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    log.info("listening on 127.0.0.1:%d (fast layer: %s)", port, "redis" if SERVICE.fast else "off")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
