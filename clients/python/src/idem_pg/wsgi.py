"""The contract as WSGI middleware (Flask, or any WSGI application).

    from idem_pg.http import Routes, Settings
    from idem_pg.wsgi import IdempotencyMiddleware, context

    routes = Routes().add("POST", "/api/orders", "CREATE_ORDER")
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, routes, Settings(
        owner=lambda environ: current_user_id(environ), connection=pool.connection))

    @app.post("/api/orders")
    def create_order():
        idem = context(request.environ)          # the claim's transaction: write there
        row = idem.conn.execute("INSERT INTO shop_order ... RETURNING id", ...).fetchone()
        idem.resource_id = row[0]
        return {"orderId": row[0]}, 201

The owner function gets the WSGI environ.  The handler's answer is
buffered (idempotent answers are small) and sent once the transaction
committed.
"""
from __future__ import annotations

import io
from typing import Any, Callable, Iterable, List, Optional

from .http import Answer, Context, Exchange, Routes, Settings, handle

ENVIRON_KEY = "idem_pg.context"


def context(environ: dict) -> Context:
    """The claim of the request being handled (in an idempotent route)."""
    return environ[ENVIRON_KEY]


class IdempotencyMiddleware:
    def __init__(self, app: Callable, routes: Routes, settings: Settings):
        self.app, self.routes, self.settings = app, routes, settings

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        found = self.routes.match(environ.get("REQUEST_METHOD", "GET"), path)
        if found is None:
            return self.app(environ, start_response)
        route, params = found
        length = _int(environ.get("CONTENT_LENGTH"))
        exchange = Exchange(environ["REQUEST_METHOD"], path, lambda name: _header(environ, name), length,
                            environ)
        stream = environ.get("wsgi.input")
        raw: List[bytes] = []

        def read_body(limit: int) -> bytes:
            if stream is None or (length is None and not environ.get("wsgi.input_terminated")):
                data = b""
            else:
                data = stream.read(limit if length is None else min(length, limit))
            raw.append(data)
            return data

        def call(ctx: Context) -> Answer:
            inner = dict(environ)
            inner[ENVIRON_KEY] = ctx
            inner["wsgi.input"] = io.BytesIO(raw[0] if raw else b"")
            captured: dict = {}

            def capture(status: str, headers: list, exc_info: Any = None) -> Callable:
                captured["status"], captured["headers"] = int(status.split(" ", 1)[0]), list(headers)
                return lambda data: captured.setdefault("written", []).append(data)

            result = self.app(inner, capture)
            try:
                body = b"".join(captured.pop("written", [])) + b"".join(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
            return Answer(captured["status"], captured["headers"], body)

        answer = handle(exchange, route, params, read_body, call, self.settings)
        headers = [(n, v) for n, v in answer.headers if n.lower() != "content-length"]
        headers.append(("Content-Length", str(len(answer.body))))
        start_response("%d %s" % (answer.status, _reason(answer.status)), headers)
        return [answer.body]


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _header(environ: dict, name: str) -> List[str]:
    value = environ.get("HTTP_" + name.upper().replace("-", "_"))
    if value is None:
        return []
    # a server joins repeated fields with ","; a key never contains one
    return [v for v in value.split(",")] if "," in value else [value]


def _reason(status: int) -> str:
    from http import HTTPStatus
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
