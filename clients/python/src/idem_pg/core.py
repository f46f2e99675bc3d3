"""The SQL API of idem, typed, in the caller's own connection and transaction.

Every function takes the connection to run on: a psycopg 3 ``Connection``
(the package's one dependency), or any DB-API connection or cursor of
PostgreSQL (psycopg2, Django's ``connection``).  None of them commits or
rolls back: the caller's transaction decides, so the business writes and
idem's record commit together or not at all.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple

from . import calls, tracing
from .calls import Json, Outcome, RawJson, Submission, Ttl
from .errors import IdemError, NoClaim, translate
from .schema import LOOKUP_SQL, PLACEHOLDER, cached, remember, statement

# What every call may raise besides its own errors (docs/errors.tsv):
# InvalidRequest (22xxx: a malformed key, operation or argument), Forbidden
# (42501: an owner or operation outside the role's binding, or no EXECUTE),
# ReadOnly (25006), SerializationFailure (40001: retry the transaction),
# Misconfigured (42883, 42725, 3F000: idem missing, shadowed, or a schema
# that does not exist); IdemError for any other SQLSTATE.  A driver's error
# without one (a lost connection) propagates as it is.


def rows_of(db: Any, sql: str, params: Sequence[Any], prepare: Optional[bool] = None) -> list:
    """Run one statement of this package (``@idem@`` replaced by idem's
    schema) and return its rows; a server's error as idem's exception."""
    if PLACEHOLDER in sql:
        sql = with_schema(db, sql)
    try:
        execute = getattr(db, "execute", None)
        if execute is not None and hasattr(db, "prepare_threshold"):      # psycopg 3 connection
            cur = db.execute(sql, params, prepare=prepare)
        else:
            cur = db.cursor() if hasattr(db, "cursor") else db
            cur.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []
    except Exception as e:  # noqa: BLE001 - translated, or re-raised as it is
        raise translate(e) from e


def with_schema(db: Any, sql: str) -> str:
    """A statement of this package with idem's schema in it (looked up
    once per connection), for a caller that runs it itself and handles the
    driver's errors as they are (the relays, the consumers)."""
    schema = cached(db)
    if schema is None:
        rows = rows_of(db, LOOKUP_SQL, (), None)
        schema = remember(db, rows[0] if rows else None)
    return statement(sql, schema)


def perform(db: Any, call: calls.Call, prepare: Optional[bool] = None) -> Any:
    """Run one of idem's calls (calls.py) and read its rows (in a span of
    its own when OpenTelemetry is installed)."""
    with tracing.call_span(call.sql, call.operation):
        return call.read(rows_of(db, call.sql, call.params, prepare))


def app_grants(db: Any) -> Tuple[bool, str]:
    """(may the role call idem_begin and idem_finish_stored, the role)."""
    return perform(db, calls.app_grants())


def begin(db: Any, owner: int, operation: str, key: str, request: Json, ttl: Ttl = None,
          prepare: Optional[bool] = None) -> Outcome:
    """idem_begin: claim the key for this transaction, or replay.

    Raises KeyReused (IK001: the key with another request), InFlight (IK002:
    the first request still running after idem.wait_timeout), KeyRunning
    (IK006: inside idem_run's handler for this key), KeyExpired (IK007), and
    what every call raises (above)."""
    return perform(db, calls.begin(owner, operation, key, request, ttl), prepare)


def finish(db: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
           resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None,
           prepare: Optional[bool] = None) -> None:
    """idem_finish: store this transaction's claim's answer (2xx-4xx).

    Raises NoClaim (IK003: no unfinished claim of the key in this
    transaction) and what every call raises."""
    perform(db, calls.finish(owner, operation, key, http_status, body, resource_id, headers), prepare)


def finish_stored(db: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                  resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None,
                  prepare: Optional[bool] = None) -> Outcome:
    """idem_finish_stored: ``finish``, returning the answer as stored --
    after the operation's ``redact`` policy -- exactly as a replay will
    return it (``replayed`` False).  A copy kept elsewhere (the fast layer)
    keeps these bytes, never the handler's.

    Raises NoClaim (IK003) and what every call raises."""
    return perform(db, calls.finish_stored(owner, operation, key, http_status, body, resource_id, headers), prepare)


def run(db: Any, owner: int, operation: str, key: str, request: Json, handler: str, ttl: Ttl = None,
        prepare: Optional[bool] = None) -> Outcome:
    """idem_run: call the SQL ``handler`` (a regprocedure, e.g.
    'debit_handler(jsonb)') once per key, or replay.

    Raises what ``begin`` raises, and the handler's own errors."""
    return perform(db, calls.run(owner, operation, key, request, handler, ttl), prepare)


def submit(db: Any, owner: int, operation: str, key: str, request: Json, payload: Json = None,
           ttl: Ttl = None, prepare: Optional[bool] = None) -> Submission:
    """idem_submit: start a long flow (a task for the workers), or tell its state.

    Raises KeyReused (IK001), KeyExpired (IK007) and what every call raises."""
    return perform(db, calls.submit(owner, operation, key, request, payload, ttl), prepare)


def consume(db: Any, consumer: str, message_id: str, ttl: Ttl = None, prepare: Optional[bool] = None,
            owner: Optional[int] = None) -> bool:
    """idem_consume: True the first time this consumer sees the message (apply
    the effect in this transaction), False for a redelivery.  ``owner`` is
    kept with the inbox entry, for ``idem_forget_owner``.

    Raises InFlight (IK002: another transaction is consuming it) and what
    every call raises."""
    return perform(db, calls.consume(consumer, message_id, ttl, owner), prepare)


def emit(db: Any, topic: str, payload: Json, key: Optional[str] = None,
         headers: Optional[Mapping[str, str]] = None, prepare: Optional[bool] = None,
         owner: Optional[int] = None) -> int:
    """idem_outbox_emit: a message, published once this transaction commits.
    Returns its message id.  ``owner``: whose it is, for idem_forget_owner
    (default: the owner of the transaction's claims).

    Raises what every call raises."""
    return perform(db, calls.emit(topic, payload, key, headers, owner), prepare)


class Claim:
    """A claimed key, from ``claim()``: do the work, then ``finish``."""

    def __init__(self, db: Any, owner: int, operation: str, key: str, outcome: Outcome,
                 prepare: Optional[bool]):
        self.db, self.owner, self.operation, self.key = db, owner, operation, key
        self.outcome = outcome
        self.finished = outcome.replayed
        self._prepare = prepare

    @property
    def replayed(self) -> bool:
        return self.outcome.replayed

    def finish(self, http_status: int, body: Json = None, resource_id: Optional[int] = None,
               headers: Optional[Mapping[str, str]] = None) -> Outcome:
        """Store the answer.  Returns it as stored (after the operation's
        redact policy), as a replay will return it, and ``outcome`` is that
        from then on (on a first execution it was idem_begin's, with no
        answer yet).  Raises NoClaim if the claim is finished or a replay,
        and what ``finish_stored`` raises."""
        if self.finished:
            raise NoClaim("this claim is already finished (or was a replay)", "IK003")
        self.outcome = finish_stored(self.db, self.owner, self.operation, self.key, http_status, body, resource_id,
                                     headers, self._prepare)
        self.finished = True
        return self.outcome


@contextmanager
def claim(db: Any, owner: int, operation: str, key: str, request: Json, ttl: Ttl = None,
          prepare: Optional[bool] = None) -> Iterator[Claim]:
    """Claim a key in the caller's transaction; the block does the work and
    calls ``finish`` -- or, when ``c.replayed``, answers ``c.outcome``:

        with conn.transaction(), idem_pg.claim(conn, 42, "DEBIT", key, req) as c:
            if not c.replayed:
                conn.execute("UPDATE account SET balance = balance - 100 WHERE id = 7")
                c.finish(201, {"debited": 100})
        answer(c.outcome if c.replayed else ...)

    Leaving the block without finishing a claim (and without an exception)
    raises NoClaim: the transaction would fail at COMMIT (IK005) anyway.
    An exception in the block propagates; roll the transaction back.
    Raises what ``begin`` raises."""
    c = Claim(db, owner, operation, key, begin(db, owner, operation, key, request, ttl, prepare), prepare)
    yield c
    if not c.finished:
        raise NoClaim("the claim of the key was not finished: call finish() in the block", "IK003")


__all__ = ["Outcome", "Submission", "Claim", "RawJson", "IdemError", "begin", "finish", "finish_stored", "run", "submit",
           "consume", "emit", "claim"]
