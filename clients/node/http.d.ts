// Types of idem-pg/http (src/http.js) and idem-pg/fast (src/fast.js).
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Queryable } from './index.js';

export interface IdemRequestContext {
  client: Queryable; // the claim's transaction: write the business rows here
  owner: number | string;
  operation: string;
  key: string;
  request: unknown; // what was fingerprinted
  params: Record<string, string>;
  resourceId: number | string | null; // set it: stored with the record
}
declare module 'node:http' {
  interface IncomingMessage {
    idem?: IdemRequestContext;
    body?: unknown;
  }
}
export interface Settings {
  pool: { connect(): Promise<Queryable & { release(): void }> };
  owner: (req: IncomingMessage) => number | string | null | undefined | Promise<number | string | null | undefined>;
  conflictStatus?: 409 | 422;
  maxBodyBytes?: number;
  ttlSeconds?: number | null;
  inFlightRetryAfter?: number;
  readOnlyRetryAfter?: number;
  replaySetCookie?: boolean;
  errorsUrl?: string;
  fast?: FastLayer | null;
  log?: (message: string) => void;
}
export interface RouteOptions {
  request?: string[] | ((body: unknown, params: Record<string, string>) => unknown);
  keyRequired?: boolean;
}
export function createIdempotency(settings: Settings): {
  settings: Required<Settings>;
  route(operation: string | ((req: IncomingMessage) => string | null | Promise<string | null>), options?: RouteOptions): (req: IncomingMessage, res: ServerResponse, next: () => unknown) => void;
  errorHandler(): (err: unknown, req: IncomingMessage, res: ServerResponse, next: (err?: unknown) => void) => void;
  handler(operation: string | ((req: IncomingMessage) => string | null | Promise<string | null>), options: RouteOptions,
    fn: (req: IncomingMessage, res: ServerResponse) => unknown): (req: IncomingMessage, res: ServerResponse) => Promise<void>;
  /** server.on('clientError', idem.clientError()): a request Node's parser refuses gets a 400 problem+json. */
  clientError(): (err: Error & { code?: string }, socket: import('node:net').Socket) => void;
};
export function parseKey(raw: string | string[] | undefined): string | null;
export class Problem extends Error {
  constructor(status: number, slug: string, detail: string, headers?: Record<string, string>);
  status: number;
  slug: string;
}
export class FastLayer {
  constructor(client: unknown, options?: { maxCacheSeconds?: number; markerMs?: number; timeoutMs?: number; prefix?: string });
}
