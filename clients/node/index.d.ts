// Types of idem-pg (src/index.js). int8 values come back as strings, as pg returns them.
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}
export type Int8 = number | string | bigint;

export class IdemError extends Error {
  sqlstate: string;
  detail?: string;
  cause?: unknown;
}
export class KeyReused extends IdemError {}
export class InFlight extends IdemError {}
export class NoClaim extends IdemError {}
export class LeaseLost extends IdemError {}
export class UnfinishedClaim extends IdemError {}
export class NestedRun extends IdemError {}
export class KeyExpired extends IdemError {}
export class InvalidRequest extends IdemError {}
export class ReadOnly extends IdemError {}
export class NotAllowed extends IdemError {}
export class SerializationFailure extends IdemError {}
/** 42725, 42883, 3F000 (and a role without idem's grants, from the middleware): the server's setup. */
export class Misconfigured extends IdemError {}
export function translate(error: unknown): unknown;
/** After a 42501: may the session's role call what idem_grant(role, 'app') gives? */
export function appGrants(db: Queryable): Promise<{ granted: boolean; role: string }>;
/** Name idem's schema for every client instead of looking it up in pg_extension once per client or pool (null: look it up again). */
export function useSchema(name: string | null): void;

export class RawJson {
  constructor(text: string | Buffer);
  text: string;
}

export interface Scope {
  owner: Int8;
  operation: string;
  key: string;
  request: unknown;
  ttl?: number | null; // seconds
}
export interface Outcome {
  replayed: boolean;
  httpStatus: number | null;
  body: string | null; // the stored JSON text, byte for byte
  headers: Record<string, string> | null;
  resourceId: string | null;
  expiresAt: Date | null;
}
export interface FinishArgs {
  owner: Int8;
  operation: string;
  key: string;
  status: number;
  body?: unknown;
  resourceId?: Int8 | null;
  headers?: Record<string, string> | null;
}
export function begin(db: Queryable, scope: Scope): Promise<Outcome>;
export function finish(db: Queryable, args: FinishArgs): Promise<void>;
/** idem_finish_stored (idem 1.13): finish, returning the answer as stored (after redact), as a replay returns it. */
export function finishStored(db: Queryable, args: FinishArgs): Promise<Outcome>;
export function run(db: Queryable, scope: Scope & { handler: string }): Promise<Outcome>;
export interface Submission {
  replayed: boolean;
  status: string;
  httpStatus: number | null;
  body: string | null;
  headers: Record<string, string> | null;
  resourceId: string | null;
  taskId: string | null;
}
export function submit(db: Queryable, scope: Scope & { payload?: unknown }): Promise<Submission>;
export function consume(db: Queryable, args: { consumer: string; messageId: string; ttl?: number | null; owner?: number | bigint | null }): Promise<boolean>;
export function emit(db: Queryable, args: { topic: string; payload: unknown; key?: string | null;
  headers?: Record<string, string> | null }): Promise<string>;
export interface Claim {
  outcome: Outcome;
  finish(status: number, body?: unknown, options?: { resourceId?: Int8; headers?: Record<string, string> }): Promise<Outcome>;
}
export function claim(db: Queryable, scope: Scope, work: (claim: Claim) => Promise<unknown> | unknown): Promise<Outcome>;
export function retrySerializable<T>(transaction: () => Promise<T>,
  options?: { attempts?: number; baseDelayMs?: number; maxDelayMs?: number }): Promise<T>;

export class Task {
  taskId: string;
  owner: string;
  key: string;
  request: unknown;
  payload: unknown;
  attempt: number;
  token: string;
  leaseExpiresAt: Date;
  heartbeat(db: Queryable, extendSeconds?: number): Promise<Date>;
  complete(db: Queryable, status: number, body?: unknown, options?: { resourceId?: Int8; headers?: Record<string, string> }): Promise<void>;
  fail(db: Queryable, error: unknown, retryable?: boolean): Promise<'FAILED_RETRYABLE' | 'FAILED_FINAL'>;
}
export class TaskWorker {
  constructor(operation: string, worker: string, options?: { leaseSeconds?: number; bindSession?: boolean });
  lease(db: Queryable, batch?: number): Promise<Task[]>;
}

export { createIdempotency } from './http.js';
