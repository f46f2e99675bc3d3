"""What the synchronous API (``core``, ``tasks``) and the asynchronous one
(``aio``) share: each call of idem as a statement, its parameters and the
reading of its rows.  No I/O here: ``core.perform`` runs a call on a
connection, ``aio.perform`` on an AsyncConnection, so each call is written
once.

Every statement names idem's schema (``@idem@``, schema.py) and casts every
argument to the exact type of idem's parameter.
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Sequence, Union

Json = Any
Ttl = Union[None, int, float, _dt.timedelta]


class RawJson:
    """JSON text passed as it is (a response body stored byte for byte)."""

    __slots__ = ("text",)

    def __init__(self, text: Union[str, bytes]):
        self.text = text.decode("utf-8") if isinstance(text, (bytes, bytearray)) else text


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

    @property
    def reconciling(self) -> bool:
        """Whether the task's outcome is being reconciled: ``body`` is then
        a problem (``application/problem+json``) of type
        urn:idem:task:reconciling, to answer with ``http_status`` 202."""
        return self.body is not None and '"urn:idem:task:reconciling"' in self.body


class Call(NamedTuple):
    """One statement of idem: its text, its parameters, what its rows mean,
    and the operation it acts for (a span's attribute), if any."""
    sql: str
    params: tuple
    read: Callable[[List[tuple]], Any]
    operation: Optional[str] = None


def ttl_param(ttl: Ttl) -> Optional[str]:
    """A ttl (seconds or a timedelta) as an interval's text."""
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, _dt.timedelta) else float(ttl)
    return "%r seconds" % seconds


def json_param(value: Json) -> Optional[str]:
    """A value as JSON text (RawJson and bytes as they are)."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8")
    if isinstance(value, RawJson):
        return value.text
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def headers_param(headers: Optional[Mapping[str, str]]) -> Optional[str]:
    """Headers as a JSON object's text."""
    return json.dumps(dict(headers)) if headers is not None else None


def headers_of(value: Any) -> Optional[dict]:
    """Headers read back (text or a mapping) as a dict."""
    if value is None:
        return None
    return json.loads(value) if isinstance(value, str) else dict(value)


def loads(text: Optional[str]) -> Json:
    return None if text is None else json.loads(text)


# the expiry as epoch seconds: the same instant whatever the session's
# TimeZone and the driver's datetime handling (Django's naive ones)
_OUTCOME = ("replayed, http_status, body::pg_catalog.text, headers::pg_catalog.text, resource_id,"
            " extract(epoch FROM expires_at)::pg_catalog.float8")
_I8, _T, _J, _JSON, _IV, _I4, _B = ("::pg_catalog.int8", "::pg_catalog.text", "::pg_catalog.jsonb",
                                    "::pg_catalog.json", "::pg_catalog.interval", "::pg_catalog.int4",
                                    "::pg_catalog.bool")
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
HEARTBEAT_SQL = "SELECT @idem@.idem_heartbeat(%%s%s, %%s%s, %%s%s)" % (_I8, _I8, _IV)
COMPLETE_SQL = ("SELECT @idem@.idem_complete(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s)"
                % (_I8, _I8, _I4, _JSON, _I8, _J))
FAIL_SQL = "SELECT @idem@.idem_fail(%%s%s, %%s%s, %%s%s, %%s%s)" % (_I8, _I8, _J, _B)
LEASE_SQL = ("SELECT task_id, owner, key, request::pg_catalog.text, payload::pg_catalog.text, attempt, token,"
             " lease_expires_at FROM @idem@.idem_lease(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s)" % (_T, _T, _IV, _I4, _B))
FAIL_UNKNOWN_SQL = "SELECT @idem@.idem_fail_unknown(%%s%s, %%s%s, %%s%s)" % (_I8, _I8, _J)
TASK_TRACE_SQL = "SELECT @idem@.idem_task_trace_context(%%s%s, %%s%s)" % (_I8, _I8)
SET_TRACE_SQL = "SELECT pg_catalog.set_config('idem.trace_context', %%s%s, true)" % (_T,)
LEASE_RECONCILE_SQL = ("SELECT task_id, owner, key, request::pg_catalog.text, payload::pg_catalog.text, attempt,"
                       " token, lease_expires_at, uncertain_since, attempts::pg_catalog.text"
                       " FROM @idem@.idem_lease_reconcile(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s)" % (_T, _T, _IV, _I4, _B))
# Whether the session's role may call what the app kind is granted
# (idem_grant(role, 'app')): asked after a 42501, which also means an
# owner outside idem.allowed_owners.
GRANTED_SQL = ("SELECT pg_catalog.has_function_privilege("
               "'@idem@.idem_begin(bigint, text, text, jsonb, interval)', 'EXECUTE')"
               " AND pg_catalog.has_function_privilege("
               "'@idem@.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)', 'EXECUTE'),"
               " current_user::pg_catalog.text")


def outcome_of(rows: Sequence[tuple]) -> Outcome:
    row = rows[0]
    expires = None if row[5] is None else _dt.datetime.fromtimestamp(row[5], _dt.timezone.utc)
    return Outcome(row[0], row[1], row[2], headers_of(row[3]), row[4], expires)


def _submission_of(rows: Sequence[tuple]) -> Submission:
    row = rows[0]
    return Submission(row[0], row[1], row[2], row[3], headers_of(row[4]), row[5], row[6])


def _value(rows: Sequence[tuple]) -> Any:
    return rows[0][0] if rows else None


def _nothing(rows: Sequence[tuple]) -> None:
    return None


def app_grants() -> Call:
    return Call(GRANTED_SQL, (), lambda rows: (bool(rows[0][0]), rows[0][1]))


def begin(owner: int, operation: str, key: str, request: Json, ttl: Ttl) -> Call:
    return Call(BEGIN_SQL, (owner, operation, key, json_param(request), ttl_param(ttl)), outcome_of, operation)


def finish(owner: int, operation: str, key: str, http_status: int, body: Json, resource_id: Optional[int],
           headers: Optional[Mapping[str, str]]) -> Call:
    return Call(FINISH_SQL, (owner, operation, key, http_status, json_param(body), resource_id,
                             headers_param(headers)), _nothing, operation)


def finish_stored(owner: int, operation: str, key: str, http_status: int, body: Json, resource_id: Optional[int],
                  headers: Optional[Mapping[str, str]]) -> Call:
    return Call(FINISH_STORED_SQL, (owner, operation, key, http_status, json_param(body), resource_id,
                                    headers_param(headers)), outcome_of, operation)


def run(owner: int, operation: str, key: str, request: Json, handler: str, ttl: Ttl) -> Call:
    return Call(RUN_SQL, (owner, operation, key, json_param(request), handler, ttl_param(ttl)), outcome_of, operation)


def submit(owner: int, operation: str, key: str, request: Json, payload: Json, ttl: Ttl) -> Call:
    return Call(SUBMIT_SQL, (owner, operation, key, json_param(request), json_param(payload), ttl_param(ttl)),
                _submission_of, operation)


def consume(consumer: str, message_id: str, ttl: Ttl, owner: Optional[int]) -> Call:
    """idem_consume (the owner's form only with one)."""
    if owner is not None:
        return Call(CONSUME_OWNER_SQL, (consumer, message_id, ttl_param(ttl), owner), lambda r: bool(r[0][0]))
    return Call(CONSUME_SQL, (consumer, message_id, ttl_param(ttl)), lambda r: bool(r[0][0]))


def emit(topic: str, payload: Json, key: Optional[str], headers: Optional[Mapping[str, str]],
         owner: Optional[int]) -> Call:
    """idem_outbox_emit (the owner's form only with one)."""
    if owner is not None:
        return Call(EMIT_OWNER_SQL, (topic, json_param(payload), key, headers_param(headers), owner),
                    lambda r: int(r[0][0]))
    return Call(EMIT_SQL, (topic, json_param(payload), key, headers_param(headers)), lambda r: int(r[0][0]))


def lease(operation: str, worker: str, lease_for: Ttl, batch: int, bind_session: bool) -> Call:
    """idem_lease: its rows as they are (a Task each: tasks.Task.of)."""
    return Call(LEASE_SQL, (operation, worker, ttl_param(lease_for), batch, bind_session), list, operation)


def heartbeat(task_id: int, token: int, extend: Ttl) -> Call:
    return Call(HEARTBEAT_SQL, (task_id, token, ttl_param(extend)), _value)


def complete(task_id: int, token: int, http_status: int, body: Json, resource_id: Optional[int],
             headers: Optional[Mapping[str, str]]) -> Call:
    return Call(COMPLETE_SQL, (task_id, token, http_status, json_param(body), resource_id, headers_param(headers)),
                _nothing)


def fail(task_id: int, token: int, error: Json, retryable: bool) -> Call:
    return Call(FAIL_SQL, (task_id, token, json_param(error), retryable), _value)


TASK_CANCEL_SQL = "SELECT @idem@.idem_task_cancel(%%s%s, %%s%s)" % (_I8, _T)
TASK_RETRY_SQL = "SELECT @idem@.idem_task_retry(%%s%s, %%s%s)" % (_I8, _T)
TASK_RESOLVE_SQL = ("SELECT @idem@.idem_task_resolve(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s)"
                    % (_I8, _I4, _JSON, _T, _I8, _J))
TASK_SETTLE_SQL = ("SELECT @idem@.idem_task_settle(%%s%s, %%s%s, %%s%s, %%s%s, %%s%s, %%s%s)"
                   % (_I8, _B, _T, _I4, _JSON, _I8))
OUTBOX_REDRIVE_SQL = "SELECT @idem@.idem_outbox_redrive(%s::pg_catalog.int8[], %s::pg_catalog.text)"
OUTBOX_DISCARD_SQL = "SELECT @idem@.idem_outbox_discard(%s::pg_catalog.int8[], %s::pg_catalog.text)"
INBOX_REDRIVE_SQL = ("SELECT @idem@.idem_inbox_redrive(%s::pg_catalog.text, %s::pg_catalog.text[],"
                     " %s::pg_catalog.bool, %s::pg_catalog.text)")


def task_cancel(task_id: int, reason: str) -> Call:
    return Call(TASK_CANCEL_SQL, (task_id, reason), _value)


def task_retry(task_id: int, reason: str) -> Call:
    return Call(TASK_RETRY_SQL, (task_id, reason), _value)


def task_resolve(task_id: int, http_status: int, body: Json, reason: str, resource_id: Optional[int],
                 headers: Optional[Mapping[str, str]]) -> Call:
    return Call(TASK_RESOLVE_SQL, (task_id, http_status, json_param(body), reason, resource_id,
                                   headers_param(headers)), _value)


def task_settle(task_id: int, happened: bool, reason: str, http_status: Optional[int], body: Json,
                resource_id: Optional[int]) -> Call:
    return Call(TASK_SETTLE_SQL, (task_id, happened, reason, http_status,
                                  json_param(body) if happened else None, resource_id), _value)


def outbox_redrive(message_ids: Sequence[int], reason: Optional[str]) -> Call:
    return Call(OUTBOX_REDRIVE_SQL, (list(message_ids), reason), _value)


def outbox_discard(message_ids: Sequence[int], reason: Optional[str]) -> Call:
    return Call(OUTBOX_DISCARD_SQL, (list(message_ids), reason), _value)


def inbox_redrive(consumer: str, message_ids: Optional[Sequence[str]], discard: bool, reason: Optional[str]) -> Call:
    return Call(INBOX_REDRIVE_SQL, (consumer, list(message_ids) if message_ids is not None else None, discard,
                                    reason), _value)


def task_trace_context(task_id: int, token: int) -> Call:
    """idem 1.16: the traceparent the task was submitted under (None: none)."""
    return Call(TASK_TRACE_SQL, (task_id, token), _value)


def set_trace_context(traceparent: str) -> Call:
    """SET LOCAL idem.trace_context (the transaction's emits and submits carry it)."""
    return Call(SET_TRACE_SQL, (traceparent,), _nothing)


def fail_unknown(task_id: int, token: int, error: Json) -> Call:
    return Call(FAIL_UNKNOWN_SQL, (task_id, token, json_param(error)), _value)


def lease_reconcile(operation: str, worker: str, lease_for: Ttl, batch: int, bind_session: bool) -> Call:
    """idem_lease_reconcile: its rows as they are (tasks.ReconcileTask.of)."""
    return Call(LEASE_RECONCILE_SQL, (operation, worker, ttl_param(lease_for), batch, bind_session), list, operation)


__all__ = ["Json", "Ttl", "RawJson", "Outcome", "Submission", "Call"]
