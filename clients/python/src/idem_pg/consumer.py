"""Consumers of what ``idem_pg.relay`` publishes, through idem's inbox
(docs/messaging.md, "Through a broker").

    def apply(conn, message):              # the effect, in the inbox's transaction
        conn.execute("INSERT INTO shipment ...", ...)

    RedisConsumer(dsn, "orders", "redis://127.0.0.1:6379/0", consumer="billing",
                  name="billing-1", partitions=8).run(apply)

For each message: a transaction opens, ``idem_consume(consumer, message
id)`` says whether this consumer has taken it before; only the first time
is the effect applied; the transaction commits; then the broker is
acknowledged.  A crash anywhere in between applies no effect twice: before
the commit nothing happened, after it the redelivery finds its inbox entry
and is only acknowledged.

Per-key order needs one active consumer per partition at a time:

- Redis Streams: a consumer holds a partition's stream with a lease in
  Redis (``SET ... NX PX``, renewed while it works); a consumer taking a
  stream over first claims and handles the entries its predecessor left
  unacknowledged (XAUTOCLAIM), in stream order, then reads new ones;
- RabbitMQ: each partition's queue is single-active-consumer, and the
  consumer takes one message at a time (prefetch 1) and acknowledges it
  after its commit; RabbitMQ hands the queue to another consumer when the
  active one goes, its unacknowledged message first.

A message that cannot be applied (a payload that is not JSON, a handler
that raises) is tried again with backoff (``retry_base_ms`` doubling to
``retry_max_ms``); each failure is counted in PostgreSQL
(``idem_consume_failed``, outside the effect's transaction, so the count
survives restarts).  Past ``max_attempts`` (default: the topic's
``max_deliveries``, else ``idem.outbox_max_deliveries``) it is a dead
letter: handed to the broker's dead-lettering (RabbitMQ: rejected without
requeue, to the queue's dead-letter exchange set by a policy; Redis: the
stream ``<stream>:dead:<consumer>``) and the consumer goes on.  Of a topic
whose ``on_dead`` is ``'block'`` (the default), the key's later messages
are set aside behind it the same way, in order, until the operator
redrives them (``python3 -m idem_pg.redrive``); with ``'skip'`` they are
applied.  docs/dead-letters.md.

A test hook: with ``IDEM_PG_CONSUMER_CRASH_BEFORE_ACK=N`` in the
environment, the process exits (``os._exit``) right after the commit of its
N-th message and before the broker's acknowledgement: what a crash there
does, made deterministic.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg

from . import tracing
from .calls import SET_TRACE_SQL as _SET_TRACE
from .core import consume, with_schema

log = logging.getLogger("idem_pg.consumer")


@dataclass
class Delivery:
    """A message as the broker delivered it."""
    message_id: str         # idem's outbox message id: the inbox's key
    key: Optional[str]
    payload: Any            # parsed JSON
    headers: Optional[Dict[str, str]]
    partition: int
    redelivered: bool = False
    published_ms: Optional[int] = None    # when the relay published it


Handler = Callable[[Any, Delivery], None]

# what idem stores of a message id (1 to 512 characters) and a key (up to
# 256), printable (no C0, DEL or C1 control character: idem_consume's rule)
_ID_MAX, _KEY_MAX = 512, 256
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def stand_in(value: Any, limit: int) -> Optional[str]:
    """A message id or key as idem stores it: the value itself, or, when
    idem cannot store it (empty, too long, a control character, not UTF-8),
    ``sha256:<hex of its raw bytes>``: one stand-in for every redelivery of
    the entry, in idem_consume_check and idem_consume_failed alike (such an
    entry is a dead letter, never applied).  None stays None (no key)."""
    if value is None:
        return None
    raw = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else str(value).encode("utf-8", "surrogatepass")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or not text or len(text) > limit or _CONTROL.search(text):
        return "sha256:" + hashlib.sha256(raw).hexdigest()
    return text


def _text(value: Any) -> Optional[str]:
    """A field as text (bytes from the broker decoded, as json.loads would)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    return None if value is None else str(value)


class _CrashHook:
    """IDEM_PG_CONSUMER_CRASH_BEFORE_ACK=N: exit after the N-th commit, before its ack."""

    def __init__(self) -> None:
        value = os.environ.get("IDEM_PG_CONSUMER_CRASH_BEFORE_ACK")
        self.at = int(value) if value else 0
        self.done = 0

    def committed(self) -> None:
        self.done += 1
        if self.at and self.done == self.at:
            log.warning("idem_pg.consumer: IDEM_PG_CONSUMER_CRASH_BEFORE_ACK=%d: exiting after the commit, before the ack",
                        self.at)
            os._exit(70)


class _Failed(Exception):
    """A delivery that could not be applied this time (its cause chained)."""


class _LeaseLost(Exception):
    """A Redis consumer lost its stream while waiting to try a message again."""


_CHECK = ("SELECT verdict, blocked_by FROM @idem@.idem_consume_check(%s::pg_catalog.text, %s::pg_catalog.text,"
          " %s::pg_catalog.text, %s::pg_catalog.int8)")
_FAILED = ("SELECT attempts, dead FROM @idem@.idem_consume_failed(%s::pg_catalog.text, %s::pg_catalog.text,"
           " %s::pg_catalog.text, %s::pg_catalog.text, %s::pg_catalog.text, %s::pg_catalog.int4, %s::pg_catalog.int8)")


class _Inbox:
    """The transaction of one delivery: idem_consume_check, idem_consume, the
    effect, commit; failures counted apart and tried again with backoff."""

    def __init__(self, dsn: str, consumer: str, topic: str, owner_of: Optional[Callable[[Delivery], Optional[int]]],
                 max_attempts: Optional[int] = None, retry_base_ms: float = 100.0, retry_max_ms: float = 30_000.0):
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be at least 1, or None for the topic's max_deliveries")
        self.dsn, self.consumer, self.topic, self.owner_of = dsn, consumer, topic, owner_of
        self.max_attempts, self.retry_base_ms, self.retry_max_ms = max_attempts, retry_base_ms, retry_max_ms
        self.conn: Optional[psycopg.Connection] = None
        self.crash = _CrashHook()
        self.applied = 0
        self.duplicates = 0
        self.dead = 0
        self.set_aside = 0

    def connection(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.dsn, autocommit=True)
        return self.conn

    def take(self, fields: Dict[str, Any], partition: int, redelivered: bool, handler: Handler,
             pause: Callable[[float], None] = time.sleep) -> Tuple[str, str]:
        """Apply a delivery once, trying again after failures; returns when it
        is committed (ack next) as ('applied' | 'duplicate', '') or when it is
        to be dead-lettered as ('dead' | 'set_aside', why)."""
        while True:
            outcome, why, delay = self.attempt(fields, partition, redelivered, handler)
            if outcome != "retry":
                return outcome, why
            pause(delay)

    def attempt(self, fields: Dict[str, Any], partition: int, redelivered: bool,
                handler: Handler) -> Tuple[str, str, float]:
        """One try of a delivery: ('applied' | 'duplicate', '', 0) once
        committed; ('dead' | 'set_aside', why, 0) to dead-letter it; or
        ('retry', why, seconds): it failed, the failure is counted in
        PostgreSQL, and it is to be tried again after that backoff."""
        message_id, key = stand_in(fields.get("id"), _ID_MAX), stand_in(fields.get("key"), _KEY_MAX)
        if message_id is None:
            message_id = stand_in(b"", _ID_MAX)
        # an id or key idem cannot store: the entry is not what a relay sends,
        # and is not applied under a stand-in: a dead letter at once
        malformed = message_id.startswith("sha256:") or (key is not None and key.startswith("sha256:"))
        try:
            if malformed:
                raise _Failed() from ValueError("the entry's id or key cannot be stored by idem: a stand-in replaces it")
            outcome, why = self._once(fields, message_id, key, partition, redelivered, handler)
            return outcome, why, 0.0
        except _Failed as failure:
            cause = failure.__cause__
        reason = ("%s: %s" % (type(cause).__name__, cause)).replace("\x00", "\\0")
        log.error("idem_pg.consumer: %s: message %s (key %s) failed: %s", self.consumer, message_id, key,
                  reason, exc_info=None if malformed else cause)
        conn = self.connection()
        try:
            attempts, dead = conn.execute(
                with_schema(conn, _FAILED), (self.consumer, message_id, reason[:1000], key, self.topic,
                                             1 if malformed else self.max_attempts,
                                             self._owner_of_fields(fields, message_id, key, partition, redelivered)),
                prepare=False).fetchone()
        except psycopg.OperationalError:
            raise               # the connection: reconnect, the message comes again
        except psycopg.Error as e:
            # an entry whose failure cannot be recorded is a dead letter at once
            log.error("idem_pg.consumer: %s: message %s: its failure cannot be recorded (%s): a dead letter",
                      self.consumer, message_id, e)
            return "dead", "its failure could not be recorded: %s" % e, 0.0
        if dead:
            log.error("idem_pg.consumer: %s: message %s is a dead letter after %d attempts: %s",
                      self.consumer, message_id, attempts, reason)
            return "dead", "after %d attempts: %s" % (attempts, reason), 0.0
        return "retry", reason, min(self.retry_max_ms, self.retry_base_ms * 2 ** (attempts - 1)) / 1000.0

    def _owner_of_fields(self, fields: Dict[str, Any], message_id: str, key: Optional[str], partition: int,
                         redelivered: bool) -> Optional[int]:
        try:
            return self.owner_of(_delivery(fields, message_id, key, partition, redelivered)) if self.owner_of else None
        except Exception:       # noqa: BLE001 - an undecodable payload has no owner
            return None

    def _once(self, fields: Dict[str, Any], message_id: str, key: Optional[str], partition: int, redelivered: bool,
              handler: Handler) -> Tuple[str, str]:
        conn = self.connection()
        try:
            delivery = _delivery(fields, message_id, key, partition, redelivered)
            owner = self.owner_of(delivery) if self.owner_of else None
        except Exception as e:          # noqa: BLE001 - not JSON, or no owner: the message's failure
            raise _Failed() from e
        # the span resumes the emitter's trace (the relay's traceparent header, or the message's headers)
        parent = tracing.parent_of(tracing.traceparent_of(fields, delivery.headers))
        with tracing.span("idem.consume", "consumer", parent,
                          {"idem.consumer": self.consumer, "messaging.destination.name": self.topic}) as current:
            verdict, why, first = self._transaction(conn, delivery, message_id, key, owner, handler)
            tracing.set_outcome(current, verdict if verdict != "apply" else ("applied" if first else "duplicate"))
        if verdict != "apply":
            return verdict, why
        if first:
            self.applied += 1
        else:
            self.duplicates += 1
        self.crash.committed()
        return ("applied" if first else "duplicate"), ""

    def _transaction(self, conn: psycopg.Connection, delivery: Delivery, message_id: str, key: Optional[str],
                     owner: Optional[int], handler: Handler) -> Tuple[str, str, bool]:
        """The delivery's transaction: (verdict, why, first time)."""
        try:
            with conn.transaction():
                trace = tracing.traceparent()
                if trace is not None:   # the handler's emits and submits go on with this trace
                    conn.execute(_SET_TRACE, (trace,), prepare=False)
                verdict, blocked_by = conn.execute(with_schema(conn, _CHECK), (self.consumer, message_id, key, owner),
                                                   prepare=False).fetchone()
                if verdict != "apply":
                    why = "behind the dead letter %s of its key" % blocked_by if blocked_by else "a dead letter"
                    self.set_aside += verdict == "set_aside"
                    return verdict, why, False
                first = consume(conn, self.consumer, message_id, owner=owner, prepare=False)
                if first:
                    handler(conn, delivery)
            return verdict, "", first
        except psycopg.OperationalError as e:
            if conn.closed or conn.broken:
                raise                   # the connection: reconnect, the message comes again
            raise _Failed() from e
        except Exception as e:          # noqa: BLE001 - the handler's (or its SQL's) failure
            raise _Failed() from e

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _delivery(fields: Dict[str, Any], message_id: str, key: Optional[str], partition: int,
              redelivered: bool) -> Delivery:
    """The message as the handler gets it (its id and key as idem stores them);
    raises for a payload or headers that are not JSON, or a field missing."""
    headers = fields.get("headers")
    published = _text(fields.get("published_ms"))
    return Delivery(message_id, key, json.loads(fields["payload"]),
                    json.loads(headers) if headers else None, partition, redelivered,
                    int(published) if published else None)


# a lease is released only by its holder
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
# new entries of a stream, read only while the reader holds its lease: a
# consumer whose lease lapsed cannot take entries its successor would miss
_READ = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
         "return redis.call('xreadgroup', 'GROUP', ARGV[2], ARGV[1], 'COUNT', ARGV[3], 'STREAMS', KEYS[2], '>') "
         "else return false end")
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"


class RedisConsumer:
    """A consumer group member on the streams ``<prefix><topic>.<p>`` that
    holds each stream it reads with a lease (one active consumer a stream)."""

    def __init__(self, dsn: str, topic: str, broker: str, consumer: str, name: str, partitions: int = 8,
                 prefix: str = "", lease: float = 5.0, block: float = 0.5,
                 owner_of: Optional[Callable[[Delivery], Optional[int]]] = None,
                 max_attempts: Optional[int] = None, retry_base_ms: float = 100.0, retry_max_ms: float = 30_000.0):
        import redis
        self.redis_module = redis
        self.url, self.topic, self.consumer, self.name = broker, topic, consumer, name
        self.partitions, self.prefix, self.lease_ms, self.block_ms = partitions, prefix, int(lease * 1000), int(block * 1000)
        self.streams = ["%s%s.%d" % (prefix, topic, p) for p in range(partitions)]
        self.inbox = _Inbox(dsn, consumer, topic, owner_of, max_attempts, retry_base_ms, retry_max_ms)
        self.held: Dict[int, bool] = {}      # partition -> its leftovers handled
        self.stopping = False
        self.redis: Any = None

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def _connect(self) -> None:
        # bytes: an entry's fields as written (a value that is not UTF-8 is
        # the entry's failure, never the reader's)
        self.redis = self.redis_module.Redis.from_url(self.url, decode_responses=False)
        for s in self.streams:
            try:
                self.redis.xgroup_create(s, self.consumer, id="0", mkstream=True)
            except self.redis_module.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    def _lock(self, p: int) -> str:
        return "%s:lease:%s" % (self.streams[p], self.consumer)

    def _renew(self, p: int) -> bool:
        """Renew the lease of a stream held; False (and let go of it) if it lapsed."""
        if self.redis.eval(_RENEW, 1, self._lock(p), self.name, self.lease_ms):
            return True
        log.warning("idem_pg.consumer: %s lost stream %s", self.name, self.streams[p])
        del self.held[p]
        return False

    def _hold(self) -> None:
        """Renew the leases held; take the free ones."""
        for p in range(self.partitions):
            if p in self.held:
                self._renew(p)
            elif self.redis.set(self._lock(p), self.name, nx=True, px=self.lease_ms):
                self.held[p] = False

    def _leftovers(self, p: int, handler: Handler) -> None:
        """A stream just taken: its unacknowledged entries first, in order."""
        stream = self.streams[p]
        start = "0-0"
        while True:     # every pending entry, whoever had it, is now ours
            reply = self.redis.xautoclaim(stream, self.consumer, self.name, 0, start, count=100)
            start = reply[0]
            if start in ("0-0", b"0-0"):
                break
        while True:
            entries = self.redis.xreadgroup(self.consumer, self.name, {stream: "0"}, count=100)
            items = entries[0][1] if entries else []
            if not items:
                break
            for entry_id, fields in items:
                if not self._take(p, entry_id, fields, True, handler):
                    return
        self.held[p] = True

    def dead_stream(self, p: int) -> str:
        """Where this consumer's dead letters of partition p go: ``<stream>:dead:<consumer>``."""
        return "%s:dead:%s" % (self.streams[p], self.consumer)

    def _pause(self, p: int, seconds: float) -> None:
        """Wait before trying a message again, keeping the stream's lease."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, self.lease_ms / 3000.0))
            if not self._renew(p):
                raise _LeaseLost()

    def _take(self, p: int, entry_id: Any, fields: Dict[Any, Any], redelivered: bool, handler: Handler) -> bool:
        """One entry, under a lease renewed for it: no other consumer can hold the
        stream before this entry is acknowledged (a slow batch cannot outlive
        the lease).  False, with nothing done, if the lease had lapsed.  A dead
        letter (or a message set aside behind one) goes to the dead stream,
        then is acknowledged."""
        if not self._renew(p):
            return False
        entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        fields = {(k.decode("utf-8", "replace") if isinstance(k, bytes) else k): v for k, v in fields.items()}
        fields.setdefault("id", "redis:" + entry_id)
        try:
            outcome, why = self.inbox.take(fields, p, redelivered, handler, lambda s: self._pause(p, s))
        except _LeaseLost:
            return False
        if outcome in ("dead", "set_aside"):
            dead = dict(fields, idem_dead_reason=why, idem_consumer=self.consumer, idem_stream_entry=entry_id)
            self.redis.xadd(self.dead_stream(p), dead)
        self.redis.xack(self.streams[p], self.consumer, entry_id)
        return True

    def run_once(self, handler: Handler) -> int:
        self._hold()
        for p, done in list(self.held.items()):
            if not done:
                self._leftovers(p, handler)
        if not self.held:
            time.sleep(self.block_ms / 1000.0)
            return 0
        n = 0
        for p in list(self.held):
            reply = self.redis.eval(_READ, 2, self._lock(p), self.streams[p], self.name, self.consumer, 50)
            for entry_id, flat in (reply[0][1] if reply else []):
                fields = dict(zip(flat[0::2], flat[1::2]))
                # lost: its next holder claims the rest
                if p not in self.held or not self._take(p, entry_id, fields, False, handler):
                    break
                n += 1
        if n == 0:
            time.sleep(self.block_ms / 1000.0 / 5)
        return n

    def run(self, handler: Handler) -> None:
        """Consume until ``stop()``; reconnects to Redis and PostgreSQL on failures."""
        while not self.stopping:
            try:
                if self.redis is None:
                    self._connect()
                self.run_once(handler)
            except (self.redis_module.ConnectionError, self.redis_module.TimeoutError, psycopg.OperationalError,
                    self.redis_module.ResponseError) as e:
                # an error reply too (OOM, LOADING, READONLY: a lease or a read refused): start again
                log.warning("idem_pg.consumer: %s; reconnecting", e)
                self.redis, self.held = None, {}
                self.inbox.close()
                time.sleep(0.3)
        if self.redis is not None:
            for p in list(self.held):
                self.redis.eval(_RELEASE, 1, self._lock(p), self.name)
        self.inbox.close()


class RabbitConsumer:
    """A consumer of the single-active-consumer queues ``<prefix><topic>.<p>``,
    one message at a time, acknowledged after its commit."""

    def __init__(self, dsn: str, topic: str, broker: str, consumer: str, name: str, partitions: int = 8,
                 prefix: str = "", owner_of: Optional[Callable[[Delivery], Optional[int]]] = None,
                 max_attempts: Optional[int] = None, retry_base_ms: float = 100.0, retry_max_ms: float = 30_000.0):
        import pika
        self.pika = pika
        self.url, self.name = broker, name
        self.queues = ["%s%s.%d" % (prefix, topic, p) for p in range(partitions)]
        self.inbox = _Inbox(dsn, consumer, topic, owner_of, max_attempts, retry_base_ms, retry_max_ms)
        self.stopping = False
        self.connection: Any = None

    def stop(self, *_: Any) -> None:
        self.stopping = True
        if self.connection is not None:
            self.connection.add_callback_threadsafe(lambda: None)

    def run(self, handler: Handler) -> None:
        from .relay import declare_rabbit_queue
        while not self.stopping:
            try:
                self.connection = self.pika.BlockingConnection(self.pika.URLParameters(self.url))
                channel = self.connection.channel()
                channel.basic_qos(prefetch_count=1)
                for p, q in enumerate(self.queues):
                    declare_rabbit_queue(channel, q)

                    def on_message(ch: Any, method: Any, props: Any, body: bytes, p: int = p) -> None:
                        fields = dict(props.headers or {})
                        fields["payload"] = body        # bytes: json.loads checks the encoding
                        fields.setdefault("id", props.message_id or "amqp:%s" % method.delivery_tag)
                        outcome, _why = self.inbox.take(fields, p, bool(method.redelivered), handler,
                                                        self.connection.sleep)
                        if outcome in ("dead", "set_aside"):
                            # to the queue's dead-letter exchange (a policy's; without one RabbitMQ drops it)
                            ch.basic_nack(method.delivery_tag, requeue=False)
                        else:
                            ch.basic_ack(method.delivery_tag)
                    channel.basic_consume(q, on_message, consumer_tag="%s-%d" % (self.name, p))
                while not self.stopping:
                    self.connection.process_data_events(time_limit=0.5)
                self.connection.close()
            except (self.pika.exceptions.AMQPError, psycopg.OperationalError, OSError) as e:
                log.warning("idem_pg.consumer: %s; reconnecting", e)
                self.inbox.close()
                time.sleep(0.5)
        self.inbox.close()


def consumer_of(broker: str, *args: Any, **kwargs: Any) -> Any:
    """The consumer for a broker URL: RedisConsumer, RabbitConsumer or
    KafkaConsumer (idem_pg.kafka)."""
    if broker.startswith(("redis://", "rediss://", "unix://")):
        return RedisConsumer(args[0], args[1], broker, *args[2:], **kwargs)
    if broker.startswith(("amqp://", "amqps://")):
        return RabbitConsumer(args[0], args[1], broker, *args[2:], **kwargs)
    if broker.startswith("kafka://"):
        from .kafka import KafkaConsumer
        return KafkaConsumer(args[0], args[1], broker, *args[2:], **kwargs)
    raise ValueError("broker URL must start with redis://, amqp:// or kafka://, not %r" % broker)


__all__: List[str] = ["Delivery", "RedisConsumer", "RabbitConsumer", "consumer_of"]
