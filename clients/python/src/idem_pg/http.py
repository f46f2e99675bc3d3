"""The HTTP contract (clients/CONTRACT.md), independent of any framework.

The middlewares (``wsgi``, ``asgi``, ``django``) only adapt their
framework's request and response to ``Exchange`` and call ``handle`` (or
``handle_async``): the key, the limits, the owner, the fingerprinted
request, the claim, the replay, the stored headers and the problem+json
errors are decided here, once.
"""
from __future__ import annotations

import datetime as _dt
import email.utils
import json
import logging
import re
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Generator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import calls, core, tracing
from .errors import (IdemError, InFlight, InvalidRequest, KeyExpired, KeyReused, Misconfigured, Forbidden, ReadOnly,
                     SerializationFailure, sqlstate_of, translate)

log = logging.getLogger("idem_pg")

KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]{16,128}$")     # idem's own key check
MIB = 1024 * 1024

# never stored nor replayed: hop-by-hop fields (RFC 9110 7.6.1), what the
# server computes for each answer, and the middleware's own
HOP_BY_HOP = frozenset(["connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade"])
NOT_STORED = HOP_BY_HOP | {"date", "content-length", "server", "idempotent-replayed", "idempotency-expires"}

Headers = List[Tuple[str, str]]


class Problem(Exception):
    """An answer of the middleware itself: RFC 9457 problem+json."""

    TITLES = {
        "key-missing": "Idempotency-Key header required",
        "key-malformed": "Malformed Idempotency-Key header",
        "key-reused": "Idempotency key reused with a different request",
        "key-expired": "Idempotency key expired",
        "in-flight": "A request with this idempotency key is in progress",
        "read-only": "The service is read-only for now",
        "forbidden": "Not allowed",
        "no-owner": "No authenticated owner",
        "body-too-large": "Request body too large",
        "body-not-json": "Request body is not valid JSON",
        "invalid-request": "Invalid request",
        "retry": "The request raced another; retry it",
        "internal": "The request could not be completed",
    }

    def __init__(self, status: int, slug: str, detail: str, headers: Optional[Headers] = None):
        super().__init__(detail)
        self.status, self.slug, self.detail = status, slug, detail
        self.headers = headers or []

    def answer(self, settings: "Settings") -> "Answer":
        body = json.dumps({"type": "urn:idem:error:" + self.slug, "title": self.TITLES[self.slug],
                           "status": self.status, "detail": self.detail}).encode()
        # a Link only to documentation the application names: an absolute URL
        # Idempotent-Replayed on every answer (the article's flag): nothing here was replayed
        headers = [("Content-Type", "application/problem+json"), ("Idempotent-Replayed", "false")] + (
            [("Link", '<%s#%s>; rel="describedby"' % (settings.errors_url, self.slug))] if settings.errors_url else []
        ) + self.headers
        return Answer(self.status, headers, body)


@dataclass
class Answer:
    status: int
    headers: Headers
    body: bytes


@dataclass
class Route:
    """A route that is idempotent: its operation (a name, or a function of
    the framework's request returning one, or None for "not idempotent":
    the request then runs without idem), what of the request is
    fingerprinted (the whole JSON body; a list of its top-level fields; or
    a function of the body and the path parameters), whether a key is
    required (else a request without one runs without idem)."""
    operation: Union[str, Callable[[Any], Optional[str]]]
    request: Union[None, Sequence[str], Callable[[Any, Dict[str, str]], Any]] = None
    key_required: bool = True

    def request_of(self, body: Any, params: Dict[str, str]) -> Any:
        if self.request is None:
            return body
        if callable(self.request):
            return self.request(body, params)
        if not isinstance(body, dict):
            raise Problem(400, "invalid-request", "the body must be a JSON object")
        return {name: body.get(name) for name in self.request}


class Routes:
    """The routes a middleware applies the contract to, by method and path
    template ("/api/accounts/{id}/debit": {id} matches one segment)."""

    def __init__(self) -> None:
        self._routes: List[Tuple[str, re.Pattern, Route]] = []

    def add(self, method: str, template: str, operation: Union[str, Callable[[Any], Optional[str]]],
            **options: Any) -> "Routes":
        pattern = "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$"
        self._routes.append((method.upper(), re.compile(pattern), Route(operation, **options)))
        return self

    def match(self, method: str, path: str) -> Optional[Tuple[Route, Dict[str, str]]]:
        for m, pattern, route in self._routes:
            found = pattern.match(path) if m == method.upper() else None
            if found:
                return route, found.groupdict()
        return None


@dataclass
class Settings:
    """What every middleware is configured with (clients/CONTRACT.md)."""
    owner: Callable[[Any], Optional[int]]
    connection: Any = None                  # () -> context manager of a connection (psycopg_pool's pool.connection)
    conflict_status: int = 409              # 422: the IETF draft's choice
    max_body_bytes: int = MIB
    ttl: core.Ttl = None                    # None: idem.ttl
    in_flight_retry_after: int = 1
    read_only_retry_after: int = 5
    replay_set_cookie: bool = False
    errors_url: Optional[str] = None        # an absolute URL of docs/http-errors.md's copy: a Link to it
    server_prepare: bool = True             # False behind a transaction pooler (PgBouncer)
    fast: Any = None                        # a FastLayer (idem_pg.fast), or None

    def __post_init__(self) -> None:
        if self.conflict_status not in (409, 422):
            raise ValueError("conflict_status must be 409 or 422")
        if self.errors_url is not None and not re.match(r"^https?://[^/\s]+", self.errors_url):
            raise ValueError("errors_url must be an absolute http(s) URL (or None: no Link)")
        if self.fast is not None and getattr(self.fast, "settings", None) is None:
            self.fast.settings = self


@dataclass
class Context:
    """What the route's handler gets: the connection of the transaction the
    claim is in (write the business rows there), and the claim."""
    conn: Any
    owner: int
    operation: str
    key: str
    request: Any                            # what was fingerprinted
    body: Any                               # the parsed JSON body
    params: Dict[str, str]
    resource_id: Optional[int] = None       # set it: stored with the record


@dataclass
class Exchange:
    """A request as the contract needs it, from a middleware."""
    method: str
    path: str
    header: Callable[[str], List[str]]      # all values of a header (lower-case name)
    content_length: Optional[int]
    native: Any                             # the framework's request, for the owner function


def resolve(route: Route, native: Any) -> Optional[Route]:
    """The route with its operation's name (None: not idempotent)."""
    if not callable(route.operation):
        return route
    name = route.operation(native)
    return None if name is None else Route(name, route.request, route.key_required)


def parse_key(values: List[str]) -> Optional[str]:
    """The Idempotency-Key: an RFC 8941 sf-string ("..."), or a bare value
    for compatibility; None when absent.  Problem 400 when malformed."""
    if not values:
        return None
    if len(values) > 1:
        raise Problem(400, "key-malformed", "send one Idempotency-Key header")
    value = values[0].strip(" \t")
    if value.startswith('"'):
        m = re.fullmatch(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"', value)
        if not m:
            raise Problem(400, "key-malformed", "the Idempotency-Key is not a valid structured-field string")
        value = re.sub(r'\\(["\\])', r"\1", m.group(1))
    if not KEY_PATTERN.match(value):
        raise Problem(400, "key-malformed",
                      "an idempotency key is 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'")
    return value


def parse_body(raw: bytes) -> Any:
    """The request's JSON value.  What PostgreSQL or canonical JSON would
    refuse, or read as another request, is 400 invalid-request here, as in
    every stack (idem 1.13): a byte order mark, bytes that are not UTF-8, a
    number beyond an IEEE 754 double (1e400), a \\u0000."""
    if not raw:
        return None
    if raw.startswith(b"\xef\xbb\xbf"):
        raise Problem(400, "invalid-request", "the request body must not start with a byte order mark")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Problem(400, "invalid-request", "the request body is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        raise Problem(400, "body-not-json", "the request body must be JSON") from None
    _check_json_value(value)
    return value


def _check_json_value(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            raise Problem(400, "invalid-request", INVALID_DETAIL["22003"])
        elif isinstance(v, str) and "\x00" in v:
            raise Problem(400, "invalid-request", INVALID_DETAIL["22P05"])


# What a client is told of a refused request: idem's own words for 22023 (a
# key its policy refuses...), never PostgreSQL's own error text.
INVALID_DETAIL = {
    "22003": "a number in the request body is outside the range of canonical JSON (an IEEE 754 double);"
             " send it as a string",
    "22P05": "the request body must not contain \\u0000",
    "22P02": "the request body must be JSON",
}


def invalid_detail(error: InvalidRequest) -> str:
    if error.sqlstate == "22023":
        return error.message
    return INVALID_DETAIL.get(error.sqlstate or "", "the request is not valid")


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def check_length(length: Optional[int], settings: Settings) -> None:
    if length is not None and length > settings.max_body_bytes:
        raise Problem(413, "body-too-large", "the request body is over %d bytes" % settings.max_body_bytes)


# What joins the lines of Set-Cookie in the one stored value: the unit
# separator, a control character no cookie may hold (RFC 6265), never a
# newline (idem 1.13 refuses a CR or LF in a stored header: a replay would
# split the response).  A replay splits on it, and on the newline 1.12 used.
COOKIE_SEP = "\x1f"


def stored_headers(headers: Headers, settings: Settings) -> Dict[str, str]:
    """The response headers kept with the record, lower-cased (values of
    one name joined by ", "; Set-Cookie lines by COOKIE_SEP, and only when
    settings.replay_set_cookie)."""
    connection_named = {v.strip().lower() for n, val in headers if n.lower() == "connection" for v in val.split(",")}
    kept: Dict[str, str] = {}
    for name, value in headers:
        n = name.lower()
        if n in NOT_STORED or n in connection_named or (n == "set-cookie" and not settings.replay_set_cookie):
            continue
        if n in kept:
            kept[n] += (COOKIE_SEP if n == "set-cookie" else ", ") + value
        else:
            kept[n] = value
    return kept


# A header a server may send: an RFC 9110 token for a name, a value with no
# control character but a tab.  A stored one that is not (a record written
# before idem 1.14 checked names) is never replayed.
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_UNSENDABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


def replayed_headers(stored: Optional[Mapping[str, str]]) -> Headers:
    out: Headers = []
    for name, value in (stored or {}).items():
        if not _TOKEN.match(name):
            continue
        if name.lower() == "set-cookie":
            out.extend((name, line) for line in re.split("[\n\x1f]", value) if not _UNSENDABLE.search(line))
        elif not _UNSENDABLE.search(value):
            out.append((name, value))
    return out


def http_date(at: Optional[_dt.datetime]) -> Optional[str]:
    if at is None or at.year > 9999 or at == _dt.datetime.max.replace(tzinfo=at.tzinfo):
        return None
    return email.utils.format_datetime(at.astimezone(_dt.timezone.utc), usegmt=True)


class HandlerError(Exception):
    """An exception the route's handler raised (it reached the middleware)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def problem_of(error: BaseException, settings: Settings) -> Problem:
    """The answer to an error (nothing internal in it: the rest goes to the
    log, without the key).  Of the handler's own errors only a read-only
    server (25006) and a serialization failure (40001) have answers of
    their own; the rest is a 500."""
    if isinstance(error, Problem):
        return error
    if isinstance(error, HandlerError):
        state = sqlstate_of(error.error)
        if state in ("25006", "40001"):
            return problem_of(translate(error.error), settings)
        # with its traceback: the file and line that raised
        log.error("idem_pg: the handler failed: %s", _describe(error.error), exc_info=error.error)
        return Problem(500, "internal", "the request could not be completed")
    if isinstance(error, KeyReused):
        return Problem(settings.conflict_status, error.problem_type,
                       "this idempotency key was used with a different request; send a new key for a new request")
    if isinstance(error, KeyExpired):
        return Problem(error.http_status, error.problem_type,
                       "this idempotency key expired and its request is not executed again; send a new key for a new request")
    if isinstance(error, InFlight):
        return Problem(error.http_status, error.problem_type, "the first request with this key is still being processed; retry later",
                       [("Retry-After", str(settings.in_flight_retry_after))])
    if isinstance(error, ReadOnly):
        return Problem(error.http_status, error.problem_type, "the service cannot take writes now; retry later",
                       [("Retry-After", str(settings.read_only_retry_after))])
    if isinstance(error, Forbidden):
        return Problem(error.http_status, error.problem_type, "this request is not allowed for this owner or operation")
    if isinstance(error, InvalidRequest):
        return Problem(error.http_status, error.problem_type, invalid_detail(error))
    if isinstance(error, SerializationFailure):
        return Problem(error.http_status, error.problem_type, "the request raced another one; retry it", [("Retry-After", "0")])
    if isinstance(error, Misconfigured):
        if error.sqlstate != "42501":       # a missing grant is logged once per process (_not_granted)
            log.error("idem_pg: the database is not set up for idem: %s", _describe(error))
        return Problem(500, "internal", "the request could not be completed")
    log.error("idem_pg: request failed: %s", _describe(error),
              exc_info=None if isinstance(error, IdemError) else error)
    return Problem(500, "internal", "the request could not be completed")


def _describe(error: BaseException) -> str:
    if isinstance(error, IdemError):
        return "%s %s" % (error.sqlstate, error.message)
    return "%s: %s" % (type(error).__name__, error)


def _finished(expires: Optional[_dt.datetime], replayed: bool,
              status: int, headers: Headers, body: bytes) -> Answer:
    out = list(headers) + [("Idempotent-Replayed", "true" if replayed else "false")]
    date = http_date(expires)
    if date:
        out.append(("Idempotency-Expires", date))
    return Answer(status, out, body)


def replay_of(outcome: core.Outcome) -> Answer:
    body = (outcome.body or "").encode()
    return _finished(outcome.expires_at, True, outcome.http_status or 200,
                     replayed_headers(outcome.headers), body)


class _Discard(Exception):
    """Roll the claim back and send this answer (a 5xx of the handler)."""

    def __init__(self, answer: Answer):
        super().__init__("discarded")
        self.answer = answer


def _failed(app_answer: Answer, settings: Settings) -> Answer:
    """A 5xx (or 1xx) of the handler: nothing is stored, the claim rolls
    back, the key stays retryable.  Its status (and Retry-After) is kept;
    its body, which may be a framework's error page or worse, is not."""
    status = app_answer.status if 500 <= app_answer.status <= 599 else 500
    retry = [(n, v) for n, v in app_answer.headers if n.lower() == "retry-after"]
    return Problem(status, "internal", "the request could not be completed; nothing was done: retry it",
                   retry).answer(settings)


def _check_json_body(answer: Answer, route: Route) -> Optional[core.RawJson]:
    if not answer.body:
        return None
    try:
        json.loads(answer.body)
    except (ValueError, UnicodeDecodeError):
        log.error("idem_pg: the handler of operation %s answered a body that is not JSON: not stored",
                  route.operation)
        raise Problem(500, "internal", "the request could not be completed") from None
    return core.RawJson(answer.body)


@dataclass
class Prepared:
    route: Route
    key: str
    owner: int
    body: Any
    request: Any
    params: Dict[str, str]
    fingerprint: Optional[str] = None
    marker: Optional[str] = None


def prepare(exchange: Exchange, route: Route, params: Dict[str, str], raw_body: bytes,
            settings: Settings, key: str) -> Prepared:
    """Everything checked before anything is claimed."""
    check_length(len(raw_body), settings)
    body = parse_body(raw_body)
    owner = settings.owner(exchange.native)
    if owner is None:
        raise Problem(401, "no-owner", "the request has no authenticated owner")
    return Prepared(route, key, int(owner), body, route.request_of(body, params), params)


def _storable(p: Prepared, settings: Settings, app_answer: Answer) -> Optional[core.RawJson]:
    """The handler's answer's body as idem_finish stores it; a 5xx is
    discarded (_Discard), a body that is not JSON is a 500."""
    if not 200 <= app_answer.status <= 499:
        raise _Discard(_failed(app_answer, settings))
    return _check_json_body(app_answer, p.route)


# The contract, written once for both kinds of framework: the steps are a
# generator that yields what needs the framework or the database (the
# effects below) and is sent each one's result, or thrown its error;
# ``handle`` performs the effects synchronously, ``handle_async`` awaits
# them.  (psycopg writes its async classes and generates the sync ones;
# here the I/O is five effects, so a shared core needs no generator of code.)

class _Call(NamedTuple):
    """Run the framework's handler with this context."""
    ctx: Context


class _Read(NamedTuple):
    """The request's body, up to n bytes."""
    n: int


class _Fast(NamedTuple):
    """A call of the fast layer: short and bounded (a thread when async)."""
    fn: Callable[..., Any]
    args: tuple


class _Db(NamedTuple):
    """One of idem's calls on the transaction's connection."""
    call: calls.Call


class _Transaction(NamedTuple):
    """Run steps(connection) in a transaction of their own; commit if they return."""
    steps: Callable[[Any], Generator[Any, Any, Any]]


def _answer(exchange: Exchange, route: Route, params: Dict[str, str], settings: Settings) -> Generator:
    try:
        return (yield from _contract(exchange, route, params, settings))
    except _Discard as d:
        return d.answer
    except Exception as e:  # noqa: BLE001 - every error becomes an answer
        return problem_of(e, settings).answer(settings)


def _contract(exchange: Exchange, route: Route, params: Dict[str, str], settings: Settings) -> Generator:
    route = resolve(route, exchange.native)
    key = parse_key(exchange.header("idempotency-key")) if route is not None else None
    if key is None:
        if route is not None and route.key_required:
            raise Problem(400, "key-missing", "this request needs an Idempotency-Key header")
        return (yield _Call(Context(None, 0, route.operation if route else "", "", None, None, params)))
    check_length(exchange.content_length, settings)
    p = prepare(exchange, route, params, (yield _Read(settings.max_body_bytes + 1)), settings, key)
    fast = settings.fast
    if fast is not None:
        hit = yield _Fast(fast.before, (p,))
        if hit is not None:
            return hit
    try:
        answer, outcome = yield from _execute(p, params, settings)
        if fast is not None:
            yield _Fast(fast.after, (p, answer, outcome))
        return answer
    finally:
        if fast is not None:
            yield _Fast(fast.release, (p,))


def _execute(p: Prepared, params: Dict[str, str], settings: Settings) -> Generator:
    try:
        return (yield _Transaction(lambda db: _claim_and_run(p, params, settings, db)))
    except Forbidden:
        granted, role = yield _Transaction(lambda db: _app_grants())
        if not granted:
            raise _not_granted(role) from None
        raise


def _app_grants() -> Generator:
    return (yield _Db(calls.app_grants()))


def _claim_and_run(p: Prepared, params: Dict[str, str], settings: Settings, db: Any) -> Generator:
    """In the request's transaction: claim (or replay), run the handler,
    store its 2xx-4xx answer (a 5xx is discarded).  Returns the handler's
    answer, for its caller, and the answer as stored (redacted), for a copy
    kept elsewhere (the fast layer)."""
    trace = tracing.traceparent()
    if trace is not None:       # the transaction's emits and submits carry the request's trace
        yield _Db(calls.set_trace_context(trace))
    outcome = yield _Db(calls.begin(p.owner, p.route.operation, p.key, p.request, settings.ttl))
    if outcome.replayed:
        return replay_of(outcome), outcome
    ctx = Context(db, p.owner, p.route.operation, p.key, p.request, p.body, params)
    try:
        app_answer = yield _Call(ctx)
    except Exception as e:  # noqa: BLE001 - the handler's, answered by problem_of
        raise HandlerError(e) from e
    body = _storable(p, settings, app_answer)
    stored = yield _Db(calls.finish_stored(p.owner, p.route.operation, p.key, app_answer.status, body,
                                           ctx.resource_id, stored_headers(app_answer.headers, settings)))
    return _finished(stored.expires_at, False, app_answer.status, app_answer.headers, app_answer.body), stored


def _step(steps: Generator, value: Any, error: Optional[BaseException]) -> Tuple[bool, Any]:
    """Advance the steps: (True, result) when they returned, else (False, the next effect)."""
    try:
        return False, (steps.throw(error) if error is not None else steps.send(value))
    except StopIteration as stop:
        return True, stop.value


def handle(exchange: Exchange, route: Route, params: Dict[str, str], read_body: Callable[[int], bytes],
           call: Callable[[Context], Answer], settings: Settings,
           transaction: Optional[Callable[[], Any]] = None) -> Answer:
    """The contract around ``call`` (the framework's handler, run with the
    claim's transaction open), for a synchronous framework.
    ``transaction()`` is a context manager giving the connection of a new
    transaction (default: settings.connection() and conn.transaction()).
    Never raises: every error is an answer (problem+json)."""
    new_transaction = transaction or _psycopg_transaction(settings)
    prep = None if settings.server_prepare else False

    def drive(steps: Generator, db: Any) -> Any:
        value, error = None, None
        while True:
            done, effect = _step(steps, value, error)
            if done:
                return effect
            value, error = None, None
            try:
                if isinstance(effect, _Db):
                    value = core.perform(db, effect.call, prep)
                elif isinstance(effect, _Call):
                    value = call(effect.ctx)
                elif isinstance(effect, _Read):
                    value = read_body(effect.n)
                elif isinstance(effect, _Fast):
                    value = effect.fn(*effect.args)
                else:
                    with new_transaction() as tx:
                        value = drive(effect.steps(tx), tx)
            except Exception as e:  # noqa: BLE001 - thrown into the steps
                error = e

    with tracing.span("idem.request", attributes=_span_attributes(route)) as current:
        answer = drive(_answer(exchange, route, params, settings), None)
        _traced(current, answer)
        return answer


async def handle_async(exchange: Exchange, route: Route, params: Dict[str, str],
                       read_body: Callable[[int], Awaitable[bytes]],
                       call: Callable[[Context], Awaitable[Answer]], settings: Settings) -> Answer:
    """``handle`` for an asynchronous framework (ASGI): settings.connection
    gives psycopg AsyncConnections (AsyncConnectionPool.connection); the
    fast layer's calls, short and bounded, run in a thread.  Never raises."""
    import asyncio
    from . import aio

    async def drive(steps: Generator, db: Any) -> Any:
        value, error = None, None
        while True:
            done, effect = _step(steps, value, error)
            if done:
                return effect
            value, error = None, None
            try:
                if isinstance(effect, _Db):
                    value = await aio.perform(db, effect.call)
                elif isinstance(effect, _Call):
                    value = await call(effect.ctx)
                elif isinstance(effect, _Read):
                    value = await read_body(effect.n)
                elif isinstance(effect, _Fast):
                    value = await asyncio.to_thread(effect.fn, *effect.args)
                else:
                    async with _async_transaction(settings) as tx:
                        value = await drive(effect.steps(tx), tx)
            except Exception as e:  # noqa: BLE001 - thrown into the steps
                error = e

    with tracing.span("idem.request", attributes=_span_attributes(route)) as current:
        answer = await drive(_answer(exchange, route, params, settings), None)
        _traced(current, answer)
        return answer


def _span_attributes(route: Route) -> Dict[str, str]:
    """A request span's attributes: the operation, when the route names one (never a key or an owner)."""
    return {"idem.operation": route.operation} if isinstance(route.operation, str) else {}


# the problems whose outcome is not "error": the key reused, or in flight after the wait
_OUTCOME_OF_PROBLEM = {b'"urn:idem:error:key-reused"': "conflict", b'"urn:idem:error:in-flight"': "waited"}


def _traced(current: Any, answer: Answer) -> None:
    """The request's outcome on its span: executed, replayed, conflict, waited or error."""
    if current is None:
        return
    if any(k.lower() == "idempotent-replayed" and v == "true" for k, v in answer.headers):
        outcome = "replayed"
    else:
        outcome = next((o for slug, o in _OUTCOME_OF_PROBLEM.items() if slug in (answer.body or b"")[:200]),
                       "executed" if answer.status < 500 else "error")
    tracing.set_outcome(current, outcome, answer.status)


_missing_grant_logged = False


def _not_granted(role: str) -> Misconfigured:
    """A 42501 where the role lacks idem's grants: the server's setup, a 500,
    logged once per process (not the owner binding's 403)."""
    global _missing_grant_logged
    message = ("role %s may not call idem's functions: a superuser runs SELECT idem_grant('%s', 'app')"
               % (role, role))
    if not _missing_grant_logged:
        _missing_grant_logged = True
        log.error("idem_pg: %s", message)
    return Misconfigured(message, "42501")


def _psycopg_transaction(settings: Settings) -> Callable[[], Any]:
    @contextmanager
    def transaction():
        if settings.connection is None:
            raise RuntimeError("idem_pg: the middleware needs settings.connection (e.g. pool.connection)")
        with settings.connection() as conn:
            if not settings.server_prepare:
                conn.prepare_threshold = None
            with conn.transaction():
                yield conn
    return transaction


@asynccontextmanager
async def _async_transaction(settings: Settings):
    if settings.connection is None:
        raise RuntimeError("idem_pg: the middleware needs settings.connection (e.g. pool.connection)")
    async with settings.connection() as conn:
        if not settings.server_prepare:
            conn.prepare_threshold = None
        async with conn.transaction():
            yield conn
