"""An operator's actions (idem 1.16, docs/operations.md#when-things-go-wrong):
on a task, cancel, retry now, resolve with an answer, settle an uncertain
outcome; on dead letters, redrive or discard.  The role needs
``idem_grant(role, 'operator')``; each action is bound by the role's
``idem.allowed_owners`` and ``idem.allowed_operations`` and written to
``idem_operator_actions`` with the reason, in the caller's transaction.

    from idem_pg import operator

    operator.cancel_task(conn, 1001, "the customer cancelled by phone")
    operator.settle_task(conn, 1002, True, "found in the provider's dashboard", 201, {"charge": "ch_1"})

Each raises TaskStateConflict (IK008, HTTP 409) for a task whose state the
action does not take, Forbidden (42501) outside the role's owners or
operations, InvalidRequest for a missing reason, an unknown task or a bad
answer; a role without the grant gets the driver's InsufficientPrivilege.
Each returns the task's new status (the dead-letter calls: how many).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from . import calls
from .calls import Json
from .core import perform


def cancel_task(db: Any, task_id: int, reason: str) -> str:
    """End an unfinished task FAILED_FINAL (HTTP 500, ``{"error": {"cancelled": reason}}``)."""
    return perform(db, calls.task_cancel(task_id, reason))


def retry_task(db: Any, task_id: int, reason: str) -> str:
    """Make a task waiting for its next attempt (FAILED_RETRYABLE) due now."""
    return perform(db, calls.task_retry(task_id, reason))


def resolve_task(db: Any, task_id: int, http_status: int, body: Json, reason: str,
                 resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> str:
    """End an unfinished task with this answer (2xx/3xx SUCCEEDED, 4xx FAILED_FINAL); the
    client's repeat gets it."""
    return perform(db, calls.task_resolve(task_id, http_status, body, reason, resource_id, headers))


def settle_task(db: Any, task_id: int, happened: bool, reason: str, http_status: Optional[int] = None,
                body: Json = None, resource_id: Optional[int] = None) -> str:
    """Settle a task whose outcome is uncertain: the provider's answer (``happened``), or
    due again (it did not happen)."""
    return perform(db, calls.task_settle(task_id, happened, reason, http_status, body, resource_id))


def redrive_messages(db: Any, message_ids: Sequence[int], reason: Optional[str] = None) -> int:
    """Deliver outbox dead letters again (idem_outbox_redrive)."""
    return perform(db, calls.outbox_redrive(message_ids, reason))


def discard_messages(db: Any, message_ids: Sequence[int], reason: Optional[str] = None) -> int:
    """Give outbox dead letters up for good (idem_outbox_discard)."""
    return perform(db, calls.outbox_discard(message_ids, reason))


def redrive_consumer(db: Any, consumer: str, message_ids: Optional[Sequence[str]] = None, discard: bool = False,
                     reason: Optional[str] = None) -> int:
    """Let a consumer apply its dead letters again, or discard them (idem_inbox_redrive)."""
    return perform(db, calls.inbox_redrive(consumer, message_ids, discard, reason))


__all__ = ["cancel_task", "retry_task", "resolve_task", "settle_task", "redrive_messages", "discard_messages",
           "redrive_consumer"]
