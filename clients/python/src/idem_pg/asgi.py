"""The contract as ASGI middleware (Starlette, FastAPI, any ASGI app).

    from psycopg_pool import AsyncConnectionPool
    from idem_pg.asgi import IdempotencyMiddleware, context

    pool = AsyncConnectionPool(open=False)       # opened at startup
    routes = Routes().add("POST", "/api/orders", "CREATE_ORDER")
    app.add_middleware(IdempotencyMiddleware, routes=routes,
                       settings=Settings(owner=owner_of, connection=pool.connection))

    @app.post("/api/orders")
    async def create_order(request: Request):
        idem = context(request.scope)             # an AsyncConnection in the claim's transaction
        ...

The owner function gets the ASGI scope.  The handler's answer is buffered
and sent once the transaction committed.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from .http import Answer, Context, Exchange, Routes, Settings, handle_async

SCOPE_KEY = "idem_pg.context"


def context(scope: Dict[str, Any]) -> Context:
    """The claim of the request being handled (in an idempotent route)."""
    return scope[SCOPE_KEY]


class IdempotencyMiddleware:
    def __init__(self, app: Callable, routes: Routes, settings: Settings):
        self.app, self.routes, self.settings = app, routes, settings

    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        found = self.routes.match(scope.get("method", ""), scope.get("path", "")) \
            if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        route, params = found
        headers: Dict[str, List[str]] = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        length = headers.get("content-length", [None])[0]
        exchange = Exchange(scope["method"], scope["path"], lambda n: headers.get(n, []),
                            int(length) if length and length.isdigit() else None, scope)
        raw: List[bytes] = []

        async def read_body(limit: int) -> bytes:
            data = bytearray()
            while True:
                message = await receive()
                data += message.get("body", b"")
                if len(data) >= limit or not message.get("more_body"):
                    break
            raw.append(bytes(data))
            return bytes(data)

        async def call(ctx: Context) -> Answer:
            inner = dict(scope)
            inner[SCOPE_KEY] = ctx
            inner["state"] = dict(scope.get("state") or {}, **{SCOPE_KEY: ctx})
            body_sent = [False]
            captured: Dict[str, Any] = {"body": bytearray()}

            async def replay_receive() -> Dict[str, Any]:
                if not body_sent[0]:
                    body_sent[0] = True
                    return {"type": "http.request", "body": raw[0] if raw else b"", "more_body": False}
                return await receive()

            async def capture(message: Dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    captured["status"] = message["status"]
                    captured["headers"] = [(n.decode("latin-1"), v.decode("latin-1"))
                                           for n, v in message.get("headers", [])]
                elif message["type"] == "http.response.body":
                    captured["body"] += message.get("body", b"")

            await self.app(inner, replay_receive, capture)
            return Answer(captured["status"], captured["headers"], bytes(captured["body"]))

        answer = await handle_async(exchange, route, params, read_body, call, self.settings)
        out = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in answer.headers
               if n.lower() != "content-length"]
        out.append((b"content-length", str(len(answer.body)).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        await send({"type": "http.response.body", "body": answer.body})
