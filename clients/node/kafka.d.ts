// idem-pg/kafka: a consumer of idem_pg.relay's Kafka topic through idem's inbox (kafkajs).
import type { Queryable } from './index.js';
import type { Delivery, Handler } from './consumer.js';

export { Delivery, Handler };

/** The 32-bit murmur2 of Kafka's Java client (Utils.murmur2), signed. */
export function murmur2(data: Buffer | string): number;
/** The partition Kafka's Java client, the Python relay and kafkajs's default partitioner give a key. */
export function partitionFor(key: Buffer | string, partitions: number): number;

export class KafkaConsumer {
  constructor(options: {
    pg: Queryable;
    /** A kafkajs Kafka instance. */
    kafka: unknown;
    topic: string;
    /** idem's consumer name and the Kafka consumer group's id. */
    consumer: string;
    name: string;
    /** The topic's partitions when this consumer creates it (and its <topic>.dead). */
    partitions?: number;
    prefix?: string;
    ownerOf?: ((message: Delivery) => number | bigint | null) | null;
    /** Attempts before a failing message is a dead letter; null: the topic's max_deliveries. */
    maxAttempts?: number | null; retryBaseMs?: number; retryMaxMs?: number;
    /** Seconds (session.timeout.ms / 1000); default 6. */
    sessionTimeout?: number;
    /** Messages a partition may hold behind failed ones before it pauses; default 1000. */
    maxHeld?: number;
  });
  /** Dead letters written to <prefix><topic>.dead so far. */
  deadLettered: number;
  stop(): void;
  /** Consumes until stop(); then commits and leaves the group. */
  run(handler: Handler): Promise<void>;
}
