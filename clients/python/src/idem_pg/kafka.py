"""Apache Kafka for idem's outbox and inbox, with ``confluent-kafka``
(the ``kafka`` extra; docs/messaging.md, "Kafka").

    python3 -m idem_pg.relay --dsn postgresql:///shop --topic orders --broker kafka://127.0.0.1:9092

    KafkaConsumer(dsn, "orders", "kafka://127.0.0.1:9092", consumer="billing", name="billing-1").run(apply)

The relay (``KafkaBroker``) publishes to the Kafka topic ``<prefix><topic>``
with an idempotent producer (``enable.idempotence``, ``acks=all``), the
message's key as the Kafka key and the Java client's partitioner
(``murmur2_random``), so that every language's producer puts a key on the
same partition and the key's messages stay in order there.  A message is
acknowledged in the outbox only after its delivery report; one the broker
or the client refuses for good (too large, an invalid topic) is nacked as
permanent; any other error leaves it to its lease.

The consumer (``KafkaConsumer``) is a member of the consumer group named
by ``consumer``: each message's effect and ``idem_consume`` commit in one
transaction, and the partition's offset is committed only after it.  Kafka
has no per-message nack: a message that fails is set aside (its failure
counted in PostgreSQL by ``idem_consume_failed``) and tried again with
backoff while the partition goes on; the key's later messages wait behind
it, in order.  The committed offset stays at the oldest message not yet
finished, so a consumer that dies, or a rebalance, starts there again and
the inbox recognises what was applied.  Past the limit the message goes to
the dead topic ``<prefix><topic>.dead`` (the reason in its headers); of a
'block' topic its key's later messages follow it there, of a 'skip' topic
they are applied.  ``python3 -m idem_pg.redrive`` moves dead messages back.

A broker URL is ``kafka://host:port[,host:port...]``; its query string's
pairs are librdkafka settings (``kafka://h:9093?security.protocol=SSL``).
"""
from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qsl, urlsplit

from .consumer import Delivery, Handler, _Inbox
from .relay import Message, Published

log = logging.getLogger("idem_pg.kafka")


def murmur2(data: bytes) -> int:
    """The 32-bit murmur2 hash of Kafka's Java client (``Utils.murmur2``), signed."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: Any, partitions: int) -> int:
    """The partition Kafka's Java client (and ``murmur2_random``, and
    kafkajs's default partitioner) gives a key among ``partitions``."""
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8")
    return (murmur2(raw) & 0x7FFFFFFF) % partitions


def config_of(url: str) -> Dict[str, str]:
    """librdkafka's settings of a ``kafka://`` URL: the servers, then the query's pairs."""
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not parts.netloc:
        raise ValueError("a Kafka broker URL is kafka://host:port[,host:port...], not %r" % url)
    return dict({"bootstrap.servers": parts.netloc}, **dict(parse_qsl(parts.query)))


# errors that are the message's (or its topic's) for good: nacked as permanent
# (TOPIC_EXCEPTION is Kafka's InvalidTopicException)
_PERMANENT = ("_MSG_SIZE_TOO_LARGE", "MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD",
              "INVALID_MSG_SIZE", "TOPIC_EXCEPTION", "_INVALID_ARG")


def permanent(error: Any) -> bool:
    """Whether a KafkaError refuses the message for good (not a broker down,
    a timeout, a leader moving: those pass, and are never counted)."""
    return error.name() in _PERMANENT and not error.retriable()


def _refusal(error: Any) -> str:
    """The reason a message Kafka refused for good is nacked with."""
    return "Kafka refused the message: %s (%s)" % (error.name(), error.str())


def ensure_topic(conf: Dict[str, str], name: str, partitions: int, timeout: float = 30.0) -> Optional[int]:
    """The topic's partition count, creating it with ``partitions`` when it
    does not exist (the broker's replication factor); None for a name Kafka
    refuses (its messages are then refused for good)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(dict(conf))
    meta = admin.list_topics(timeout=timeout)
    if name in meta.topics and meta.topics[name].error is None:
        return len(meta.topics[name].partitions)
    try:
        admin.create_topics([NewTopic(name, partitions)], operation_timeout=timeout)[name].result(timeout)
    except KafkaException as e:
        code = e.args[0].code()
        if code == KafkaError.TOPIC_EXCEPTION:
            log.warning("idem_pg.kafka: Kafka refuses the topic name %r: %s", name, e.args[0].str())
            return None
        if code != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    return partitions


class KafkaBroker:
    """The relay's side: ``<prefix><topic>``, an idempotent producer,
    delivery reports as the confirms."""

    def __init__(self, url: str, topic: str, partitions: int, prefix: str = "",
                 settings: Optional[Dict[str, str]] = None, timeout: float = 30.0):
        from confluent_kafka import Producer
        self.topic, self.timeout = prefix + topic, timeout
        conf = dict(config_of(url), **(settings or {}))
        ensure_topic(conf, self.topic, partitions, timeout)
        self.producer = Producer(dict(conf, **{
            "enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random", "linger.ms": 5,
            "message.timeout.ms": int(timeout * 1000), "client.id": "idem_pg.relay"}))
        self.fatal: Optional[str] = None

    def publish(self, messages: Sequence[Message]) -> Published:
        """Produce the batch and await its delivery reports (or the timeout):
        confirmed, refused for good, or neither (left to their leases)."""
        from confluent_kafka import KafkaException
        out = Published()

        def report(err: Any, msg: Any, message_id: int) -> None:
            if err is None:
                out.confirmed.append(message_id)
            elif err.fatal():
                self.fatal = err.str()
            elif permanent(err):
                out.refused[message_id] = _refusal(err)
        for m in messages:
            fields = m.fields()
            headers = [(k, v.encode("utf-8")) for k, v in fields.items() if k not in ("payload", "key")]
            while True:
                try:
                    self.producer.produce(self.topic, value=m.payload.encode("utf-8"),
                                          key=None if m.key is None else m.key.encode("utf-8"), headers=headers,
                                          on_delivery=lambda err, msg, i=m.message_id: report(err, msg, i))
                    break
                except BufferError:             # the local queue is full: let it drain
                    self.producer.poll(0.1)
                except KafkaException as e:     # refused before sending (too large, an invalid topic)
                    if permanent(e.args[0]):
                        out.refused[m.message_id] = _refusal(e.args[0])
                    break
        self.producer.flush(self.timeout)
        if self.fatal is not None:
            raise ConnectionError("Kafka producer: %s" % self.fatal)
        return out

    def close(self) -> None:
        self.producer.flush(self.timeout)


class _Partition:
    """A partition assigned to this consumer: the offsets it holds unfinished,
    the keys waiting behind a message that failed."""

    def __init__(self) -> None:
        self.unfinished: set = set()
        self.next = -1                  # the offset after the last one read
        self.committed = -1
        self.held: Dict[Any, Deque[Any]] = {}
        self.waiting = 0                # messages in held
        self.paused = False

    def floor(self) -> int:
        """The offset to commit: the oldest unfinished, else the next to read."""
        return min(self.unfinished) if self.unfinished else self.next


class KafkaConsumer:
    """A member of the consumer group ``consumer`` on ``<prefix><topic>``
    (docs/messaging.md, "Kafka").  ``partitions`` is the topic's partition
    count when this consumer creates it; ``max_held`` caps the messages of
    a partition waiting behind failed ones (the partition pauses beyond)."""

    def __init__(self, dsn: str, topic: str, broker: str, consumer: str, name: str, partitions: int = 8,
                 prefix: str = "", owner_of: Any = None, max_attempts: Optional[int] = None,
                 retry_base_ms: float = 100.0, retry_max_ms: float = 30_000.0, session_timeout: float = 6.0,
                 max_held: int = 1000, settings: Optional[Dict[str, str]] = None):
        self.topic, self.dead_topic = prefix + topic, prefix + topic + ".dead"
        self.consumer, self.name, self.partitions, self.max_held = consumer, name, partitions, max_held
        self.conf = dict(config_of(broker), **(settings or {}))
        self.session_timeout = session_timeout
        self.inbox = _Inbox(dsn, consumer, topic, owner_of, max_attempts, retry_base_ms, retry_max_ms)
        self.parts: Dict[int, _Partition] = {}
        self.retries: List[Tuple[float, int, int, Any]] = []    # (due, sequence, partition, hold key)
        self._sequence = 0
        self.stopping = False
        self.kafka: Any = None
        self.producer: Any = None
        self.dead_lettered = 0

    def stop(self, *_: Any) -> None:
        self.stopping = True

    # -- the group ---------------------------------------------------------
    def _connect(self) -> None:
        from confluent_kafka import Consumer, Producer
        ensure_topic(self.conf, self.topic, self.partitions)
        ensure_topic(self.conf, self.dead_topic, self.partitions)
        self.kafka = Consumer(dict(self.conf, **{
            "group.id": self.consumer, "client.id": self.name, "enable.auto.commit": False,
            # the assignor every language has under this name (Java's RoundRobinAssignor, kafkajs through idem-pg/kafka)
            "partition.assignment.strategy": "roundrobin",
            "auto.offset.reset": "earliest", "session.timeout.ms": int(self.session_timeout * 1000),
            "heartbeat.interval.ms": int(self.session_timeout * 1000 / 3)}))
        self.producer = Producer(dict(self.conf, **{"enable.idempotence": True, "acks": "all",
                                                    "partitioner": "murmur2_random", "client.id": self.name}))
        self.kafka.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)

    def _assigned(self, _kafka: Any, partitions: List[Any]) -> None:
        for tp in partitions:
            self.parts[tp.partition] = _Partition()

    def _revoked(self, _kafka: Any, partitions: List[Any]) -> None:
        """Given up in a rebalance: its offset committed at its floor, its held messages forgotten
        (their next owner reads them again from that floor)."""
        self._commit([tp.partition for tp in partitions if tp.partition in self.parts])
        self._lost(_kafka, partitions)

    def _lost(self, _kafka: Any, partitions: List[Any]) -> None:
        for tp in partitions:
            self.parts.pop(tp.partition, None)

    def _commit(self, which: Optional[List[int]] = None) -> None:
        from confluent_kafka import KafkaException, TopicPartition
        offsets = []
        for p in (self.parts if which is None else which):
            part = self.parts[p]
            floor = part.floor()
            if floor > part.committed:
                offsets.append(TopicPartition(self.topic, p, floor))
                part.committed = floor
        if offsets:
            try:
                self.kafka.commit(offsets=offsets, asynchronous=False)
            except KafkaException as e:     # a rebalance under way: the next owner starts lower
                log.warning("idem_pg.kafka: %s: committing offsets: %s", self.name, e)

    # -- messages ------------------------------------------------------------
    def _fields(self, msg: Any) -> Dict[str, Any]:
        fields: Dict[str, Any] = {k: v for k, v in (msg.headers() or [])}
        fields["payload"] = msg.value()
        fields["key"] = msg.key()
        fields.setdefault("id", "kafka:%s:%d:%d" % (msg.topic(), msg.partition(), msg.offset()))
        return fields

    def _arrived(self, msg: Any, handler: Handler) -> None:
        part = self.parts.get(msg.partition())
        if part is None:
            return                      # revoked meanwhile: its next owner reads it
        part.unfinished.add(msg.offset())
        part.next = max(part.next, msg.offset() + 1)
        hold = msg.key() if msg.key() is not None else ("offset", msg.offset())
        if hold in part.held:
            part.held[hold].append(msg)         # behind its key's failed message, in order
            part.waiting += 1
            return
        part.held[hold] = deque([msg])
        part.waiting += 1
        self._drain(msg.partition(), hold, handler, False)

    def _drain(self, p: int, hold: Any, handler: Handler, again: bool) -> None:
        """The key's waiting messages in order, until one fails (set aside with its retry due)."""
        part = self.parts[p]
        queue = part.held[hold]
        while queue:
            msg = queue[0]
            outcome, why, delay = self.inbox.attempt(self._fields(msg), p, again, handler)
            if outcome == "retry":
                self._sequence += 1
                heapq.heappush(self.retries, (time.monotonic() + delay, self._sequence, p, hold))
                return
            if outcome in ("dead", "set_aside"):
                self._dead_letter(msg, why)
            queue.popleft()
            part.waiting -= 1
            part.unfinished.discard(msg.offset())
            again = False
        del part.held[hold]

    def _dead_letter(self, msg: Any, why: str) -> None:
        """To ``<topic>.dead``: the message as it came, the reason and its origin in headers; awaited."""
        failed: List[Any] = []
        headers = list(msg.headers() or []) + [
            ("idem_dead_reason", why.encode("utf-8")), ("idem_consumer", self.consumer.encode("utf-8")),
            ("idem_source", ("%s:%d:%d" % (msg.topic(), msg.partition(), msg.offset())).encode("utf-8"))]
        self.producer.produce(self.dead_topic, value=msg.value(), key=msg.key(), headers=headers,
                              on_delivery=lambda err, _m: failed.append(err) if err else None)
        if self.producer.flush(30.0) or failed:
            raise ConnectionError("Kafka: the dead letter to %s was not delivered: %s" % (self.dead_topic, failed))
        self.dead_lettered += 1

    def _retry_due(self, handler: Handler) -> None:
        now = time.monotonic()
        while self.retries and self.retries[0][0] <= now:
            _, _, p, hold = heapq.heappop(self.retries)
            part = self.parts.get(p)
            if part is not None and hold in part.held:      # else revoked since
                self._drain(p, hold, handler, True)

    def _flow(self) -> None:
        """Pause a partition whose waiting messages pass max_held; resume it below half."""
        from confluent_kafka import TopicPartition
        for p, part in self.parts.items():
            if not part.paused and part.waiting > self.max_held:
                self.kafka.pause([TopicPartition(self.topic, p)])
                part.paused = True
            elif part.paused and part.waiting <= self.max_held // 2:
                self.kafka.resume([TopicPartition(self.topic, p)])
                part.paused = False

    def run_once(self, handler: Handler) -> int:
        wait = 0.2
        if self.retries:
            wait = max(0.0, min(wait, self.retries[0][0] - time.monotonic()))
        messages = self.kafka.consume(num_messages=100, timeout=wait)
        n = 0
        for msg in messages:
            if msg.error() is not None:
                if msg.error().fatal():
                    raise ConnectionError("Kafka consumer: %s" % msg.error().str())
                log.warning("idem_pg.kafka: %s: %s", self.name, msg.error().str())
                continue
            self._arrived(msg, handler)
            n += 1
        self._retry_due(handler)
        self._commit()
        self._flow()
        return n

    def run(self, handler: Handler) -> None:
        """Consume until ``stop()``; then commit and leave the group."""
        import psycopg
        while not self.stopping:
            try:
                if self.kafka is None:
                    self._connect()
                self.run_once(handler)
            except (psycopg.OperationalError, ConnectionError) as e:
                log.warning("idem_pg.kafka: %s: %s; starting again from the committed offsets", self.name, e)
                self._close()
                time.sleep(0.5)
        self._close()

    def _close(self) -> None:
        if self.kafka is not None:
            try:
                self._commit()
                self.kafka.close()          # leaves the group: its partitions move at once
            except Exception as e:          # noqa: BLE001 - a broker gone: the session lapses instead
                log.warning("idem_pg.kafka: %s: leaving the group: %s", self.name, e)
        if self.producer is not None:
            self.producer.flush(5.0)
        self.kafka, self.producer, self.parts, self.retries = None, None, {}, []
        self.inbox.close()


_DEAD_HEADERS = ("idem_dead_reason", "idem_consumer", "idem_source")


def redrive(url: str, dead_topic: str, consumer: str, wanted: Optional[set], discard: bool, record: Any,
            timeout: float = 30.0) -> int:
    """Move (or drop) the chosen dead letters of ``consumer`` in ``dead_topic``
    back to the topic each came from, in order; record(ids) first.  What was
    read is passed by the offsets of the consumer group
    ``idem-redrive.<consumer>`` on the dead topic; this consumer's dead
    letters that were not chosen are appended to the dead topic again, in
    their order, so that a later redrive finds them."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
    conf = config_of(url)
    reader = Consumer(dict(conf, **{"group.id": "idem-redrive." + consumer, "enable.auto.commit": False,
                                    "auto.offset.reset": "earliest", "enable.partition.eof": True}))
    producer = Producer(dict(conf, **{"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}))
    try:
        meta = reader.list_topics(dead_topic, timeout=timeout).topics.get(dead_topic)
        if meta is None or meta.error is not None:
            return 0
        tps = [TopicPartition(dead_topic, p) for p in meta.partitions]
        starts = reader.committed(tps, timeout=timeout)
        highs = {tp.partition: reader.get_watermark_offsets(tp, timeout=timeout)[1] for tp in tps}
        todo = {tp.partition for tp in starts if (tp.offset if tp.offset >= 0 else 0) < highs[tp.partition]}
        reader.assign([TopicPartition(dead_topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                       for tp in starts])
        taken: List[Any] = []
        while todo:
            msg = reader.poll(timeout)
            if msg is None:
                raise ConnectionError("Kafka: no answer reading %s in %.0f s" % (dead_topic, timeout))
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                todo.discard(msg.partition())
                continue
            taken.append(msg)
            if msg.offset() + 1 >= highs[msg.partition()]:
                todo.discard(msg.partition())
        mine = [(m, dict(m.headers() or [])) for m in taken]
        mine = [(m, h) for m, h in mine if h.get("idem_consumer", b"").decode("utf-8", "replace") == consumer]
        chosen = [(m, h) for m, h in mine if wanted is None or h.get("id", b"").decode("utf-8", "replace") in wanted]
        if chosen:
            record([h.get("id", b"").decode("utf-8", "replace") for _, h in chosen])
        failed: List[Any] = []
        moved = {id(m) for m, _ in chosen}

        def delivered(err: Any, _m: Any) -> None:
            if err:
                failed.append(err)
        for m, h in mine:
            if id(m) not in moved:      # not chosen: to the dead topic's end, for a later redrive
                producer.produce(dead_topic, value=m.value(), key=m.key(), headers=m.headers(), on_delivery=delivered)
            elif not discard:
                source = h.get("idem_source", b"").decode("utf-8", "replace").rsplit(":", 2)[0]
                producer.produce(source, value=m.value(), key=m.key(),
                                 headers=[(k, v) for k, v in (m.headers() or []) if k not in _DEAD_HEADERS],
                                 on_delivery=delivered)
        if producer.flush(timeout) or failed:
            raise ConnectionError("Kafka: the redriven messages were not all delivered: %s" % failed)
        ends: Dict[int, int] = {}
        for m in taken:
            ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
        if ends:
            reader.commit(offsets=[TopicPartition(dead_topic, p, o) for p, o in ends.items()], asynchronous=False)
        return len(chosen)
    finally:
        reader.close()


__all__: List[str] = ["Delivery", "KafkaBroker", "KafkaConsumer", "config_of", "murmur2", "partition_for", "redrive"]
