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
"""
from __future__ import annotations

import datetime as _dt
import json
import select
from dataclasses import dataclass
from typing import Any, Iterator, List, Mapping, Optional

from .core import Json, Ttl, _json, _one, _rows, _ttl


HEARTBEAT_SQL = ("SELECT @idem@.idem_heartbeat(%s::pg_catalog.int8, %s::pg_catalog.int8,"
                 " %s::pg_catalog.interval)")
COMPLETE_SQL = ("SELECT @idem@.idem_complete(%s::pg_catalog.int8, %s::pg_catalog.int8, %s::pg_catalog.int4,"
                " %s::pg_catalog.json, %s::pg_catalog.int8, %s::pg_catalog.jsonb)")
FAIL_SQL = ("SELECT @idem@.idem_fail(%s::pg_catalog.int8, %s::pg_catalog.int8, %s::pg_catalog.jsonb,"
            " %s::pg_catalog.bool)")
LEASE_SQL = ("SELECT task_id, owner, key, request::pg_catalog.text, payload::pg_catalog.text, attempt, token,"
             " lease_expires_at FROM @idem@.idem_lease(%s::pg_catalog.text, %s::pg_catalog.text,"
             " %s::pg_catalog.interval, %s::pg_catalog.int4, %s::pg_catalog.bool)")


def _task_of(row, prepare: Optional[bool] = None) -> "Task":
    return Task(row[0], row[1], row[2], _loads(row[3]), _loads(row[4]), row[5], row[6], row[7], prepare)


def _complete_params(task: "Task", http_status: int, body: Json, resource_id: Optional[int],
                     headers: Optional[Mapping[str, str]]) -> tuple:
    return (task.task_id, task.token, http_status, _json(body), resource_id,
            json.dumps(dict(headers)) if headers is not None else None)


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

    def heartbeat(self, db: Any, extend: Ttl = None) -> _dt.datetime:
        """Extend the lease (by the granted interval, or ``extend``); its new end."""
        self.lease_expires_at = _one(db, HEARTBEAT_SQL, (self.task_id, self.token, _ttl(extend)), self.prepare)[0]
        return self.lease_expires_at

    def complete(self, db: Any, http_status: int, body: Json = None, resource_id: Optional[int] = None,
                 headers: Optional[Mapping[str, str]] = None) -> None:
        """Store the result (2xx-4xx), in the transaction of the business write."""
        _one(db, COMPLETE_SQL, _complete_params(self, http_status, body, resource_id, headers), self.prepare)

    def fail(self, db: Any, error: Json, retryable: bool = True) -> str:
        """A failed attempt: 'FAILED_RETRYABLE' (due again after a backoff)
        or 'FAILED_FINAL'."""
        return _one(db, FAIL_SQL, (self.task_id, self.token, _json(error), retryable), self.prepare)[0]


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
        once when ``db`` is in autocommit)."""
        rows = _rows(db, LEASE_SQL, (self.operation, self.worker, _ttl(self.lease_for), batch, self.bind_session),
                     self.prepare)
        return [_task_of(r, self.prepare) for r in rows]

    def wait(self, conn: Any, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification of a submit
        (LISTEN idem_tasks on ``conn``, a psycopg 3 connection in autocommit
        kept for this: a session of its own, not behind a transaction
        pooler).  True when one came.  Poll anyway: the submits of a
        prepared transaction notify nobody."""
        if not self._listening:
            conn.execute("LISTEN idem_tasks")
            self._listening = True
        if not select.select([conn.fileno()], [], [], timeout)[0]:
            return False
        conn.execute("SELECT 1")     # reads the notifications that came
        return True


def _loads(text: Optional[str]) -> Json:
    return None if text is None else json.loads(text)
