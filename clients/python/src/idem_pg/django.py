"""The contract as Django middleware, on Django's own database connection:
the view's ORM writes and idem's record commit in one transaction.

    # settings.py
    MIDDLEWARE = [..., "idem_pg.django.IdempotencyMiddleware"]
    IDEM_PG = {"OWNER": "shop.auth.owner_of",        # request -> int or None (a callable or its dotted path)
               "CONFLICT_STATUS": 409, "MAX_BODY_BYTES": 1048576, "DATABASE": "default"}

    # views.py
    from idem_pg.django import idempotent, context

    @idempotent("CREATE_ORDER")
    def create_order(request):
        order = Order.objects.create(...)            # in the claim's transaction
        context(request).resource_id = order.id
        return JsonResponse({"orderId": order.id}, status=201)

IDEM_PG takes every setting of clients/CONTRACT.md in upper case (OWNER,
CONFLICT_STATUS, MAX_BODY_BYTES, TTL, IN_FLIGHT_RETRY_AFTER,
READ_ONLY_RETRY_AFTER, REPLAY_SET_COOKIE, ERRORS_URL, DATABASE).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, List, Optional

from .http import Answer, Context, Exchange, Route, Settings, handle

ATTRIBUTE = "_idem_pg_route"


def idempotent(operation: str, request: Any = None, key_required: bool = True) -> Callable:
    """Mark a view as idempotent under ``operation`` (see http.Route)."""
    def mark(view: Callable) -> Callable:
        setattr(view, ATTRIBUTE, Route(operation, request, key_required))
        return view
    return mark


def context(request: Any) -> Context:
    return request.idem


class IdempotencyMiddleware:
    def __init__(self, get_response: Callable):
        from django.conf import settings as django_settings
        from django.utils.module_loading import import_string
        conf = dict(getattr(django_settings, "IDEM_PG", {}))
        owner = conf.pop("OWNER")
        self.alias = conf.pop("DATABASE", "default")
        self.settings = Settings(owner=import_string(owner) if isinstance(owner, str) else owner,
                                 **{k.lower(): v for k, v in conf.items()})
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        return self.get_response(request)

    def process_view(self, request: Any, view: Callable, args: tuple, kwargs: dict) -> Optional[Any]:
        route = getattr(view, ATTRIBUTE, None)
        if route is None:
            return None
        from django.db import connections, transaction

        length = request.META.get("CONTENT_LENGTH")
        exchange = Exchange(request.method, request.path, lambda name: _header(request, name),
                            int(length) if length and length.isdigit() else None, request)

        def call(ctx: Context) -> Answer:
            request.idem = ctx
            return _answer_of(view(request, *args, **kwargs))

        @contextmanager
        def atomic():
            with transaction.atomic(using=self.alias):
                yield connections[self.alias]

        answer = handle(exchange, route, {k: str(v) for k, v in kwargs.items()},
                        lambda limit: request.body[:limit], call, self.settings, atomic)
        return _response_of(answer)


def _header(request: Any, name: str) -> List[str]:
    value = request.META.get("HTTP_" + name.upper().replace("-", "_"))
    if value is None:
        return []
    return value.split(",") if "," in value else [value]


def _answer_of(response: Any) -> Answer:
    headers = [(n, v) for n, v in response.items()]
    headers += [("Set-Cookie", m.OutputString()) for m in response.cookies.values()]
    return Answer(response.status_code, headers, bytes(response.content))


def _response_of(answer: Answer) -> Any:
    from django.http import HttpResponse
    response = HttpResponse(answer.body, status=answer.status)
    del response["Content-Type"]
    for name, value in answer.headers:
        if name.lower() == "set-cookie":
            response.cookies.load(value)
        elif name.lower() != "content-length":
            response[name] = value
    response["Content-Length"] = str(len(answer.body))
    return response
