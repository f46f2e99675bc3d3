"""The API on a psycopg 3 AsyncConnection: every call of the synchronous
one (``idem_pg``), awaited -- for FastAPI and other asyncio services, and
the ASGI middleware.

    from idem_pg import aio

    async with conn.transaction():
        async with aio.claim(conn, owner, "DEBIT", key, {"amount": 100}) as c:
            if not c.replayed:
                await conn.execute("UPDATE account SET balance = balance - 100 WHERE id = 7")
                await aio.emit(conn, "debits", {"account": 7, "amount": 100}, key="7")
                await c.finish(201, {"debited": 100})
"""
from __future__ import annotations

import asyncio
import random
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, List, Mapping, Optional, Tuple, TypeVar

from .core import (BEGIN_SQL, FINISH_SQL, GRANTED_SQL, FINISH_STORED_SQL, RUN_SQL, SUBMIT_SQL, Json, Outcome, Submission, Ttl,
                   _consume_call, _emit_call, _headers_param, _json, _outcome, _submission, _ttl)
from .errors import NoClaim, SerializationFailure, sqlstate_of, translate
from .schema import LOOKUP_SQL, PLACEHOLDER, cached, remember, statement
from .tasks import COMPLETE_SQL, FAIL_SQL, HEARTBEAT_SQL, LEASE_SQL, Task, _complete_params, _task_of

T = TypeVar("T")


async def _rows(conn: Any, sql: str, params: tuple) -> List[tuple]:
    if PLACEHOLDER in sql:
        schema = cached(conn)
        if schema is None:
            found = await _rows(conn, LOOKUP_SQL, ())
            schema = remember(conn, found[0] if found else None)
        sql = statement(sql, schema)
    try:
        cur = await conn.execute(sql, params)
        return await cur.fetchall()
    except Exception as e:  # noqa: BLE001 - translated, or re-raised as it is
        raise translate(e) from e


async def _one(conn: Any, sql: str, params: tuple):
    rows = await _rows(conn, sql, params)
    return rows[0] if rows else None


async def app_grants(conn: Any) -> Tuple[bool, str]:
    """(may the role call idem_begin and idem_finish_stored, the role)."""
    row = await _one(conn, GRANTED_SQL, ())
    return bool(row[0]), row[1]


async def begin(conn: Any, owner: int, operation: str, key: str, request: Json, ttl: Ttl = None) -> Outcome:
    """idem_begin: claim the key for this transaction, or replay."""
    return _outcome(await _one(conn, BEGIN_SQL, (owner, operation, key, _json(request), _ttl(ttl))))


async def finish(conn: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                 resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> None:
    """idem_finish: store this transaction's claim's answer (2xx-4xx)."""
    await _one(conn, FINISH_SQL, (owner, operation, key, http_status, _json(body), resource_id,
                                  _headers_param(headers)))


async def finish_stored(conn: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                        resource_id: Optional[int] = None,
                        headers: Optional[Mapping[str, str]] = None) -> Outcome:
    """idem_finish_stored (idem 1.13): ``finish``, returning the answer as stored."""
    return _outcome(await _one(conn, FINISH_STORED_SQL, (owner, operation, key, http_status, _json(body),
                                                         resource_id, _headers_param(headers))))


async def run(conn: Any, owner: int, operation: str, key: str, request: Json, handler: str,
              ttl: Ttl = None) -> Outcome:
    """idem_run: call the SQL ``handler`` once per key, or replay."""
    return _outcome(await _one(conn, RUN_SQL, (owner, operation, key, _json(request), handler, _ttl(ttl))))


async def submit(conn: Any, owner: int, operation: str, key: str, request: Json, payload: Json = None,
                 ttl: Ttl = None) -> Submission:
    """idem_submit: start a long flow (a task for the workers), or tell its state."""
    return _submission(await _one(conn, SUBMIT_SQL, (owner, operation, key, _json(request), _json(payload),
                                                     _ttl(ttl))))


async def consume(conn: Any, consumer: str, message_id: str, ttl: Ttl = None, owner: Optional[int] = None) -> bool:
    """idem_consume: True the first time this consumer sees the message."""
    return bool((await _one(conn, *_consume_call(consumer, message_id, ttl, owner)))[0])


async def emit(conn: Any, topic: str, payload: Json, key: Optional[str] = None,
               headers: Optional[Mapping[str, str]] = None, owner: Optional[int] = None) -> int:
    """idem_outbox_emit: a message, published once this transaction commits.
    Returns its message id.  ``owner`` (idem 1.13): whose it is, for
    idem_forget_owner (default: the owner of the transaction's claims)."""
    return int((await _one(conn, *_emit_call(topic, payload, key, headers, owner)))[0])


class Claim:
    """A claimed key, from ``claim()``: do the work, then ``await finish``."""

    def __init__(self, conn: Any, owner: int, operation: str, key: str, outcome: Outcome):
        self.conn, self.owner, self.operation, self.key = conn, owner, operation, key
        self.outcome = outcome
        self.finished = outcome.replayed

    @property
    def replayed(self) -> bool:
        return self.outcome.replayed

    async def finish(self, http_status: int, body: Json = None, resource_id: Optional[int] = None,
                     headers: Optional[Mapping[str, str]] = None) -> Outcome:
        """Store the answer; returns it as stored (and as a replay will return it)."""
        if self.finished:
            raise NoClaim("this claim is already finished (or was a replay)", "IK003")
        self.outcome = await finish_stored(self.conn, self.owner, self.operation, self.key, http_status, body,
                                           resource_id, headers)
        self.finished = True
        return self.outcome


@asynccontextmanager
async def claim(conn: Any, owner: int, operation: str, key: str, request: Json,
                ttl: Ttl = None) -> AsyncIterator[Claim]:
    """``idem_pg.claim`` on an AsyncConnection, in the caller's transaction."""
    c = Claim(conn, owner, operation, key, await begin(conn, owner, operation, key, request, ttl))
    yield c
    if not c.finished:
        raise NoClaim("the claim of the key was not finished: call finish() in the block", "IK003")


async def retry_serializable(transaction: Callable[[], Awaitable[T]], attempts: int = 5,
                             base_delay: float = 0.01, max_delay: float = 1.0) -> T:
    """``idem_pg.retry_serializable`` for a coroutine function."""
    for attempt in range(attempts):
        try:
            return await transaction()
        except Exception as e:  # noqa: BLE001 - only 40001 is retried
            if sqlstate_of(e) != "40001" and not isinstance(e, SerializationFailure):
                raise
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(random.uniform(0, min(max_delay, base_delay * 2 ** attempt)))
    raise AssertionError("unreachable")


class TaskWorker:
    """``idem_pg.TaskWorker`` on an AsyncConnection: lease, then the task's
    heartbeat, complete and fail through ``heartbeat``, ``complete`` and
    ``fail`` here."""

    def __init__(self, operation: str, worker: str, lease: Ttl = 30, bind_session: bool = False):
        self.operation, self.worker, self.lease_for = operation, worker, lease
        self.bind_session = bind_session

    async def lease(self, conn: Any, batch: int = 1) -> List[Task]:
        rows = await _rows(conn, LEASE_SQL, (self.operation, self.worker, _ttl(self.lease_for), batch,
                                             self.bind_session))
        return [_task_of(r) for r in rows]

    @staticmethod
    async def heartbeat(conn: Any, task: Task, extend: Ttl = None):
        task.lease_expires_at = (await _one(conn, HEARTBEAT_SQL, (task.task_id, task.token, _ttl(extend))))[0]
        return task.lease_expires_at

    @staticmethod
    async def complete(conn: Any, task: Task, http_status: int, body: Json = None,
                       resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> None:
        await _one(conn, COMPLETE_SQL, _complete_params(task, http_status, body, resource_id, headers))

    @staticmethod
    async def fail(conn: Any, task: Task, error: Json, retryable: bool = True) -> str:
        return (await _one(conn, FAIL_SQL, (task.task_id, task.token, _json(error), retryable)))[0]


__all__ = ["begin", "finish", "finish_stored", "run", "submit", "consume", "emit", "claim", "Claim",
           "retry_serializable", "TaskWorker"]
