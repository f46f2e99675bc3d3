// idem-pg/consumer: consumers of idem_pg.relay's messages through idem's inbox.
import type { Queryable } from './index.js';

export class Delivery {
  messageId: string;
  key: string | null;
  payload: unknown;
  headers: Record<string, string> | null;
  partition: number;
  redelivered: boolean;
  publishedMs: number | null;
}

export type Handler = (client: Queryable, message: Delivery) => Promise<void> | void;

export class RedisConsumer {
  constructor(options: {
    pg: Queryable; redis: unknown; topic: string; consumer: string; name: string;
    partitions?: number; prefix?: string; lease?: number; block?: number;
    ownerOf?: ((message: Delivery) => number | bigint | null) | null;
    /** Attempts before a failing message is a dead letter; null: the topic's max_deliveries. */
    maxAttempts?: number | null; retryBaseMs?: number; retryMaxMs?: number;
  });
  /** The stream this consumer's dead letters of partition p go to: <stream>:dead:<consumer>. */
  deadStream(p: number): string;
  stop(): void;
  run(handler: Handler): Promise<void>;
}

export class RabbitConsumer {
  constructor(options: {
    pg: Queryable; amqp: unknown; url: string; topic: string; consumer: string; name: string;
    partitions?: number; prefix?: string;
    ownerOf?: ((message: Delivery) => number | bigint | null) | null;
    /** Attempts before a failing message is a dead letter; null: the topic's max_deliveries. */
    maxAttempts?: number | null; retryBaseMs?: number; retryMaxMs?: number;
  });
  stop(): void;
  run(handler: Handler): Promise<void>;
}
