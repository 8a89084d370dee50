// Type declarations of pg-throttle, the Node.js client of the pg_throttle PostgreSQL extension.

import { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';

// pg's types are declared here rather than imported from 'pg': they live in @types/pg, which
// a consumer need not have (pg is this package's only dependency).

/** What node-postgres's query() resolves with, as far as this package reads it. */
export interface QueryResultLike {
  rows: any[];
  rowCount?: number | null;
}

/** Anything with node-postgres's query(): a pg Client or Pool. */
export interface Queryable {
  query(text: string, values?: any[]): Promise<QueryResultLike>;
}

/** node-postgres connection settings (pg's ClientConfig; the common ones). */
export interface ConnectionConfig {
  user?: string;
  database?: string;
  password?: string | (() => string | Promise<string>);
  port?: number;
  host?: string;
  connectionString?: string;
  keepAlive?: boolean;
  keepAliveInitialDelayMillis?: number;
  statement_timeout?: false | number;
  lock_timeout?: number;
  idle_in_transaction_session_timeout?: number;
  query_timeout?: number;
  connectionTimeoutMillis?: number;
  application_name?: string;
  options?: string;
  ssl?: boolean | object;
  types?: unknown;
  client_encoding?: string;
}

/** This client's version (the extension version it ships with). */
export const VERSION: string;
/** The pg_throttle extension versions this client supports. */
export const SUPPORTED: readonly string[];

/** The error of a missing or unsupported extension. */
export interface VersionError extends Error {
  code: 'PG_THROTTLE_VERSION';
  /** The installed version, or null when pg_throttle is not installed in the database. */
  found: string | null;
  supported: string[];
}

/** The installed version; rejects with a VersionError when missing or unsupported. */
export function checkVersion(db: Queryable): Promise<string>;
/** checkVersion once per Client or Pool (a failed check runs again on the next use). */
export function ensureVersion(db: Queryable): Promise<string>;

/** A claimed event: a row of throttle.event. Bigint columns are strings. */
export interface ClaimedEvent {
  id: string;
  queue: string;
  item_key: string;
  group_key: string | null;
  concurrency_key: string | null;
  payload: any;
  run_at: Date;
  state: string;
  attempts: number;
  max_attempts: number;
  priority: number;
  claim_token: string;
  claimed_by: string;
  claimed_at: Date;
  lease_until: Date;
  last_error: string | null;
  [column: string]: unknown;
}

/** What a handler gets besides its event(s). */
export interface HandlerContext {
  /** Aborts when the claim is lost, or stop({ abort: true }) (or a second signal) hands it back. */
  signal: AbortSignal;
  /** The claim's claim_token. */
  token: string;
  /** The same token: a fence token, greater than every one handed out before. */
  fence: string;
  queue: string;
  worker: string;
  /** All the events of the claim. */
  claim: ClaimedEvent[];
}

/** Thrown by a handler: fails the event; `retryIn` (seconds) overrides the worker's. */
export interface RetryableError extends Error {
  retryIn?: number | null;
}

export interface WorkerBaseOptions {
  /** The queue (also the LISTEN channel). */
  queue: string;
  /** claim_group instead of claim. Default false. */
  groups?: boolean;
  /** Claims worked on at once. Default 1. */
  concurrency?: number;
  /** Events per claim. Default 1 (claim); null: all the group's due events (claim_group). */
  max?: number | null;
  /** The claim's lease in seconds, extended every lease/3 while the handler runs. Default 30. */
  lease?: number;
  /** Seconds between polls (a NOTIFY wakes the worker sooner). Default 60. */
  pollSeconds?: number;
  /** Seconds before a failed event is retried; null (default): the queue's backoff. */
  retryIn?: number | null;
  /** claimed_by. Default `${hostname}-${pid}`. */
  workerName?: string;
  /** node-postgres connection settings (default: the libpq environment), or a connection string. */
  connection?: ConnectionConfig | string;
  /** SIGTERM/SIGINT: stop(); a second one: stop({ abort: true }); a third exits. Default false. */
  handleSignals?: boolean;
  applicationName?: string;
  /** Seconds a query of the worker's session may go unanswered before the worker asks the
   * server (through its listening session) what the session's backend does: still working (or
   * waiting on a lock), it waits on; idle, gone, or no answer to that probe within
   * queryTimeout/2, the connection is stalled and the worker stops (wait() rejects with code
   * PG_THROTTLE_STALLED). null or omitted: max(lease/3, 5). */
  queryTimeout?: number | null;
  /** Seconds stop({ abort: true }) waits for handlers after aborting them; then their events
   * are handed back and their outcome ignored. Default 1. */
  abortGrace?: number;
}

/** One event per handler call (the default); throw to fail it. */
export interface WorkerEventOptions extends WorkerBaseOptions {
  batch?: false;
  handler: (event: ClaimedEvent, ctx: HandlerContext) => unknown;
}

/** batch: the handler gets the claim's events as an array, completed or failed together. */
export interface WorkerBatchOptions extends WorkerBaseOptions {
  batch: true;
  handler: (events: ClaimedEvent[], ctx: HandlerContext) => unknown;
}

export type WorkerOptions = WorkerEventOptions | WorkerBatchOptions;

export class Worker extends EventEmitter {
  constructor(options: WorkerOptions);
  readonly queue: string;
  readonly workerName: string;
  readonly groups: boolean;
  readonly concurrency: number;
  readonly max: number | null;
  readonly lease: number;
  readonly pollSeconds: number;
  readonly retryIn: number | null;
  readonly batch: boolean;
  readonly queryTimeout: number;
  readonly abortGrace: number;
  /** Connects, checks the extension version, LISTENs; resolves once it runs. */
  start(): Promise<this>;
  /** Resolves when the worker stopped; rejects with the error that stopped it. */
  wait(): Promise<void>;
  /** Claims nothing more; finishes the held events, or with abort hands them back at once. */
  stop(options?: { abort?: boolean }): Promise<void>;

  on(event: 'log', listener: (message: string) => void): this;
  on(event: 'ready', listener: () => void): this;
  on(event: 'claimed', listener: (events: ClaimedEvent[]) => void): this;
  on(event: 'completed', listener: (event: ClaimedEvent) => void): this;
  on(event: 'failed', listener: (event: ClaimedEvent, error: unknown) => void): this;
  on(event: 'lost', listener: (info: { token: string; reason: string; ids: string[] }) => void): this;
  on(event: 'left', listener: (info: { token: string; ids: string[] }) => void): this;
  on(event: 'handedBack', listener: (info: { token: string; ids: string[]; count: number }) => void): this;
  on(event: 'stopping', listener: (info: { abort: boolean }) => void): this;
  on(event: 'stopped', listener: () => void): this;
  on(event: 'error', listener: (error: Error) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

/** A Date, or a timestamp string PostgreSQL reads; null or omitted: now. */
export type RunAt = Date | string | null;

export interface ScheduleOptions {
  runAt?: RunAt;
  payload?: unknown;
  groupKey?: string | null;
  concurrencyKey?: string | null;
  maxAttempts?: number;
  priority?: number;
  onDuplicate?: 'replace' | 'keep_earlier' | 'ignore';
}

export interface ScheduleItem {
  itemKey: string;
  runAt?: RunAt;
  payload?: unknown;
  groupKey?: string | null;
  concurrencyKey?: string | null;
}

/** throttle.schedule: the event's id. */
export function schedule(db: Queryable, queue: string, itemKey: string, options?: ScheduleOptions): Promise<string>;
/** throttle.schedule_many: the ids in the order of items. */
export function scheduleMany(db: Queryable, queue: string, items: ScheduleItem[],
  options?: Pick<ScheduleOptions, 'maxAttempts' | 'priority' | 'onDuplicate'>): Promise<string[]>;
/** throttle.cancel: true when a pending event was cancelled. */
export function cancel(db: Queryable, queue: string, itemKey: string): Promise<boolean>;
/** throttle.reschedule: true when the pending event was moved. */
export function reschedule(db: Queryable, queue: string, itemKey: string, runAt: RunAt): Promise<boolean>;

export interface LeaseContext {
  /** The lock's fence token (a bigint as a string). */
  fence: string;
  token: string;
  /** Aborts when a renewal fails, or none answered within the ttl: the lease may be someone else's. */
  signal: AbortSignal;
}

export interface LeaseOptions {
  /** Seconds to wait for the lock: 0 (default) tries once; null or Infinity: no limit. */
  wait?: number | null;
  /** The holder throttle.locks shows. */
  holder?: string | null;
}

/**
 * Runs fn under throttle.lock(name, ttl) and renews the lease every ttl/3 (seconds).
 * Rejects with code PG_THROTTLE_LOCK_BUSY when not had within `wait`, PG_THROTTLE_LEASE_LOST
 * when the lease was lost while fn ran.
 */
export function withLease<T>(db: Queryable, name: string, ttl: number,
  fn: (ctx: LeaseContext) => T | Promise<T>, options?: LeaseOptions): Promise<T>;

export interface TakeAnswer {
  allowed: boolean;
  remaining: number;
  /** Seconds until the same request would pass (0 when allowed). */
  retryAfter: number;
  /** Seconds until the bucket is full again. */
  resetAfter: number;
}

/** throttle.take: per in seconds; burst defaults to rate; cost 0 peeks. */
export function take(db: Queryable, key: string,
  shape: { rate: number; per: number; burst?: number | null; cost?: number }): Promise<TakeAnswer>;

export type Request = IncomingMessage & { rateLimit?: TakeAnswer };

export interface RateLimitOptions {
  rate: number;
  /** Seconds. */
  per: number;
  /** Default: rate. */
  burst?: number;
  /** An integer from 0 to burst, or a function of the request giving one. Default 1. */
  cost?: number | ((req: IncomingMessage) => number);
  /** The bucket's name for a request (a number: its decimal text), or null (400). Default: defaultKey. */
  key?: (req: IncomingMessage) => string | number | bigint | null | undefined;
  /** Refusals and database errors. Default: none. */
  log?: (message: string) => void;
}

/** Express-style middleware: 400, 429 or 503 answered, else next() with req.rateLimit set. */
export function rateLimit(db: Queryable, options: RateLimitOptions):
  (req: IncomingMessage, res: ServerResponse, next: (err?: unknown) => void) => Promise<void>;
/** A Node http handler that runs `handler` for the requests the limit lets pass. */
export function withRateLimit(db: Queryable, options: RateLimitOptions,
  handler: (req: Request, res: ServerResponse) => void): (req: IncomingMessage, res: ServerResponse) => void;
/** `api:key:<X-Api-Key>`, else `api:addr:<client address>`, else null. */
export function defaultKey(req: IncomingMessage): string | null;
