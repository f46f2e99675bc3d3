"""Where idem is installed: its schema, named in every statement of this package.

A statement names idem's functions as ``@idem@.idem_begin(...)``; the
schema replaces ``@idem@`` before it is sent, looked up once per connection
in ``pg_extension`` (or set once with ``use_schema``), and every argument
is cast to the exact type of idem's parameter.  So a function of the same
name elsewhere on the caller's ``search_path``, or an overload in idem's own
schema that a ``smallint`` or a ``varchar`` would match better, never runs
in idem's place (docs/security.md).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

from .errors import IdemError

PLACEHOLDER = "@idem@"

LOOKUP_SQL = ("SELECT n.nspname FROM pg_catalog.pg_extension e"
              " JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
              " WHERE e.extname OPERATOR(pg_catalog.=) 'idem'")

_configured: Optional[str] = None
_found: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def quote(name: str) -> str:
    """A schema name as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def use_schema(name: Optional[str]) -> None:
    """Name idem's schema for every connection instead of looking it up
    (None: look it up again).
    Never raises; a schema that does not exist is Misconfigured (3F000)
    at the next call.
    """
    global _configured
    _configured = None if name is None else quote(name)


def _key(db: Any) -> Any:
    """The connection a cursor belongs to; a connection (or Django's) itself."""
    return db if hasattr(db, "cursor") else getattr(db, "connection", db)


def cached(db: Any) -> Optional[str]:
    """The quoted schema already known for this connection, if any."""
    if _configured is not None:
        return _configured
    try:
        return _found.get(_key(db))
    except TypeError:           # a connection that takes no weak reference
        return None


def remember(db: Any, row: Optional[tuple]) -> str:
    """The quoted schema from the lookup's row, kept for the connection."""
    if row is None:
        raise IdemError("idem is not installed in this database (CREATE EXTENSION idem)", "42883")
    name = quote(row[0])
    try:
        _found[_key(db)] = name
    except TypeError:
        pass
    return name


def statement(sql: str, schema: str) -> str:
    """The statement with idem's schema in place of the placeholder."""
    return sql.replace(PLACEHOLDER, schema)


__all__ = ["use_schema", "quote", "LOOKUP_SQL", "PLACEHOLDER"]
