"""The generic API on a psycopg 3 AsyncConnection (the ASGI middleware's)."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from .core import (BEGIN_SQL, FINISH_SQL, FINISH_STORED_SQL, RUN_SQL, Json, Outcome, Ttl, _headers_param, _json, _outcome, _ttl)
from .errors import translate


async def _one(conn: Any, sql: str, params: tuple):
    try:
        cur = await conn.execute(sql, params)
        return await cur.fetchone()
    except Exception as e:  # noqa: BLE001 - translated, or re-raised as it is
        raise translate(e) from e


async def begin(conn: Any, owner: int, operation: str, key: str, request: Json, ttl: Ttl = None) -> Outcome:
    return _outcome(await _one(conn, BEGIN_SQL, (owner, operation, key, _json(request), _ttl(ttl))))


async def finish(conn: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                 resource_id: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> None:
    await _one(conn, FINISH_SQL, (owner, operation, key, http_status, _json(body), resource_id,
                                  _headers_param(headers)))


async def finish_stored(conn: Any, owner: int, operation: str, key: str, http_status: int, body: Json = None,
                        resource_id: Optional[int] = None,
                        headers: Optional[Mapping[str, str]] = None) -> Outcome:
    return _outcome(await _one(conn, FINISH_STORED_SQL, (owner, operation, key, http_status, _json(body),
                                                         resource_id, _headers_param(headers))))


async def run(conn: Any, owner: int, operation: str, key: str, request: Json, handler: str,
              ttl: Ttl = None) -> Outcome:
    return _outcome(await _one(conn, RUN_SQL, (owner, operation, key, _json(request), handler, _ttl(ttl))))
