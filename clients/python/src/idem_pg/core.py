"""The SQL API of idem, typed, in the caller's own connection and transaction.

Every function takes the connection to run on: a psycopg 3 ``Connection``
(the package's one dependency), or any DB-API connection or cursor of
PostgreSQL (psycopg2, Django's ``connection``).  None of them commits or
rolls back: the caller's transaction decides, so the business writes and
idem's record commit together or not at all.
"""
from __future__ import annotations

import datetime as _dt
import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple, Union

from .errors import IdemError, NoClaim, translate
from .schema import LOOKUP_SQL, PLACEHOLDER, cached, remember, statement

Json = Any
Ttl = Union[None, int, float, _dt.timedelta]


def _ttl(ttl: Ttl) -> Optional[str]:
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, _dt.timedelta) else float(ttl)
    return "%r seconds" % seconds


def _json(value: Json) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8")
    if isinstance(value, RawJson):
        return value.text
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class RawJson:
    """JSON text passed as it is (a response body stored byte for byte)."""

    __slots__ = ("text",)

    def __init__(self, text: Union[str, bytes]):
        self.text = text.decode("utf-8") if isinstance(text, (bytes, bytearray)) else text


def _rows(db: Any, sql: str, params: Sequence[Any], prepare: Optional[bool]) -> list:
    if PLACEHOLDER in sql:
        sql = _sql(db, sql)
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


def _schema(db: Any) -> str:
    """idem's schema on this connection, looked up once (schema.py)."""
    rows = _rows(db, LOOKUP_SQL, (), None)
    return remember(db, rows[0] if rows else None)


def _sql(db: Any, sql: str) -> str:
    """A statement of this package, idem's schema in it, for a caller that
    runs it itself (and handles the driver's errors as they are)."""
    return statement(sql, cached(db) or _schema(db))


def _one(db: Any, sql: str, params: Sequence[Any], prepare: Optional[bool] = None):
    rows = _rows(db, sql, params, prepare)
    return rows[0] if rows else None


def _headers(value: Any) -> Optional[dict]:
    if value is None:
        return None
    return json.loads(value) if isinstance(value, str) else dict(value)


@dataclass(frozen=True)
class Outcome:
    """What idem_begin and idem_run answer.  ``replayed`` False from
    idem_begin: the key is claimed, do the work and finish.  Otherwise the
    stored answer: ``body`` is the JSON text exactly as it was stored."""
    replayed: bool
    http_status: Optional[int]
    body: Optional[str]
    headers: Optional[dict]
    resource_id: Optional[int]
    expires_at: Optional[_dt.datetime]


# the expiry as epoch seconds: the same instant whatever the session's
# TimeZone and the driver's datetime handling (Django's naive ones)
_OUTCOME = ("replayed, http_status, body::pg_catalog.text, headers::pg_catalog.text, resource_id,"
            " extract(epoch FROM expires_at)::pg_catalog.float8")


def _outcome(row) -> Outcome:
    expires = None if row[5] is None else _dt.datetime.fromtimestamp(row[5], _dt.timezone.utc)
    return Outcome(row[0], row[1], row[2], _headers(row[3]), row[4], expires)


# Every statement names idem's schema (@idem@, schema.py) and casts every
# argument to the type of idem's parameter.
_I8, _T, _J, _JSON, _IV, _I4 = ("::pg_catalog.int8", "::pg_catalog.text", "::pg_catalog.jsonb", "::pg_catalog.json",
                                "::pg_catalog.interval", "::pg_catalog.int4")
BEGIN_SQL = ("SELECT %s FROM @idem@.idem_begin(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s)"
             % (_OUTCOME, _I8, _T, _T, _J, _IV))
FINISH_SQL = ("SELECT @idem@.idem_finish(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s)"
              % (_I8, _T, _T, _I4, _JSON, _I8, _J))
FINISH_STORED_SQL = ("SELECT %s FROM @idem@.idem_finish_stored(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s)"
                     % (_OUTCOME, _I8, _T, _T, _I4, _JSON, _I8, _J))
RUN_SQL = ("SELECT %s FROM @idem@.idem_run(%%s%s, %%s%s, %%s%s, %%s%s, %%s::pg_catalog.regprocedure, %%s%s)"
           % (_OUTCOME, _I8, _T, _T, _J, _IV))
SUBMIT_SQL = ("SELECT replayed, status, http_status, body::pg_catalog.text, headers::pg_catalog.text, resource_id,"
              " task_id FROM @idem@.idem_submit(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s)" % (_I8, _T, _T, _J, _J, _IV))
CONSUME_SQL = "SELECT @idem@.idem_consume(%%s%s, %%s%s, %%s%s)" % (_T, _T, _IV)
CONSUME_OWNER_SQL = "SELECT @idem@.idem_consume(%%s%s, %%s%s, %%s%s, %%s%s)" % (_T, _T, _IV, _I8)
EMIT_SQL = "SELECT @idem@.idem_outbox_emit(%%s%s, %%s%s, %%s%s, %%s%s)" % (_T, _J, _T, _J)
EMIT_OWNER_SQL = "SELECT @idem@.idem_outbox_emit(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s)" % (_T, _J, _T, _J, _I8)


def _consume_call(consumer: str, message_id: str, ttl: Ttl, owner: Optional[int]):
    """idem_consume's statement and parameters (the owner's form only with one)."""
    if owner is not None:
        return CONSUME_OWNER_SQL, (consumer, message_id, _ttl(ttl), owner)
    return CONSUME_SQL, (consumer, message_id, _ttl(ttl))


def _emit_call(topic: str, payload: Any, key: Optional[str], headers: Optional[Mapping[str, str]],
               owner: Optional[int]):
    """idem_outbox_emit's statement and parameters (the owner's form only with one)."""
    hdrs = json.dumps(dict(headers)) if headers is not None else None
    if owner is not None:
        return EMIT_OWNER_SQL, (topic, _json(payload), key, hdrs, owner)
    return EMIT_SQL, (topic, _json(payload), key, hdrs)


def _submission(row) -> "Submission":
    return Submission(row[0], row[1], row[2], row[3], _headers(row[4]), row[5], row[6])


def _headers_param(headers: Optional[Mapping[str, str]]) -> Optional[str]:
    return json.dumps(dict(headers)) if headers is not None else None


# Whether the session's role may call what the app kind is granted
# (idem_grant(role, 'app')): asked after a 42501, which also means an
# owner outside idem.allowed_owners.
GRANTED_SQL = ("SELECT pg_catalog.has_function_privilege("
               "'@idem@.idem_begin(bigint, text, text, jsonb, interval)', 'EXECUTE')"
               " AND pg_catalog.has_function_privilege("
               "'@idem@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)', 'EXECUTE'),"
               " current_user::pg_catalog.text")


def app_grants(db: Any) -> Tuple[bool, str]:
    """(may the role call idem_begin and idem_finish_stored, the role)."""
    row = _one(db, GRANTED_SQL, ())
    return bool(row[0]), row[1]


def begin(db: Any, owner: int, operation: str, key: str, request: Json, ttl: Ttl = None,
          prepare: Optional[bool] = None) -> Outcome:
    """idem_begin: claim the key for this transaction, or replay."""
    return _outcome(_one(db, BEGIN_SQL, (owner, operation, key, _json(request), _ttl(ttl)), prepare))


def finish(db: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
           resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None,
           prepare: Optional[bool] = None) -> None:
    """idem_finish: store this transaction's claim's answer (2xx-4xx)."""
    _one(db, FINISH_SQL, (owner, operation, key, http_status, _json(body), resource_id, _headers_param(headers)),
         prepare)


def finish_stored(db: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                  resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None,
                  prepare: Optional[bool] = None) -> Outcome:
    """idem_finish_stored (idem 1.13): ``finish``, returning the answer as
    stored -- after the operation's ``redact`` policy -- exactly as a
    replay will return it (``replayed`` False).  A copy kept elsewhere (the
    fast layer) keeps these bytes, never the handler's."""
    return _outcome(_one(db, FINISH_STORED_SQL, (owner, operation, key, http_status, _json(body), resource_id,
                                                 _headers_param(headers)), prepare))


def run(db: Any, owner: int, operation: str, key: str, request: Json, handler: str, ttl: Ttl = None,
        prepare: Optional[bool] = None) -> Outcome:
    """idem_run: call the SQL ``handler`` (a regprocedure, e.g.
    'debit_handler(jsonb)') once per key, or replay."""
    return _outcome(_one(db, RUN_SQL, (owner, operation, key, _json(request), handler, _ttl(ttl)), prepare))


@dataclass(frozen=True)
class Submission:
    """What idem_submit answers: a long flow's current state."""
    replayed: bool
    status: str
    http_status: Optional[int]
    body: Optional[str]
    headers: Optional[dict]
    resource_id: Optional[int]
    task_id: Optional[int]


def submit(db: Any, owner: int, operation: str, key: str, request: Json, payload: Json = None,
           ttl: Ttl = None, prepare: Optional[bool] = None) -> Submission:
    """idem_submit: start a long flow (a task for the workers), or tell its state."""
    return _submission(_one(db, SUBMIT_SQL, (owner, operation, key, _json(request), _json(payload), _ttl(ttl)),
                            prepare))


def consume(db: Any, consumer: str, message_id: str, ttl: Ttl = None, prepare: Optional[bool] = None,
            owner: Optional[int] = None) -> bool:
    """idem_consume: True the first time this consumer sees the message (apply
    the effect in this transaction), False for a redelivery.  ``owner`` (idem
    1.11) is kept with the inbox entry, for ``idem_forget_owner``."""
    return bool(_one(db, *_consume_call(consumer, message_id, ttl, owner), prepare)[0])


def emit(db: Any, topic: str, payload: Json, key: Optional[str] = None,
         headers: Optional[Mapping[str, str]] = None, prepare: Optional[bool] = None,
         owner: Optional[int] = None) -> int:
    """idem_outbox_emit: a message, published once this transaction commits.
    Returns its message id.  ``owner`` (idem 1.13): whose it is, for
    idem_forget_owner (default: the owner of the transaction's claims)."""
    return int(_one(db, *_emit_call(topic, payload, key, headers, owner), prepare)[0])


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
        answer yet)."""
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
    An exception in the block propagates; roll the transaction back."""
    c = Claim(db, owner, operation, key, begin(db, owner, operation, key, request, ttl, prepare), prepare)
    yield c
    if not c.finished:
        raise NoClaim("the claim of the key was not finished: call finish() in the block", "IK003")


__all__ = ["Outcome", "Submission", "Claim", "RawJson", "IdemError", "begin", "finish", "finish_stored", "run", "submit",
           "consume", "emit", "claim"]
