"""Redrive a consumer's dead letters (docs/dead-letters.md): let the
consumer apply them again (``idem_inbox_redrive`` in PostgreSQL), then move
them from the broker's dead letters back to where they came from, in their
order.  With ``--discard`` they are given up for good instead: their keys
go on, and they leave the broker's dead letters.

    python3 -m idem_pg.redrive --dsn postgresql:///shop --broker redis://127.0.0.1:6379/0 \\
        --topic orders --consumer billing [--partitions 8] [--prefix P] [--discard] [--reason WHY] [MESSAGE_ID ...]

Redis: the streams ``<prefix><topic>.<p>:dead:<consumer>`` (what
``idem_pg.consumer`` writes) back to ``<prefix><topic>.<p>``.  RabbitMQ: the
queue ``--dead-queue`` (default ``<prefix><topic>.dead``, where the
dead-letter policy of docs/dead-letters.md routes them) back to the queue
each came from (its ``x-death`` header).  Kafka: the consumer's messages in
the topic ``<prefix><topic>.dead`` back to the topic each came from (its
``idem_source`` header), with their keys (so to the same partition); the
consumer group ``idem-redrive.<consumer>`` remembers what was moved.  Every
consumer group of a Redis stream or a Kafka topic sees the moved entries
again; their inboxes drop what they applied.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional, Sequence

import psycopg

from .core import with_schema

_REDRIVE = ("SELECT @idem@.idem_inbox_redrive(%s::pg_catalog.text, %s::pg_catalog.text[],"
            " %s::pg_catalog.bool)")
# idem 1.16: with the reason, written to idem_operator_actions
_REDRIVE_REASON = ("SELECT @idem@.idem_inbox_redrive(%s::pg_catalog.text, %s::pg_catalog.text[],"
                   " %s::pg_catalog.bool, %s::pg_catalog.text)")
_EXTRA = ("idem_dead_reason", "idem_consumer", "idem_stream_entry")


def _chosen(message_id: Any, wanted: Optional[set]) -> bool:
    return wanted is None or str(message_id) in wanted


def redrive_redis(url: str, streams: Sequence[str], consumer: str, wanted: Optional[set], discard: bool,
                  record: Any) -> int:
    """Move (or drop) the chosen entries of each stream's dead stream; record(ids) first."""
    import redis
    r = redis.Redis.from_url(url, decode_responses=True)
    moved = 0
    try:
        for stream in streams:
            dead = "%s:dead:%s" % (stream, consumer)
            entries = [(i, f) for i, f in r.xrange(dead) if _chosen(f.get("id"), wanted)]
            if not entries:
                continue
            record([f.get("id") for _, f in entries])
            for entry_id, fields in entries:
                if not discard:
                    r.xadd(stream, {k: v for k, v in fields.items() if k not in _EXTRA})
                r.xdel(dead, entry_id)
                moved += 1
    finally:
        r.close()
    return moved


def redrive_rabbitmq(url: str, dead_queue: str, wanted: Optional[set], discard: bool, record: Any) -> int:
    """Move (or drop) the chosen messages of the dead-letter queue to the queue each came from."""
    import pika
    connection = pika.BlockingConnection(pika.URLParameters(url))
    moved = 0
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        taken: List[Any] = []
        while True:
            method, props, body = channel.basic_get(dead_queue, auto_ack=False)
            if method is None:
                break
            taken.append((method, props, body))
        chosen = [t for t in taken if _chosen(t[1].message_id, wanted)]
        if chosen:
            record([props.message_id for _, props, _ in chosen])
        for method, props, body in chosen:
            if not discard:
                deaths = (props.headers or {}).get("x-death") or []
                origin = deaths[0].get("queue") if deaths else None
                if not origin:
                    raise SystemExit("message %s has no x-death header: its queue is unknown" % props.message_id)
                if isinstance(origin, bytes):
                    origin = origin.decode()
                headers: Dict[str, Any] = {k: v for k, v in (props.headers or {}).items()
                                           if not k.startswith("x-")}
                channel.basic_publish("", origin, body, pika.BasicProperties(
                    delivery_mode=2, message_id=props.message_id, content_type=props.content_type,
                    headers=headers), mandatory=True)
            channel.basic_ack(method.delivery_tag)
            moved += 1
        moved_tags = {method.delivery_tag for method, _, _ in chosen}
        for method, _props, _body in taken:
            if method.delivery_tag not in moved_tags:
                channel.basic_nack(method.delivery_tag, requeue=True)
    finally:
        connection.close()
    return moved


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m idem_pg.redrive",
                                description="Redrive (or discard) a consumer's dead letters.")
    p.add_argument("--dsn", required=True)
    p.add_argument("--broker", required=True,
                   help="redis://host:port/db, amqp://user:pass@host:port/vhost or kafka://host:port")
    p.add_argument("--topic", required=True)
    p.add_argument("--consumer", required=True)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--prefix", default="")
    p.add_argument("--dead-queue", default=None, help="RabbitMQ: the dead-letter queue (default <prefix><topic>.dead)")
    p.add_argument("--discard", action="store_true", help="give them up for good: their keys go on")
    p.add_argument("--reason", default=None, help="why (idem 1.16: kept in idem_operator_actions)")
    p.add_argument("message_ids", nargs="*", help="only these (default: all of the consumer's)")
    args = p.parse_args(argv)
    wanted = set(args.message_ids) if args.message_ids else None

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        def record(ids: List[Any]) -> None:
            if args.reason is None:
                conn.execute(with_schema(conn, _REDRIVE),
                             (args.consumer, [str(i) for i in ids], args.discard), prepare=False)
            else:
                conn.execute(with_schema(conn, _REDRIVE_REASON),
                             (args.consumer, [str(i) for i in ids], args.discard, args.reason), prepare=False)

        if args.broker.startswith(("redis://", "rediss://", "unix://")):
            streams = ["%s%s.%d" % (args.prefix, args.topic, n) for n in range(args.partitions)]
            n = redrive_redis(args.broker, streams, args.consumer, wanted, args.discard, record)
        elif args.broker.startswith(("amqp://", "amqps://")):
            n = redrive_rabbitmq(args.broker, args.dead_queue or "%s%s.dead" % (args.prefix, args.topic),
                                 wanted, args.discard, record)
        elif args.broker.startswith("kafka://"):
            from .kafka import redrive
            n = redrive(args.broker, "%s%s.dead" % (args.prefix, args.topic), args.consumer, wanted, args.discard,
                        record)
        else:
            p.error("broker URL must start with redis://, amqp:// or kafka://")
    print("%s %d dead letters of %s" % ("discarded" if args.discard else "redrove", n, args.consumer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
