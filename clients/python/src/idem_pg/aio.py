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

from . import calls, tracing
from .calls import Json, Outcome, Submission, Ttl
from .errors import NoClaim, SerializationFailure, sqlstate_of, translate
from .schema import LOOKUP_SQL, PLACEHOLDER, cached, remember, statement
from .tasks import ReconcileTask, Task

T = TypeVar("T")


async def rows_of(conn: Any, sql: str, params: tuple) -> List[tuple]:
    """``core.rows_of`` on an AsyncConnection."""
    if PLACEHOLDER in sql:
        schema = cached(conn)
        if schema is None:
            found = await rows_of(conn, LOOKUP_SQL, ())
            schema = remember(conn, found[0] if found else None)
        sql = statement(sql, schema)
    try:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description is not None else []
    except Exception as e:  # noqa: BLE001 - translated, or re-raised as it is
        raise translate(e) from e


async def perform(conn: Any, call: calls.Call) -> Any:
    """Run one of idem's calls (calls.py) and read its rows (in a span of
    its own when OpenTelemetry is installed)."""
    with tracing.call_span(call.sql, call.operation):
        return call.read(await rows_of(conn, call.sql, call.params))


async def app_grants(conn: Any) -> Tuple[bool, str]:
    """(may the role call idem_begin and idem_finish_stored, the role)."""
    return await perform(conn, calls.app_grants())


async def begin(conn: Any, owner: int, operation: str, key: str, request: Json, ttl: Ttl = None) -> Outcome:
    """``idem_pg.begin``, awaited; raises what it raises."""
    return await perform(conn, calls.begin(owner, operation, key, request, ttl))


async def finish(conn: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                 resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> None:
    """``idem_pg.finish``, awaited; raises what it raises."""
    await perform(conn, calls.finish(owner, operation, key, http_status, body, resource_id, headers))


async def finish_stored(conn: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                        resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> Outcome:
    """``idem_pg.finish_stored``, awaited; raises what it raises."""
    return await perform(conn, calls.finish_stored(owner, operation, key, http_status, body, resource_id, headers))


async def run(conn: Any, owner: int, operation: str, key: str, request: Json, handler: str,
              ttl: Ttl = None) -> Outcome:
    """``idem_pg.run``, awaited; raises what it raises."""
    return await perform(conn, calls.run(owner, operation, key, request, handler, ttl))


async def submit(conn: Any, owner: int, operation: str, key: str, request: Json, payload: Json = None,
                 ttl: Ttl = None) -> Submission:
    """``idem_pg.submit``, awaited; raises what it raises."""
    return await perform(conn, calls.submit(owner, operation, key, request, payload, ttl))


async def consume(conn: Any, consumer: str, message_id: str, ttl: Ttl = None, owner: Optional[int] = None) -> bool:
    """``idem_pg.consume``, awaited; raises what it raises."""
    return await perform(conn, calls.consume(consumer, message_id, ttl, owner))


async def emit(conn: Any, topic: str, payload: Json, key: Optional[str] = None,
               headers: Optional[Mapping[str, str]] = None, owner: Optional[int] = None) -> int:
    """``idem_pg.emit``, awaited; raises what it raises."""
    return await perform(conn, calls.emit(topic, payload, key, headers, owner))


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
        """Store the answer; returns it as stored (and as a replay will return
        it).  Raises NoClaim if finished or a replay, and what
        ``finish_stored`` raises."""
        if self.finished:
            raise NoClaim("this claim is already finished (or was a replay)", "IK003")
        self.outcome = await finish_stored(self.conn, self.owner, self.operation, self.key, http_status, body,
                                           resource_id, headers)
        self.finished = True
        return self.outcome


@asynccontextmanager
async def claim(conn: Any, owner: int, operation: str, key: str, request: Json,
                ttl: Ttl = None) -> AsyncIterator[Claim]:
    """``idem_pg.claim`` on an AsyncConnection, in the caller's transaction.
    Raises what ``idem_pg.begin`` raises, and NoClaim for a claim left
    unfinished."""
    c = Claim(conn, owner, operation, key, await begin(conn, owner, operation, key, request, ttl))
    yield c
    if not c.finished:
        raise NoClaim("the claim of the key was not finished: call finish() in the block", "IK003")


async def retry_serializable(transaction: Callable[[], Awaitable[T]], attempts: int = 5,
                             base_delay: float = 0.01, max_delay: float = 1.0) -> T:
    """``idem_pg.retry_serializable`` for a coroutine function.  Raises the
    last error once the attempts are spent, and any other error at once."""
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
        rows = await perform(conn, calls.lease(self.operation, self.worker, self.lease_for, batch, self.bind_session))
        return [Task.of(r) for r in rows]

    async def lease_reconcile(self, conn: Any, batch: int = 1) -> List[ReconcileTask]:
        """``idem_pg.TaskWorker.lease_reconcile``, awaited."""
        rows = await perform(conn, calls.lease_reconcile(self.operation, self.worker, self.lease_for, batch,
                                                         self.bind_session))
        return [ReconcileTask.of(r) for r in rows]

    @staticmethod
    async def heartbeat(conn: Any, task: Task, extend: Ttl = None):
        """``Task.heartbeat``, awaited: raises StaleToken (IK004)."""
        task.lease_expires_at = await perform(conn, calls.heartbeat(task.task_id, task.token, extend))
        return task.lease_expires_at

    @staticmethod
    async def complete(conn: Any, task: Task, http_status: int, body: Json = None,
                       resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> None:
        """``Task.complete``, awaited: raises StaleToken (IK004)."""
        await perform(conn, calls.complete(task.task_id, task.token, http_status, body, resource_id, headers))

    @staticmethod
    async def fail(conn: Any, task: Task, error: Json, retryable: bool = True) -> str:
        """``Task.fail``, awaited: raises StaleToken (IK004)."""
        return await perform(conn, calls.fail(task.task_id, task.token, error, retryable))

    @staticmethod
    async def fail_unknown(conn: Any, task: Task, error: Json) -> str:
        """``Task.fail_unknown``, awaited: raises StaleToken (IK004)."""
        return await perform(conn, calls.fail_unknown(task.task_id, task.token, error))


async def cancel_task(conn: Any, task_id: int, reason: str) -> str:
    """``idem_pg.operator.cancel_task``, awaited; raises what it raises."""
    return await perform(conn, calls.task_cancel(task_id, reason))


async def retry_task(conn: Any, task_id: int, reason: str) -> str:
    """``idem_pg.operator.retry_task``, awaited; raises what it raises."""
    return await perform(conn, calls.task_retry(task_id, reason))


async def resolve_task(conn: Any, task_id: int, http_status: int, body: Json, reason: str,
                       resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> str:
    """``idem_pg.operator.resolve_task``, awaited; raises what it raises."""
    return await perform(conn, calls.task_resolve(task_id, http_status, body, reason, resource_id, headers))


async def settle_task(conn: Any, task_id: int, happened: bool, reason: str, http_status: Optional[int] = None,
                      body: Json = None, resource_id: Optional[int] = None) -> str:
    """``idem_pg.operator.settle_task``, awaited; raises what it raises."""
    return await perform(conn, calls.task_settle(task_id, happened, reason, http_status, body, resource_id))


__all__ = ["begin", "finish", "finish_stored", "run", "submit", "consume", "emit", "claim", "Claim",
           "retry_serializable", "TaskWorker", "cancel_task", "retry_task", "resolve_task", "settle_task"]
