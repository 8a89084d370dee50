// make bench: pg_throttle's event queue side by side with what users run
// instead, from one Node process with node-postgres, against the cluster the
// libpq environment names (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE):
//
//   drain, 1 per claim    WORKERS workers claim one job, complete it, repeat
//   drain, 10 per claim   the same, ten jobs at a time
//   groups                JOBS jobs over GROUPS groups; a group's jobs never run on two
//                         workers at once (claim_group: all of a group's due jobs per
//                         claim; claim with a concurrency_key per group: one job per
//                         claim, as graphile-worker's job queues and pg-boss's groups)
//   enqueue               JOBS jobs from one connection, one call each and in batches
//
// Contenders: throttle.claim / claim_group / schedule called directly, and through the
// Worker of the pg-throttle client package (clients/node: WORKERS workers of concurrency 1,
// and one of concurrency WORKERS, which shares one session; each with its LISTEN session
// and heartbeat, as applications run it) (and claim with the
// last claim's complete in its transaction: one flush per job); the FOR UPDATE SKIP
// LOCKED recipe (transaction open while the job runs); the advisory-lock
// cursor recipe for groups (the same); graphile-worker (job queues for
// groups, its local queue for batches); pg-boss (batchSize, group +
// groupConcurrency 1). Every drain starts from a backlog of JOBS due jobs and
// ends when the last one is done; the table shows the median of ROUNDS
// rounds, in jobs per second.
//
//   node queues.mjs [JOBS=20000] [GROUPS=2000] [WORKERS=8] [ROUNDS=2]
//   BENCH_QUEUE_ONLY: a regular expression; only the workloads it matches run.
import { makeWorkerUtils, run as graphileRun, runMigrations } from "graphile-worker";
import { PgBoss } from "pg-boss";
import pgThrottle from "pg-throttle";
import { chunks, connect, connection, fmt, median, silent, url } from "./common.mjs";

const [JOBS, GROUPS, WORKERS, ROUNDS] = [20000, 2000, 8, 2].map((d, i) =>
  Number(process.argv[2 + i] ?? d),
);
const env = process.env;

const admin = await connect();
const q = (text, values) => admin.query(text, values);

// Runs `worker(client)` on WORKERS connections until each returns; seconds.
async function onWorkers(worker) {
  const clients = await Promise.all(Array.from({ length: WORKERS }, connect));
  const started = performance.now();
  await Promise.all(clients.map((client, i) => worker(client, `w${i}`)));
  const seconds = (performance.now() - started) / 1000;
  await Promise.all(clients.map((client) => client.end()));
  return seconds;
}

// Resolves when `count()` reaches `target`, checked after each job.
function counter(target) {
  let done = 0;
  let resolve;
  const finished = new Promise((r) => (resolve = r));
  return {
    add(n) {
      done += n;
      if (done >= target) resolve();
    },
    finished,
  };
}

// ---- setup ---------------------------------------------------------------
await q(`
  DROP TABLE IF EXISTS nq_job, nq_event;
  CREATE TABLE nq_job (id bigserial PRIMARY KEY, payload jsonb NOT NULL DEFAULT '{}',
                       run_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz);
  CREATE INDEX nq_job_due ON nq_job (run_at, id) WHERE done_at IS NULL;
  CREATE TABLE nq_event (id bigserial PRIMARY KEY, group_key text NOT NULL,
                         run_at timestamptz NOT NULL DEFAULT now(), state text NOT NULL DEFAULT 'pending');
  CREATE INDEX nq_event_due ON nq_event (run_at) WHERE state = 'pending';
  CREATE INDEX nq_event_group ON nq_event (group_key) WHERE state = 'pending';
  CREATE OR REPLACE FUNCTION nq_claim_group() RETURNS SETOF bigint LANGUAGE plpgsql AS $$
  DECLARE
      candidate record;
  BEGIN
      FOR candidate IN SELECT group_key FROM nq_event WHERE state = 'pending' AND run_at <= now()
                       ORDER BY run_at LOOP
          IF pg_try_advisory_xact_lock(hashtext(candidate.group_key)) THEN
              RETURN QUERY SELECT id FROM nq_event
                           WHERE group_key = candidate.group_key AND state = 'pending' AND run_at <= now();
              RETURN;
          END IF;
      END LOOP;
  END
  $$;`);
await runMigrations({ connectionString: url, logger: silent });
const workerUtils = await makeWorkerUtils({ connectionString: url, logger: silent });
// pg-boss tuned for throughput: its queue statistics refresh every second, so
// that burstWhenReadyExceeds (fetch again at once while jobs are ready) works.
const boss = new PgBoss({
  ...connection,
  schema: "pgboss",
  schedule: false,
  monitorIntervalSeconds: 1,
  queueCacheIntervalSeconds: 1,
  superviseIntervalSeconds: 1,
});
boss.on("error", (e) => console.error("pg-boss:", e.message));
await boss.start();
for (const name of ["nq1", "nq10", "nqg"]) {
  await boss.createQueue(name).catch(() => {});
}

async function vacuum() {
  await q("VACUUM ANALYZE throttle.event");
  await q("VACUUM ANALYZE throttle.event_history");
  await q("VACUUM ANALYZE nq_job");
  await q("VACUUM ANALYZE nq_event");
}

// ---- fills: JOBS due jobs (groups: JOBS / GROUPS per group) ----------------
const group = (i) => `g${i % GROUPS}`;
const fill = {
  // grouped: a group_key per group; keyed: a concurrency_key per group instead.
  async throttle(queue, grouped, keyed = false) {
    await q("DELETE FROM throttle.event WHERE queue = $1", [queue]);
    await q("DELETE FROM throttle.event_history WHERE queue = $1", [queue]);
    await q(
      `SELECT count(throttle.schedule($1, 'e' || g, now() - interval '1 hour', '{}',
                                      group_key => CASE WHEN $3 THEN 'g' || (g % $4) END,
                                      concurrency_key => CASE WHEN $5 THEN 'g' || (g % $4) END))
       FROM generate_series(1, $2) AS g`,
      [queue, JOBS, grouped, GROUPS, keyed],
    );
  },
  async recipe() {
    await q("TRUNCATE nq_job");
    await q("INSERT INTO nq_job (run_at) SELECT now() - interval '1 hour' FROM generate_series(1, $1)", [JOBS]);
  },
  async groupRecipe() {
    await q("TRUNCATE nq_event");
    await q(
      `INSERT INTO nq_event (group_key, run_at)
       SELECT 'g' || (g % $2), now() - interval '1 hour' + g * interval '1 microsecond'
       FROM generate_series(1, $1) AS g`,
      [JOBS, GROUPS],
    );
  },
  async graphile(grouped) {
    await q("DELETE FROM graphile_worker._private_jobs");
    for (const [i, n] of chunks(JOBS, 1000).entries()) {
      await workerUtils.addJobs(
        Array.from({ length: n }, (_, k) => ({
          identifier: "nq",
          payload: {},
          ...(grouped ? { queueName: group(i * 1000 + k) } : {}),
        })),
      );
    }
  },
  async boss(queue, grouped) {
    await q("DELETE FROM pgboss.job WHERE name = $1", [queue]);
    for (const [i, n] of chunks(JOBS, 1000).entries()) {
      await boss.insert(
        queue,
        Array.from({ length: n }, (_, k) => (grouped ? { data: {}, group: { id: group(i * 1000 + k) } } : { data: {} })),
      );
    }
  },
};

// ---- drains: seconds until the backlog is done -----------------------------
const drain = {
  throttle: (queue, batch) =>
    onWorkers(async (c, name) => {
      for (;;) {
        const { rows } = await c.query("SELECT id, claim_token FROM throttle.claim($1, $2, '1 minute', $3)", [
          queue,
          name,
          batch,
        ]);
        if (rows.length === 0) return;
        await c.query("SELECT throttle.complete($1::bigint[], $2)", [rows.map((r) => r.id), rows[0].claim_token]);
      }
    }),
  // The end of the last claim and the next claim in one transaction: one
  // durable commit per job instead of two, to see what the flushes cost. No
  // transaction stays open while working.
  throttlePipelined: (queue, batch) =>
    onWorkers(async (c, name) => {
      let last = null;
      for (;;) {
        await c.query("BEGIN");
        if (last) await c.query("SELECT throttle.complete($1::bigint[], $2)", last);
        const { rows } = await c.query("SELECT id, claim_token FROM throttle.claim($1, $2, '1 minute', $3)", [
          queue,
          name,
          batch,
        ]);
        await c.query("COMMIT");
        if (rows.length === 0) return;
        last = [rows.map((r) => r.id), rows[0].claim_token];
      }
    }),
  throttleGroups: (queue) =>
    onWorkers(async (c, name) => {
      for (;;) {
        const { rows } = await c.query("SELECT id, claim_token FROM throttle.claim_group($1, $2, '1 minute')", [
          queue,
          name,
        ]);
        if (rows.length === 0) {
          const left = await c.query("SELECT 1 FROM throttle.event WHERE queue = $1 AND state IN ('pending', 'claimed') LIMIT 1", [queue]);
          if (left.rows.length === 0) return;
          continue;
        }
        await c.query("SELECT throttle.complete($1::bigint[], $2)", [rows.map((r) => r.id), rows[0].claim_token]);
      }
    }),
  // The client package's Worker: `count` workers of `concurrency` each, handlers that do
  // nothing; seconds until the last job's complete.
  client: async (queue, { count, concurrency, max = 1, groups = false }) => {
    const done = counter(JOBS);
    const workers = Array.from({ length: count }, (_, i) => {
      const w = new pgThrottle.Worker({
        queue, groups, concurrency, max: groups ? null : max, lease: 60, connection,
        workerName: `cw${i}`, batch: groups || max > 1, handler: async () => {},
      });
      w.on("completed", () => done.add(1));
      return w;
    });
    const started = performance.now();
    await Promise.all(workers.map((w) => w.start()));
    await done.finished;
    const seconds = (performance.now() - started) / 1000;
    await Promise.all(workers.map((w) => w.stop()));
    return seconds;
  },
  recipe: (batch) =>
    onWorkers(async (c) => {
      for (;;) {
        await c.query("BEGIN");
        const { rows } = await c.query(
          "SELECT id, payload FROM nq_job WHERE done_at IS NULL AND run_at <= now() ORDER BY run_at, id LIMIT $1 FOR UPDATE SKIP LOCKED",
          [batch],
        );
        if (rows.length === 0) {
          await c.query("COMMIT");
          return;
        }
        await c.query("UPDATE nq_job SET done_at = now() WHERE id = ANY ($1::bigint[])", [rows.map((r) => r.id)]);
        await c.query("COMMIT");
      }
    }),
  groupRecipe: () =>
    onWorkers(async (c) => {
      for (;;) {
        await c.query("BEGIN");
        const { rows } = await c.query("SELECT id FROM nq_claim_group() AS id");
        if (rows.length > 0) {
          await c.query("UPDATE nq_event SET state = 'done' WHERE id = ANY ($1::bigint[])", [rows.map((r) => r.id)]);
        }
        await c.query("COMMIT");
        if (rows.length === 0) {
          const left = await c.query("SELECT 1 FROM nq_event WHERE state = 'pending' LIMIT 1");
          if (left.rows.length === 0) return;
        }
      }
    }),
  async graphile(localQueue) {
    const jobs = counter(JOBS);
    const started = performance.now();
    const runner = await graphileRun({
      connectionString: url,
      concurrency: WORKERS,
      noHandleSignals: true,
      pollInterval: 1000,
      logger: silent,
      preset: localQueue ? { worker: { localQueue: { size: localQueue } } } : undefined,
      taskList: { nq: async () => jobs.add(1) },
    });
    await jobs.finished;
    const seconds = (performance.now() - started) / 1000;
    await runner.stop();
    return seconds;
  },
  async boss(queue, options) {
    const jobs = counter(JOBS);
    const started = performance.now();
    const id = await boss.work(
      queue,
      { localConcurrency: WORKERS, pollingIntervalSeconds: 0.5, burstWhenReadyExceeds: 1, ...options },
      async (batch) => jobs.add(batch.length),
    );
    await jobs.finished;
    const seconds = (performance.now() - started) / 1000;
    await boss.offWork(queue, { id, wait: true }).catch(() => boss.offWork(queue));
    return seconds;
  },
};

// ---- enqueue from one connection: seconds for JOBS jobs ---------------------
async function timed(fn) {
  const started = performance.now();
  await fn();
  return (performance.now() - started) / 1000;
}
const enqueue = {
  throttleOne: () =>
    timed(async () => {
      for (let i = 0; i < JOBS; i++) {
        await q("SELECT throttle.schedule('nq.enqueue', $1, now())", [`k${i}`]);
      }
    }),
  throttleBatch: () =>
    timed(async () => {
      for (const [i, n] of chunks(JOBS, 1000).entries()) {
        const keys = Array.from({ length: n }, (_, k) => `b${i * 1000 + k}`);
        await q("SELECT count(throttle.schedule('nq.enqueue', k, now())) FROM unnest($1::text[]) AS k", [keys]);
      }
    }),
  throttleMany: () =>
    timed(async () => {
      for (const [i, n] of chunks(JOBS, 1000).entries()) {
        const keys = Array.from({ length: n }, (_, k) => `m${i * 1000 + k}`);
        await q("SELECT cardinality(throttle.schedule_many('nq.enqueue', $1::text[], array_fill(now(), ARRAY[$2::int])))", [keys, n]);
      }
    }),
  insertOne: () =>
    timed(async () => {
      for (let i = 0; i < JOBS; i++) {
        await q("INSERT INTO nq_job (payload) VALUES ($1)", [{ k: i }]);
      }
    }),
  insertBatch: () =>
    timed(async () => {
      for (const n of chunks(JOBS, 1000)) {
        await q("INSERT INTO nq_job (payload) SELECT '{}' FROM generate_series(1, $1)", [n]);
      }
    }),
  graphileOne: () =>
    timed(async () => {
      for (let i = 0; i < JOBS; i++) {
        await workerUtils.addJob("nq", { k: i });
      }
    }),
  graphileBatch: () =>
    timed(async () => {
      for (const n of chunks(JOBS, 1000)) {
        await workerUtils.addJobs(Array.from({ length: n }, () => ({ identifier: "nq", payload: {} })));
      }
    }),
  bossOne: () =>
    timed(async () => {
      for (let i = 0; i < JOBS; i++) {
        await boss.send("nq1", { k: i });
      }
    }),
  bossBatch: () =>
    timed(async () => {
      for (const n of chunks(JOBS, 1000)) {
        await boss.insert("nq1", Array.from({ length: n }, () => ({ data: {} })));
      }
    }),
};
async function clearEnqueued() {
  await q("DELETE FROM throttle.event WHERE queue = 'nq.enqueue'");
  await q("DELETE FROM throttle.event_history WHERE queue = 'nq.enqueue'");
  await q("TRUNCATE nq_job");
  await q("DELETE FROM graphile_worker._private_jobs");
  await q("DELETE FROM pgboss.job WHERE name = 'nq1'");
  await vacuum();
}

// ---- the runs ---------------------------------------------------------------
const runs = [
  ["drain, 1 per claim", "throttle.claim + throttle.complete", () => fill.throttle("nq.one", false), () => drain.throttle("nq.one", 1)],
  ["drain, 1 per claim", `pg-throttle Worker (clients/node), ${WORKERS} workers`, () => fill.throttle("nq.one", false), () => drain.client("nq.one", { count: WORKERS, concurrency: 1 })],
  ["drain, 1 per claim", `pg-throttle Worker (clients/node), one of concurrency ${WORKERS}`, () => fill.throttle("nq.one", false), () => drain.client("nq.one", { count: 1, concurrency: WORKERS })],
  ["drain, 1 per claim", "throttle.complete of the last claim + throttle.claim, one transaction", () => fill.throttle("nq.one", false), () => drain.throttlePipelined("nq.one", 1)],
  ["drain, 1 per claim", "FOR UPDATE SKIP LOCKED recipe (transaction open while working)", fill.recipe, () => drain.recipe(1)],
  ["drain, 1 per claim", "graphile-worker 0.18", () => fill.graphile(false), () => drain.graphile(0)],
  ["drain, 1 per claim", "pg-boss 12", () => fill.boss("nq1", false), () => drain.boss("nq1", { batchSize: 1 })],
  ["drain, 10 per claim", "throttle.claim(max => 10) + throttle.complete", () => fill.throttle("nq.ten", false), () => drain.throttle("nq.ten", 10)],
  ["drain, 10 per claim", `pg-throttle Worker (clients/node), ${WORKERS} workers, max 10, batch`, () => fill.throttle("nq.ten", false), () => drain.client("nq.ten", { count: WORKERS, concurrency: 1, max: 10 })],
  ["drain, 10 per claim", "FOR UPDATE SKIP LOCKED recipe, LIMIT 10", fill.recipe, () => drain.recipe(10)],
  ["drain, 10 per claim", "graphile-worker 0.18, local queue of 10", () => fill.graphile(false), () => drain.graphile(10)],
  ["drain, 10 per claim", "pg-boss 12, batchSize 10", () => fill.boss("nq10", false), () => drain.boss("nq10", { batchSize: 10, burstWhenBatchFull: true })],
  ["groups, one worker per group", "throttle.claim_group + throttle.complete", () => fill.throttle("nq.groups", true), () => drain.throttleGroups("nq.groups")],
  ["groups, one worker per group", `pg-throttle Worker (clients/node), ${WORKERS} workers, claim_group, batch`, () => fill.throttle("nq.groups", true), () => drain.client("nq.groups", { count: WORKERS, concurrency: 1, groups: true })],
  ["groups, one worker per group", "throttle.claim + throttle.complete, a concurrency_key per group (max_claimed 1)", () => fill.throttle("nq.keyed", false, true), () => drain.throttle("nq.keyed", 1)],
  ["groups, one worker per group", "advisory-lock cursor recipe (transaction open while working)", fill.groupRecipe, drain.groupRecipe],
  ["groups, one worker per group", "graphile-worker 0.18, a job queue per group", () => fill.graphile(true), () => drain.graphile(0)],
  ["groups, one worker per group", "pg-boss 12, group + groupConcurrency 1", () => fill.boss("nqg", true), () => drain.boss("nqg", { batchSize: 1, groupConcurrency: 1 })],
  ["enqueue, one connection", "throttle.schedule, one call per job", clearEnqueued, enqueue.throttleOne],
  ["enqueue, one connection", "throttle.schedule over unnest, 1 000 per statement", clearEnqueued, enqueue.throttleBatch],
  ["enqueue, one connection", "throttle.schedule_many, 1 000 per call", clearEnqueued, enqueue.throttleMany],
  ["enqueue, one connection", "plain INSERT, one per job", clearEnqueued, enqueue.insertOne],
  ["enqueue, one connection", "plain INSERT, 1 000 rows per statement", clearEnqueued, enqueue.insertBatch],
  ["enqueue, one connection", "graphile-worker addJob", clearEnqueued, enqueue.graphileOne],
  ["enqueue, one connection", "graphile-worker addJobs, 1 000 per call", clearEnqueued, enqueue.graphileBatch],
  ["enqueue, one connection", "pg-boss send", clearEnqueued, enqueue.bossOne],
  ["enqueue, one connection", "pg-boss insert, 1 000 per call", clearEnqueued, enqueue.bossBatch],
];

const only = env.BENCH_QUEUE_ONLY ? new RegExp(env.BENCH_QUEUE_ONLY) : null;
const chosen = only ? runs.filter(([workload]) => only.test(workload)) : runs;
const rates = chosen.map(() => []);
for (let round = 1; round <= ROUNDS; round++) {
  for (const [i, [workload, contender, prepare, measure]] of chosen.entries()) {
    await prepare();
    await vacuum();
    const seconds = await measure();
    rates[i].push(JOBS / seconds);
    console.error(`round ${round}  ${workload} | ${contender}: ${(JOBS / seconds).toFixed(0)} jobs/s`);
  }
}
console.log(
  `\nNode ${process.version}, node-postgres; ${WORKERS} workers, ${JOBS} jobs` +
    ` (groups: ${GROUPS} groups of ${JOBS / GROUPS}); median of ${ROUNDS} rounds.\n`,
);
console.log("| workload | contender | jobs/s | rounds (min – max) |");
console.log("|---|---|---:|---:|");
for (const [i, [workload, contender]] of chosen.entries()) {
  const xs = rates[i];
  console.log(`| ${workload} | ${contender} | ${fmt(median(xs))} | ${fmt(Math.min(...xs))} – ${fmt(Math.max(...xs))} |`);
}
await boss.stop({ graceful: false, close: true }).catch(() => {});
await workerUtils.release();
await admin.end();
