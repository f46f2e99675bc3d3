"""Long flows: a worker leases tasks, heartbeats, completes or fails them,
with the fencing token carried for it (docs/long-flows.md).

    worker = idem_pg.TaskWorker("SHIP", "worker-7", lease=30)
    for task in worker.lease(conn, batch=10):          # conn in autocommit
        tracking = call_the_carrier(task.request)       # task.heartbeat(conn) now and then
        with conn.transaction():
            conn.execute("INSERT INTO shipment ...")
            task.complete(conn, 201, {"tracking": tracking})

A stale token (the lease was taken over) raises StaleToken (IK004) from heartbeat,
complete and fail, and changes nothing: the business write in the same
transaction rolls back with it.

An attempt whose outcome the worker cannot know (a payment provider's
timeout) ends with ``task.fail_unknown(conn, error)``.  For an operation
whose policy says ``uncertain => 'reconcile'`` the task is then handed only
to ``worker.lease_reconcile(conn)``, with its attempts so far: ask the
provider, then ``complete`` with its answer, ``fail(..., retryable=False)``,
``not_charged`` (the attempt had no effect: retried later) or
``fail_unknown`` again (asked again after a backoff)::

    for task in worker.lease_reconcile(conn):
        charge = provider.lookup(task.key)
        if charge is None:
            task.not_charged(conn)
        else:
            with conn.transaction():
                task.complete(conn, 201, charge)
"""
from __future__ import annotations

import datetime as _dt
import select
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Mapping, Optional

from . import calls, tracing
from .calls import Json, Ttl, loads
from .core import perform


@dataclass
class Task:
    """A leased task: what the submit stored, and this lease's token."""
    task_id: int
    owner: int
    key: str
    request: Json
    payload: Json
    attempt: int
    token: int
    lease_expires_at: _dt.datetime
    prepare: Optional[bool] = None

    @classmethod
    def of(cls, row: tuple, prepare: Optional[bool] = None) -> "Task":
        """The task of a row of idem_lease (calls.lease)."""
        return cls(row[0], row[1], row[2], loads(row[3]), loads(row[4]), row[5], row[6], row[7], prepare)

    def heartbeat(self, db: Any, extend: Ttl = None) -> _dt.datetime:
        """Extend the lease (by the granted interval, or ``extend``); its new
        end.  Raises StaleToken (IK004) if the lease is no longer this
        token's."""
        self.lease_expires_at = perform(db, calls.heartbeat(self.task_id, self.token, extend), self.prepare)
        return self.lease_expires_at

    def complete(self, db: Any, http_status: int, body: Json = None, resource_id: Optional[int] = None,
                 headers: Optional[Mapping[str, str]] = None) -> None:
        """Store the result (2xx-4xx), in the transaction of the business
        write.  Raises StaleToken (IK004): roll that transaction back."""
        perform(db, calls.complete(self.task_id, self.token, http_status, body, resource_id, headers), self.prepare)

    def fail(self, db: Any, error: Json, retryable: bool = True) -> str:
        """A failed attempt: 'FAILED_RETRYABLE' (due again after a backoff)
        or 'FAILED_FINAL'.  Raises StaleToken (IK004)."""
        return perform(db, calls.fail(self.task_id, self.token, error, retryable), self.prepare)

    @contextmanager
    def traced(self, db: Any) -> Iterator[Any]:
        """A span (``idem.task``) for the work on this task, resuming the
        trace it was submitted under (``idem_task_trace_context``, idem
        1.16); the span, or None without OpenTelemetry.  Inside it
        ``tracing.traceparent()`` is this span's, for a transaction's
        ``idem.trace_context``."""
        if not tracing.enabled():
            yield None
            return
        parent = tracing.parent_of(perform(db, calls.task_trace_context(self.task_id, self.token), self.prepare))
        with tracing.span("idem.task", "consumer", parent, {"idem.task.attempt": self.attempt}) as current:
            yield current

    def fail_unknown(self, db: Any, error: Json) -> str:
        """An attempt whose outcome is unknown: 'PROCESSING' when the
        operation reconciles (the task waits for ``lease_reconcile``), else
        as a retryable ``fail``.  Raises StaleToken (IK004)."""
        return perform(db, calls.fail_unknown(self.task_id, self.token, error), self.prepare)


@dataclass
class ReconcileTask(Task):
    """A task whose outcome is uncertain, leased to find it out: since when,
    and its ended attempts (dicts: attempt, reconcile, worker, token,
    started_at, ended_at, outcome, http_status, error), oldest first."""
    uncertain_since: Optional[_dt.datetime] = None
    attempts: List[dict] = field(default_factory=list)

    @classmethod
    def of(cls, row: tuple, prepare: Optional[bool] = None) -> "ReconcileTask":
        """The task of a row of idem_lease_reconcile (calls.lease_reconcile)."""
        return cls(row[0], row[1], row[2], loads(row[3]), loads(row[4]), row[5], row[6], row[7], prepare,
                   row[8], loads(row[9]) or [])

    def not_charged(self, db: Any, error: Json = None) -> str:
        """The provider has no trace of the attempt: it had no effect, and
        the task is due again ('FAILED_RETRYABLE'; 'FAILED_FINAL' past
        max_attempts).  Raises StaleToken (IK004)."""
        return self.fail(db, error if error is not None else {"reconciled": "not charged"}, True)


class TaskWorker:
    """Leases the due tasks of one operation for one named worker."""

    def __init__(self, operation: str, worker: str, lease: Ttl = 30, bind_session: bool = False,
                 prepare: Optional[bool] = None):
        self.operation, self.worker, self.lease_for = operation, worker, lease
        self.bind_session = bind_session
        self.prepare = prepare
        self._listening = False

    def lease(self, db: Any, batch: int = 1) -> List[Task]:
        """Up to ``batch`` due tasks, each with a new token (committed at
        once when ``db`` is in autocommit).
        Raises InvalidRequest (a bad operation, worker or batch),
        Forbidden, ReadOnly.
        """
        rows = perform(db, calls.lease(self.operation, self.worker, self.lease_for, batch, self.bind_session),
                       self.prepare)
        return [Task.of(r, self.prepare) for r in rows]

    def lease_reconcile(self, db: Any, batch: int = 1) -> List[ReconcileTask]:
        """Up to ``batch`` tasks whose outcome is uncertain, each with a new
        token and its attempts so far.  A plain ``lease`` never returns
        them.  Raises what ``lease`` raises.
        """
        rows = perform(db, calls.lease_reconcile(self.operation, self.worker, self.lease_for, batch,
                                                 self.bind_session), self.prepare)
        return [ReconcileTask.of(r, self.prepare) for r in rows]

    def wait(self, conn: Any, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification of a submit
        (LISTEN idem_tasks on ``conn``, a psycopg 3 connection in autocommit
        kept for this: a session of its own, not behind a transaction
        pooler).  True when one came.  Poll anyway: the submits of a
        prepared transaction notify nobody.
        Raises the driver's error if the connection is lost.
        """
        if not self._listening:
            conn.execute("LISTEN idem_tasks")
            self._listening = True
        if not select.select([conn.fileno()], [], [], timeout)[0]:
            return False
        conn.execute("SELECT 1")     # reads the notifications that came
        return True
