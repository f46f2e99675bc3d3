"""The fast layer (the article's section 11): Redis in front of the
database for hot keys.  It never decides: a cached answer is used only when
its request fingerprint is this request's; an in-flight marker answers a
duplicate "processing" at once and is released only by its holder
(compare-and-delete) or expires; every Redis error, timeout or miss falls
through to PostgreSQL, which alone decides (IK001 included).

    fast = FastLayer(redis.Redis.from_url(url, socket_timeout=0.05, socket_connect_timeout=0.05))
    settings = Settings(owner=..., connection=pool.connection, fast=fast)

Needs the optional dependency ``redis`` (pip install idem-pg[redis]).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import secrets
from typing import Any, Optional

from .http import Answer, Problem, Prepared, http_date, replayed_headers

# the article's release: delete the marker only if it is still ours
RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class FastLayer:
    def __init__(self, client: Any, max_cache_seconds: int = 300, marker_ms: int = 2000,
                 prefix: str = "idem", settings: Any = None):
        import redis  # the optional dependency: an ImportError here says what is missing
        self.errors = (redis.RedisError, OSError)
        self.r = client
        self.max_cache = max_cache_seconds
        self.marker_ms = marker_ms
        self.prefix = prefix
        self.settings = settings
        self._release = client.register_script(RELEASE)

    def _name(self, p: Prepared) -> str:
        # the key is hashed: a raw key never reaches Redis's keyspace or logs
        digest = hashlib.sha256(p.key.encode()).hexdigest()[:32]
        return "%s:%d:%s:%s" % (self.prefix, p.owner, p.route.operation, digest)

    @staticmethod
    def fingerprint(request: Any) -> str:
        text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def before(self, p: Prepared) -> Optional[Answer]:
        """A cached answer of this request, or None (go to the database).
        Raises the in-flight problem when a holder with this fingerprint is
        executing it now."""
        p.fingerprint = self.fingerprint(p.request)
        name = self._name(p)
        try:
            raw = self.r.get(name)
            if raw is not None:
                entry = json.loads(raw)
                if entry.get("fp") == p.fingerprint:
                    headers = replayed_headers(entry["headers"]) + [("Idempotent-Replayed", "true"),
                                                                    ("X-Idem-Cache", "hit")]
                    if entry.get("expires"):
                        headers.append(("Idempotency-Expires", entry["expires"]))
                    return Answer(entry["status"], headers, entry["body"].encode())
            marker = "%s:%s" % (secrets.token_hex(8), p.fingerprint)
            if self.r.set(name + ":flight", marker, nx=True, px=self.marker_ms):
                p.marker = marker
                return None
            held = self.r.get(name + ":flight")
        except self.errors:
            return None
        if held is not None and held.decode().split(":", 1)[-1] == p.fingerprint:
            retry = str(self.settings.in_flight_retry_after if self.settings else 1)
            raise Problem(409, "in-flight", "the first request with this key is still being processed; retry later",
                          [("Retry-After", retry), ("X-Idem-Cache", "in-flight")])
        return None

    def after(self, p: Prepared, answer: Answer, outcome: Any) -> None:
        """Cache the answer as the record holds it -- a replay's, or what
        idem_finish_stored returned for a first execution that committed:
        the bytes the database stored, after its ``redact`` policy, never
        the handler's own -- for no longer than the record lives."""
        if outcome is None or outcome.expires_at is None or outcome.http_status is None \
                or not 200 <= outcome.http_status <= 499:
            return
        seconds = min(self.max_cache,
                      int((outcome.expires_at - _dt.datetime.now(_dt.timezone.utc)).total_seconds()))
        if seconds <= 0:
            return
        entry = {"fp": p.fingerprint, "status": outcome.http_status, "body": outcome.body or "",
                 "headers": dict(outcome.headers or {}), "expires": http_date(outcome.expires_at)}
        try:
            self.r.set(self._name(p), json.dumps(entry), ex=seconds)
        except self.errors:
            pass

    def release(self, p: Prepared) -> None:
        if p.marker is None:
            return
        try:
            self._release(keys=[self._name(p) + ":flight"], args=[p.marker])
        except self.errors:
            pass
