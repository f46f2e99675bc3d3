"""idem's errors as Python exceptions, one class per SQLSTATE.

Every call of this package raises these instead of the driver's error (the
driver's error stays available as ``__cause__``); the transaction the call
ran in is then aborted, as with any database error, and must be rolled
back.  docs/reference.md has the full table.
"""
from __future__ import annotations

import random
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


class IdemError(Exception):
    """An error idem (or the server, for idem's call) raised."""

    sqlstate: Optional[str] = None

    def __init__(self, message: str, sqlstate: Optional[str] = None, detail: Optional[str] = None):
        super().__init__(message)
        self.message = message
        if sqlstate is not None:
            self.sqlstate = sqlstate
        self.detail = detail


class KeyReused(IdemError):
    """IK001: the key was already used with a different request."""
    sqlstate = "IK001"


class InFlight(IdemError):
    """IK002: the original request is still being processed."""
    sqlstate = "IK002"


class NoClaim(IdemError):
    """IK003: idem_finish without an unfinished claim in this transaction."""
    sqlstate = "IK003"


class LeaseLost(IdemError):
    """IK004: the task's lease is no longer this token's (taken over, finished)."""
    sqlstate = "IK004"


class UnfinishedClaim(IdemError):
    """IK005: the transaction claimed a key and did not finish it."""
    sqlstate = "IK005"


class NestedRun(IdemError):
    """IK006: a handler of idem_run called idem for the key being run."""
    sqlstate = "IK006"


class KeyExpired(IdemError):
    """IK007: the key's record expired and its operation refuses to execute it again
    (reuse_after_expiry 'refuse') until its audit period ends."""
    sqlstate = "IK007"


class InvalidRequest(IdemError):
    """22023, 22004, 22003, 22P02, 22P05: a bad argument (key, operation, ttl, JSON, a \\u0000...)."""
    sqlstate = "22023"


class ReadOnly(IdemError):
    """25006: the call must write and the server or transaction is read-only."""
    sqlstate = "25006"


class NotAllowed(IdemError):
    """42501: no right to the function, the owner or the operation."""
    sqlstate = "42501"


class SerializationFailure(IdemError):
    """40001: a REPEATABLE READ or SERIALIZABLE transaction raced another:
    retry the whole transaction (see retry_serializable)."""
    sqlstate = "40001"


class Misconfigured(IdemError):
    """42725, 42883, 3F000: idem's function is ambiguous (a function of the same
    name planted in idem's schema: idem_health().shadowing_functions) or
    missing (idem not installed); or, from the HTTP middlewares, the role
    lacks idem's grants (idem_grant(role, 'app')).  The server's setup, not
    the request: a 500."""
    sqlstate = "42725"


_BY_STATE = {
    "IK001": KeyReused, "IK002": InFlight, "IK003": NoClaim, "IK004": LeaseLost,
    "IK005": UnfinishedClaim, "IK006": NestedRun, "IK007": KeyExpired,
    "22023": InvalidRequest, "22004": InvalidRequest, "22003": InvalidRequest, "22P02": InvalidRequest,
    "22P05": InvalidRequest,
    "25006": ReadOnly, "42501": NotAllowed, "40001": SerializationFailure,
    "42725": Misconfigured, "42883": Misconfigured, "3F000": Misconfigured,
}


def sqlstate_of(error: BaseException) -> Optional[str]:
    """The SQLSTATE of a driver error: psycopg 3 (``sqlstate``), psycopg2
    (``pgcode``), or a wrapper whose cause is one (Django's)."""
    seen = 0
    while error is not None and seen < 4:
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if isinstance(state, str):
            return state
        error = error.__cause__
        seen += 1
    return None


def translate(error: BaseException) -> BaseException:
    """The idem exception for a driver error (or the error itself when it
    has no SQLSTATE: a lost connection, a bug)."""
    state = sqlstate_of(error)
    if state is None:
        return error
    cause = error
    while getattr(cause, "diag", None) is None and cause.__cause__ is not None:
        cause = cause.__cause__
    diag = getattr(cause, "diag", None)
    message = (diag.message_primary if diag is not None else None) or str(error).strip()
    detail = diag.message_detail if diag is not None else None
    cls = _BY_STATE.get(state, IdemError)
    return cls(message, state, detail)


def retry_serializable(transaction: Callable[[], T], attempts: int = 5,
                       base_delay: float = 0.01, max_delay: float = 1.0) -> T:
    """Run ``transaction`` (a function that opens, does and commits one
    whole transaction) again when it fails with 40001, up to ``attempts``
    times, waiting a random time up to base_delay * 2**n (at most
    max_delay) in between: the usual answer to a serialization failure
    under REPEATABLE READ or SERIALIZABLE.  Other errors propagate at once.

        def pay():
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                outcome = idem_pg.begin(conn, 42, "PAY", key, request)
                ...
        retry_serializable(pay)
    """
    for attempt in range(attempts):
        try:
            return transaction()
        except Exception as e:  # noqa: BLE001 - only 40001 is retried
            if sqlstate_of(e) != "40001" and not isinstance(e, SerializationFailure):
                raise
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0, min(max_delay, base_delay * 2 ** attempt)))
    raise AssertionError("unreachable")
