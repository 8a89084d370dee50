// Compiled (not run) by `npm run typecheck`: the declarations fit their uses.
import http from 'node:http';
import { Pool, Client, ClientConfig } from 'pg';
import { Worker, schedule, scheduleMany, cancel, reschedule, withLease, rateLimit, withRateLimit,
         take, checkVersion, SUPPORTED, VersionError } from '..';

async function main(): Promise<void> {
  const pool = new Pool();
  const v: string = await checkVersion(pool);
  const s: readonly string[] = SUPPORTED;
  const id: string = await schedule(pool, 'mail', 'k', { runAt: new Date(), payload: { a: 1 }, onDuplicate: 'ignore' });
  const ids: string[] = await scheduleMany(pool, 'mail', [{ itemKey: 'a' }, { itemKey: 'b', groupKey: 'g' }], { priority: 1 });
  const ok: boolean = (await cancel(pool, 'mail', 'a')) && (await reschedule(pool, 'mail', 'b', null));
  const w = new Worker({
    queue: 'mail', concurrency: 2, lease: 30, pollSeconds: 5, retryIn: 10, handleSignals: true,
    handler: async (event, { signal, fence }) => { signal.throwIfAborted(); console.log(event.id, fence); },
  });
  const b = new Worker({ queue: 'q', batch: true, handler: (events, { token }) => events.length + token.length });
  const cfg: ClientConfig = { host: '/tmp', keepAlive: true };   // pg's own config type fits
  const c = new Worker({ queue: 'q', connection: cfg, queryTimeout: 5, abortGrace: 0.5, handler: async () => {} });
  const d = new Worker({ queue: 'q', queryTimeout: null, handler: async () => {} });   // the default
  void c;
  void d;
  const n2: string = await withLease(new Client(), 'l', 5, async ({ fence }) => fence);
  void n2;
  void b;
  w.on('lost', ({ token, reason }) => console.log(token, reason));
  await w.start();
  await w.stop({ abort: true });
  const n: number = await withLease(pool, 'nightly', 60, async ({ fence, signal }) => (signal.aborted ? 0 : fence.length),
                                    { wait: 5 });
  const t = await take(pool, 'k', { rate: 1, per: 1 });
  const r: number = t.retryAfter;
  http.createServer(withRateLimit(pool, { rate: 10, per: 1, burst: 20 }, (req, res) => { res.end(String(req.rateLimit?.remaining)); }));
  const mw = rateLimit(pool, { rate: 1, per: 1, key: (req) => req.headers['x-user'] as string ?? null });
  try { await checkVersion(pool); } catch (e) { const err = e as VersionError; console.log(err.found, v, s, id, ids, ok, n, r, mw); }
}
void main;
