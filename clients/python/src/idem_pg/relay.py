"""The outbox relay: idem's outbox to a message broker, with publisher
confirms (docs/messaging.md, "Through a broker").

    python3 -m idem_pg.relay --dsn postgresql:///shop --topic orders \\
        --broker redis://127.0.0.1:6379/0 --partitions 8

It leases the topic's deliverable messages (``idem_outbox_fetch``),
publishes them, and acknowledges (``idem_outbox_ack``) only what the broker
confirmed.  A message goes to partition ``crc32(key) % partitions`` (a
keyless one to ``message_id % partitions``), so a key always lands on the
same stream or queue; a fetch hands out only each key's head, and the next
message of a key is not deliverable before the head is acknowledged, so a
relay never has two messages of one key unconfirmed, and a key's messages
reach the broker in commit order.  A relay that dies after publishing and
before acknowledging leaves the message leased: once the lease lapses it
is fetched and published again (at-least-once; the consumer's inbox,
``idem_pg.consumer``, drops the duplicate).  Several relays may run at once:
the fetch leases with ``FOR UPDATE SKIP LOCKED``.

It waits on ``LISTEN idem_outbox`` (a session connection of its own: not
through a transaction pooler) and polls every ``--poll`` seconds anyway.
SIGTERM and SIGINT stop it after the batch in hand is confirmed and
acknowledged.

A test hook: with ``IDEM_PG_RELAY_PAUSE_BEFORE_ACK=N`` in the environment,
the relay stops for good after the broker confirmed its N-th batch and
before the outbox's acknowledgement, saying so in its log: a test kills
it there (kill -9), made deterministic.

Brokers, by URL: ``redis://`` (Redis Streams: one stream per partition,
``<prefix><topic>.<partition>``, XADD in one pipeline, the replies being the
confirms), ``amqp://`` (RabbitMQ: one durable queue per partition,
``<prefix><topic>.<partition>``, single-active-consumer, persistent messages
published with confirms, mandatory) and ``kafka://`` (Apache Kafka: the
topic ``<prefix><topic>``, created with ``--partitions`` when missing, an
idempotent producer, the key as the Kafka key placed by the Java client's
murmur2, delivery reports as the confirms; ``idem_pg.kafka``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Tuple, Any, Callable, Dict, List, Optional, Sequence

import psycopg

from .core import with_schema

_FETCH = ("SELECT message_id, msg_key, payload::pg_catalog.text, headers::pg_catalog.text, attempt,"
          " extract(epoch FROM pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) emitted_at)::pg_catalog.float8"
          " FROM @idem@.idem_outbox_fetch(%s::pg_catalog.text, %s::pg_catalog.int4,"
          " pg_catalog.make_interval(secs => %s::pg_catalog.float8))")
_HEALTH = ("SELECT outbox_unacked, extract(epoch FROM outbox_oldest_unacked_age)::pg_catalog.float8"
           " FROM @idem@.idem_health()")
_ACK = "SELECT @idem@.idem_outbox_ack(%s::pg_catalog.int8[])"
_NACK = "SELECT @idem@.idem_outbox_nack(%s::pg_catalog.int8[], %s::pg_catalog.text, true)"

log = logging.getLogger("idem_pg.relay")


@dataclass
class Message:
    """An outbox message as fetched, and where it goes."""
    message_id: int
    key: Optional[str]
    payload: str            # the jsonb's text
    headers: Optional[str]
    attempt: int
    partition: int = 0

    def fields(self) -> Dict[str, str]:
        """What a broker carries: the id (the consumer's message id), the key,
        the payload, the headers, the attempt, and when the relay published it
        (milliseconds since the epoch)."""
        out = {"id": str(self.message_id), "payload": self.payload, "attempt": str(self.attempt),
               "published_ms": str(int(time.time() * 1000))}
        if self.key is not None:
            out["key"] = self.key
        if self.headers is not None:
            out["headers"] = self.headers
            # the emit's trace context (idem.trace_context) as the broker's own header
            trace = _traceparent_in(self.headers)
            if trace is not None:
                out["traceparent"] = trace
        return out


def _traceparent_in(headers: str) -> Optional[str]:
    """The "traceparent" of a message's headers (jsonb text), if it has one."""
    if '"traceparent"' not in headers:
        return None
    try:
        value = json.loads(headers).get("traceparent")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


@dataclass
class Published:
    """What a broker did with a batch: the message ids it confirmed, and
    those it refused for good with why (nacked as permanent).  The rest it
    did not take for a reason that may pass (a lost connection, a full
    broker): they are neither acknowledged nor nacked; their leases lapse
    and they are published again."""
    confirmed: List[int] = field(default_factory=list)
    refused: Dict[int, str] = field(default_factory=dict)


# Redis error replies that may pass: not the message's fault (nothing nacked).
# redis-py turns some codes into classes and strips them from the text
# (OOM -> OutOfMemoryError "command not allowed when used memory > ..."):
# both the classes and the codes are looked at.
_REDIS_TRANSIENT_CODES = ("OOM", "LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "READONLY", "CLUSTERDOWN",
                          "NOREPLICAS", "MISCONF")
_REDIS_TRANSIENT_CLASSES = ("OutOfMemoryError", "BusyLoadingError", "TryAgainError", "MasterDownError",
                            "ReadOnlyError", "ClusterDownError")


def redis_transient(error: BaseException) -> bool:
    """Whether a Redis error reply may pass (the broker's state, not the message)."""
    names = {c.__name__ for c in type(error).__mro__}
    return bool(names & set(_REDIS_TRANSIENT_CLASSES)) or str(error).startswith(_REDIS_TRANSIENT_CODES) \
        or "maxmemory" in str(error)


def partition_of(key: Optional[str], message_id: int, partitions: int) -> int:
    """A key's partition: the same for every message of the key."""
    if key is None:
        return message_id % partitions
    return zlib.crc32(key.encode("utf-8")) % partitions


class RedisStreams:
    """Redis Streams: XADD to ``<prefix><topic>.<partition>``; a reply is the confirm."""

    def __init__(self, url: str, topic: str, partitions: int, prefix: str = ""):
        import redis
        self.redis = redis.Redis.from_url(url)
        self.names = ["%s%s.%d" % (prefix, topic, p) for p in range(partitions)]

    def publish(self, messages: Sequence[Message]) -> Published:
        """XADD in one pipeline; each reply is that message's confirm.  An
        error reply is the message's: refused for good, unless it may pass
        (OOM, LOADING, ...).  Redis closes the connection on a request it
        cannot parse (a field longer than proto-max-bulk-len): then, if it
        answers a PING, the batch is published one message at a time to
        find the one it closes the connection on."""
        import redis
        pipe = self.redis.pipeline(transaction=False)
        for m in messages:
            pipe.xadd(self.names[m.partition], m.fields())
        try:
            replies = pipe.execute(raise_on_error=False)
        except redis.ConnectionError as e:
            self.redis.ping()       # down: a ConnectionError, the relay backs off
            log.warning("idem_pg.relay: Redis closed the connection during a batch of %d (%s);"
                        " publishing it one message at a time", len(messages), e)
            return self._one_by_one(messages)
        out = Published()
        for m, r in zip(messages, replies):
            if not isinstance(r, Exception):
                out.confirmed.append(m.message_id)
            elif not redis_transient(r):
                out.refused[m.message_id] = "Redis refused XADD: %s" % r
        return out

    def _one_by_one(self, messages: Sequence[Message]) -> Published:
        import redis
        out = Published()
        for m in messages:
            for attempt in (1, 2):
                try:
                    self.redis.xadd(self.names[m.partition], m.fields())
                    out.confirmed.append(m.message_id)
                except redis.ResponseError as e:
                    if not redis_transient(e):
                        out.refused[m.message_id] = "Redis refused XADD: %s" % e
                except redis.ConnectionError as e:
                    self.redis.ping()       # the broker is up: it was this message
                    if attempt == 1:
                        continue            # once more, on a new connection
                    out.refused[m.message_id] = ("Redis closed the connection on this message's XADD twice"
                                                 " (a field longer than its proto-max-bulk-len?): %s" % e)
                break
        return out

    def trim(self) -> int:
        """Trim each stream to what some consumer group has not yet
        acknowledged: below the oldest entry pending in any group, or the
        last one a group without pending entries was given (XTRIM MINID).
        A stream without a group is left whole (its consumers have not
        started yet); a group created later starts at what is left."""
        import redis
        trimmed = 0
        for name in self.names:
            try:
                groups = self.redis.xinfo_groups(name)
            except redis.ResponseError:
                continue                    # no such stream yet
            floor = None
            for g in groups:
                # the oldest entry still pending in the group (none any more
                # if it was acknowledged since XINFO), else its last-delivered
                low = self.redis.xpending(name, g["name"]).get("min") if g["pending"] else None
                if low is None:
                    low = g["last-delivered-id"]
                low = low.decode() if isinstance(low, bytes) else str(low)
                if floor is None or _stream_id(low) < _stream_id(floor):
                    floor = low
            if floor is not None and _stream_id(floor) > (0, 0):
                # exact (not ~): what is acknowledged goes, not only whole macro nodes
                trimmed += self.redis.xtrim(name, minid=floor, approximate=False)
        return trimmed

    def close(self) -> None:
        self.redis.close()


def _stream_id(value: str) -> Tuple[int, int]:
    """A stream entry id as a comparable pair; (0, 0) for one not understood (nothing is trimmed)."""
    ms, _, seq = value.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


class RabbitMQ:
    """RabbitMQ: one durable single-active-consumer queue per partition,
    persistent messages, mandatory routing, publisher confirms.  A batch is
    published at once and its confirms awaited together (the broker confirms
    a persistent message once it is on disk).

    RabbitMQ answers a message it refuses (larger than its max_message_size)
    by closing the whole channel with 406 PRECONDITION_FAILED: the batch is
    then published again one message at a time, each on a new channel, to
    find the one refused (nacked as permanent); the others are confirmed."""

    def __init__(self, url: str, topic: str, partitions: int, prefix: str = "", timeout: float = 30.0):
        import pika
        self.pika, self.timeout = pika, timeout
        self.names = ["%s%s.%d" % (prefix, topic, p) for p in range(partitions)]
        self.channel: Any = None
        self.declared = 0
        self.closed: Optional[str] = None
        self.channel_closed: Optional[Tuple[int, str]] = None
        self.next_tag = 0
        self.pending: Dict[int, int] = {}       # delivery tag -> message id
        self.acked: List[int] = []
        self.returned: set = set()              # message ids the broker could not route
        self.connection = pika.SelectConnection(
            pika.URLParameters(url), on_open_callback=self._opened,
            on_open_error_callback=lambda c, e: self._lost(str(e)),
            on_close_callback=lambda c, e: self._lost(str(e)))
        self._wait(lambda: self.declared == len(self.names), "declaring the queues")

    def _lost(self, why: str) -> None:
        self.closed = why or "closed"

    def _opened(self, connection: Any) -> None:
        self._open_channel()

    def _open_channel(self) -> None:
        self.channel, self.channel_closed, self.declared = None, None, 0
        self.next_tag, self.pending = 0, {}
        self.connection.channel(on_open_callback=self._channel)

    def _channel(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._channel_lost)
        channel.confirm_delivery(self._confirmed)
        channel.add_on_return_callback(self._returned)
        for name in self.names:
            channel.queue_declare(name, durable=True, arguments={"x-single-active-consumer": True},
                                  callback=self._declared)

    def _channel_lost(self, _channel: Any, reason: Any) -> None:
        self.channel_closed = (getattr(reason, "reply_code", 0), getattr(reason, "reply_text", str(reason)))

    def _declared(self, _frame: Any) -> None:
        self.declared += 1

    def _confirmed(self, frame: Any) -> None:
        method = frame.method
        acked = isinstance(method, self.pika.spec.Basic.Ack)
        tags = [t for t in self.pending if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        for t in tags:
            message_id = self.pending.pop(t, None)
            if message_id is not None and acked:
                self.acked.append(message_id)

    def _returned(self, _channel: Any, _method: Any, props: Any, _body: bytes) -> None:
        self.returned.add(int(props.message_id))

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        """Run the connection's loop until done() (or the connection is lost, or the timeout)."""
        loop = self.connection.ioloop
        deadline = time.monotonic() + self.timeout

        def check() -> None:
            if done() or self.closed is not None or time.monotonic() > deadline:
                loop.stop()
            else:
                loop.call_later(0.001, check)
        loop.call_later(0, check)
        loop.start()
        if self.closed is not None:
            raise ConnectionError("RabbitMQ: %s (%s)" % (self.closed, what))
        if not done():
            raise ConnectionError("RabbitMQ: no answer in %.0f s (%s)" % (self.timeout, what))

    def _send(self, messages: Sequence[Message]) -> List[int]:
        """Publish and await the confirms (or the channel's end); the ids confirmed and routed."""
        self.acked, self.returned = [], set()
        for m in messages:
            fields = m.fields()
            props = self.pika.BasicProperties(delivery_mode=2, message_id=fields["id"],
                                              content_type="application/json",
                                              headers={k: v for k, v in fields.items() if k != "payload"})
            self.next_tag += 1
            self.pending[self.next_tag] = m.message_id
            self.channel.basic_publish("", self.names[m.partition], m.payload.encode("utf-8"), props,
                                       mandatory=True)
        self._wait(lambda: not self.pending or self.channel_closed is not None, "awaiting the confirms")
        # a message routed nowhere is confirmed too: not acknowledged, it is published again
        return [i for i in self.acked if i not in self.returned]

    def _refused(self) -> bool:
        """The channel was closed by a 406 (a message refused); any other close: a ConnectionError."""
        if self.channel_closed is None:
            return False
        code, text = self.channel_closed
        if code != 406:
            raise ConnectionError("RabbitMQ closed the channel: %s %s" % (code, text))
        return True

    def _reopen(self) -> None:
        self._open_channel()
        self._wait(lambda: self.declared == len(self.names), "opening a channel")

    def publish(self, messages: Sequence[Message]) -> Published:
        out = Published(self._send(messages))
        if not self._refused():
            return out
        log.warning("idem_pg.relay: RabbitMQ refused a message of a batch of %d (%s %s);"
                    " publishing it one message at a time", len(messages), *self.channel_closed)
        for m in messages:
            if m.message_id in out.confirmed:
                continue
            self._reopen()
            out.confirmed.extend(self._send([m]))
            if self._refused():
                out.refused[m.message_id] = "RabbitMQ refused the message: %s %s" % self.channel_closed
        if self.channel_closed is not None:
            self._reopen()
        return out

    def close(self) -> None:
        try:
            if self.closed is None:
                self.connection.close()
                self._wait(lambda: False, "closing")
        except Exception:       # a broker gone: nothing to close
            pass


def declare_rabbit_queue(channel: Any, name: str) -> None:
    """A partition's queue: durable, single active consumer (per-key order)."""
    channel.queue_declare(name, durable=True, arguments={"x-single-active-consumer": True})


def broker_of(url: str, topic: str, partitions: int, prefix: str = "") -> Any:
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStreams(url, topic, partitions, prefix)
    if url.startswith(("amqp://", "amqps://")):
        return RabbitMQ(url, topic, partitions, prefix)
    if url.startswith("kafka://"):
        from .kafka import KafkaBroker
        return KafkaBroker(url, topic, partitions, prefix)
    raise ValueError("broker URL must start with redis://, amqp:// or kafka://, not %r" % url)


class Relay:
    """One relay of one topic; ``run()`` until ``stop()`` (or a signal)."""

    def __init__(self, dsn: str, topic: str, broker: str, partitions: int = 8, batch: int = 100,
                 lease: float = 30.0, poll: float = 1.0, prefix: str = "", trim_interval: float = 10.0,
                 progress_interval: float = 60.0, backoff_max: float = 30.0):
        if partitions < 1:
            raise ValueError("partitions must be at least 1")
        self.dsn, self.topic, self.broker_url = dsn, topic, broker
        self.partitions, self.batch, self.lease, self.poll, self.prefix = partitions, batch, lease, poll, prefix
        self.trim_interval, self.progress_interval = trim_interval, progress_interval
        self.stopping = False
        self.published = 0
        # the progress since the last INFO line: fetched, confirmed, the longest wait (commit -> publish)
        self._window = {"fetched": 0, "confirmed": 0, "trimmed": 0, "wait": 0.0}
        self._next_progress = time.monotonic() + progress_interval
        self._next_trim = time.monotonic() + trim_interval
        self._health: Optional[bool] = None     # may the role read idem_health()?
        self.failures = 0                       # broker failures in a row (the back-off)
        # the test hook IDEM_PG_RELAY_PAUSE_BEFORE_ACK: the confirmed batch to stop at (0: none)
        self._pause_at = int(os.environ.get("IDEM_PG_RELAY_PAUSE_BEFORE_ACK") or 0)
        self._confirmed_batches = 0
        self.backoff_max = backoff_max

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def _fetch(self, conn: Any) -> List[Message]:
        rows = conn.execute(with_schema(conn, _FETCH), (self.topic, self.batch, self.lease), prepare=False).fetchall()
        if rows:
            self._window["fetched"] += len(rows)
            self._window["wait"] = max(self._window["wait"], max(r[5] for r in rows))
        return [Message(r[0], r[1], r[2], r[3], r[4], partition_of(r[1], r[0], self.partitions))
                for r in rows]

    def _backlog(self, conn: Any) -> str:
        """The outbox's backlog, from idem_health() where the relay's role
        may read it (a monitor's grant); else a word saying why not."""
        if self._health is False:
            return "backlog unknown (grant the relay's role idem_grant(role, 'monitor') to see it)"
        try:
            row = conn.execute(with_schema(conn, _HEALTH), prepare=False).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            self._health = False
            return self._backlog(conn)
        self._health = True
        return "backlog %d unacknowledged messages (all topics), the oldest %.1f s old" % (row[0], row[1] or 0.0)

    def housekeeping(self, broker: Any, conn: Any = None) -> None:
        """Now and then: trim what the consumers acknowledged (Redis), and
        log the progress at INFO (published, confirmed, the longest wait)."""
        now = time.monotonic()
        if hasattr(broker, "trim") and self.trim_interval > 0 and now >= self._next_trim:
            self._next_trim = now + self.trim_interval
            try:
                self._window["trimmed"] += broker.trim()
            except Exception as e:  # noqa: BLE001 - a trim that fails is retried next time, never the relay's end
                log.warning("idem_pg.relay: trimming the streams failed: %s: %s", type(e).__name__, e)
        if now >= self._next_progress:
            w = self._window
            log.info("idem_pg.relay: topic %s: in the last %.0f s %d messages fetched, %d confirmed by the broker"
                     " (%d in all), %d acknowledged stream entries trimmed; the longest wait from commit to"
                     " publish %.1f s; %s", self.topic, self.progress_interval + (now - self._next_progress),
                     w["fetched"], w["confirmed"], self.published, w["trimmed"], w["wait"],
                     self._backlog(conn) if conn is not None else "")
            self._window = {"fetched": 0, "confirmed": 0, "trimmed": 0, "wait": 0.0}
            self._next_progress = now + self.progress_interval

    def run_once(self, conn: Any, broker: Any) -> int:
        """One batch: fetch, publish, acknowledge what was confirmed, nack as
        permanent what the broker refused for good; how many were confirmed.
        What it did not take for a reason that may pass is left to its lease
        (never nacked: a broker down must not dead-letter healthy messages),
        and the relay backs off."""
        messages = self._fetch(conn)
        if not messages:
            return 0
        out = broker.publish(messages)
        self._confirmed_batches += bool(out.confirmed)
        if out.confirmed and self._confirmed_batches == self._pause_at:
            log.warning("idem_pg.relay: IDEM_PG_RELAY_PAUSE_BEFORE_ACK: %d messages confirmed by the broker,"
                        " paused before the outbox's ack", len(out.confirmed))
            while True:
                time.sleep(3600)
        if out.confirmed:
            conn.execute(with_schema(conn, _ACK), (out.confirmed,), prepare=False)
        for message_id, reason in out.refused.items():
            log.warning("idem_pg.relay: topic %s: message %d refused for good, nacked as permanent"
                        " (a dead letter; docs/dead-letters.md): %s", self.topic, message_id, reason)
            conn.execute(with_schema(conn, _NACK), ([message_id], reason), prepare=False)
        left = len(messages) - len(out.confirmed) - len(out.refused)
        if left:
            log.warning("idem_pg.relay: %d of %d messages not taken by the broker; their leases will lapse",
                        left, len(messages))
            self.back_off()
        else:
            self.failures = 0
        self.published += len(out.confirmed)
        self._window["confirmed"] += len(out.confirmed)
        return len(out.confirmed)

    def back_off(self) -> None:
        """Sleep before trying again: 0.5 s, doubling to backoff_max while failures last."""
        self.failures += 1
        time.sleep(min(self.backoff_max, 0.5 * 2 ** (self.failures - 1)))

    def run(self) -> None:
        listen = psycopg.connect(self.dsn, autocommit=True)
        work = psycopg.connect(self.dsn, autocommit=True)
        listen.execute("LISTEN idem_outbox")
        broker = broker_of(self.broker_url, self.topic, self.partitions, self.prefix)
        try:
            while not self.stopping:
                self.housekeeping(broker, work)
                if self.run_once(work, broker):
                    continue        # more may be waiting
                # nothing now: sleep until a commit notifies, or the poll interval
                if select.select([listen.fileno()], [], [], self.poll)[0]:
                    listen.execute("SELECT 1")      # reads the notifications that came
        finally:
            broker.close()
            work.close()
            listen.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m idem_pg.relay",
                                description="Relay idem's outbox of one topic to a broker, with publisher confirms.")
    p.add_argument("--dsn", required=True, help="libpq connection string of the database (a session, not a pooler)")
    p.add_argument("--topic", required=True)
    p.add_argument("--broker", required=True,
                   help="redis://host:port/db, amqp://user:pass@host:port/vhost or kafka://host:port[?librdkafka settings]")
    p.add_argument("--partitions", type=int, default=8,
                   help="streams or queues per topic; a Kafka topic's partitions when the relay creates it (default 8)")
    p.add_argument("--prefix", default="", help="prefix of the stream or queue names")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--lease", type=float, default=30.0, help="seconds a fetched message is leased")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between polls without a notification")
    p.add_argument("--trim-interval", type=float, default=10.0,
                   help="seconds between trims of the Redis streams to what every consumer group acknowledged (0: never)")
    p.add_argument("--progress-interval", type=float, default=60.0, help="seconds between progress lines at INFO")
    p.add_argument("--backoff-max", type=float, default=30.0,
                   help="the longest pause after broker or database failures in a row (from 0.5 s, doubling)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # the broker library's own chatter (pika logs every connection step at INFO)
    logging.getLogger("pika").setLevel(logging.WARNING)
    logging.getLogger("redis").setLevel(logging.WARNING)
    relay = Relay(args.dsn, args.topic, args.broker, args.partitions, args.batch, args.lease, args.poll, args.prefix,
                  args.trim_interval, args.progress_interval, args.backoff_max)
    signal.signal(signal.SIGTERM, relay.stop)
    signal.signal(signal.SIGINT, relay.stop)
    while not relay.stopping:
        try:
            relay.run()
        except (psycopg.OperationalError, ConnectionError, OSError) as e:
            # the database or the broker went away: reconnect after a pause
            log.warning("idem_pg.relay: %s; reconnecting", e)
            relay.back_off()
        except Exception as e:      # the broker's own connection errors
            if type(e).__module__.split(".")[0] not in ("redis", "pika", "confluent_kafka", "cimpl"):
                raise
            log.warning("idem_pg.relay: broker: %s; reconnecting", e)
            relay.back_off()
    log.info("idem_pg.relay: stopped after publishing %d messages", relay.published)
    return 0


if __name__ == "__main__":
    sys.exit(main())
