"""idem from Python: the database-side idempotency of the idem PostgreSQL
extension in a few lines.

    import idem_pg
    with conn.transaction(), idem_pg.claim(conn, owner, "DEBIT", key, request) as c:
        if not c.replayed:
            ...                                   # the work, in the same transaction
            c.finish(201, {"debited": 100})

Modules: ``core`` (re-exported here) and ``aio`` (the same on an
AsyncConnection), both running the calls of ``calls`` (each of idem's
calls written once); ``errors`` (one exception per name of
docs/errors.tsv); ``tasks`` (long-flow workers); ``http`` (the HTTP
contract of clients/CONTRACT.md, one generator of steps driven by
``handle`` and ``handle_async``), ``wsgi``, ``asgi`` and ``django`` (its
middlewares); ``fast`` (the optional Redis layer); ``relay``, ``consumer``,
``kafka`` and ``redrive`` (the outbox and the inbox through Redis Streams,
RabbitMQ and Kafka); ``tracing`` (spans and the trace context, with
opentelemetry-api).
"""
from .core import (Claim, Outcome, RawJson, Submission, begin, claim, consume, emit, finish, finish_stored, run,
                   submit)
from .schema import use_schema
from .errors import (Forbidden, IdemError, InFlight, InvalidRequest, KeyExpired, KeyReused, KeyRunning, LeaseLost,
                     Misconfigured, NestedRun, NoClaim, NotAllowed, ReadOnly, SerializationFailure, StaleToken,
                     TaskStateConflict, UnfinishedClaim, retry_serializable, translate)
from .tasks import ReconcileTask, Task, TaskWorker

__version__ = "1.16.0"

__all__ = ["Claim", "Outcome", "RawJson", "Submission", "begin", "claim", "consume", "emit", "finish", "run",
           "submit", "finish_stored", "IdemError", "Forbidden", "InFlight", "InvalidRequest", "KeyExpired", "KeyReused",
           "KeyRunning", "Misconfigured", "NoClaim", "ReadOnly", "SerializationFailure", "StaleToken",
           "TaskStateConflict", "UnfinishedClaim", "LeaseLost", "NestedRun", "NotAllowed", "retry_serializable",
           "translate", "ReconcileTask", "Task", "TaskWorker", "use_schema"]
