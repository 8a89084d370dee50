// make bench-real (and make bench): queues as they really run, from one Node
// process with node-postgres, against the cluster the libpq environment names.
//
// Each contender starts from a backlog of JOBS due jobs and LONG long jobs,
// older than the backlog, that other workers hold for the whole run without
// finishing them. Then WORKERS workers claim one job at a time, work JOB_MS
// on it (a client-side timer, the database idle meanwhile) and finish it,
// for SECONDS, while an enqueuer adds RATE jobs a second, due at once, at a
// higher priority than the backlog (every contender orders by priority
// first): their latency, claim time minus run_at (the job's due time), is a
// worker's answer to new work while a backlog waits, not the backlog's age.
//
// Contenders, each as it is meant to run:
//   pg_throttle  throttle.claim + throttle.complete over a pool of POOL
//                connections (no transaction stays open while a job runs);
//                the long jobs are claims of other workers whose lease holds;
//   recipe       FOR UPDATE SKIP LOCKED, the transaction open while the job
//                runs, so a connection per worker; the long jobs are 200 open
//                transactions on 200 connections;
//   graphile-worker 0.18   its runner (LISTEN/NOTIFY, default pool); the long
//                jobs are locked (locked_at, locked_by) by a second runner
//                whose task never returns during the run;
//   pg-boss 12   work() with LISTEN/NOTIFY on the queue and the burst tuning
//                of queues.mjs; the long jobs are fetched (state 'active')
//                and never completed.
// pg_throttle's and the recipe's idle workers wait for a NOTIFY of new work
// (one listening connection), as graphile-worker's and pg-boss's do.
//
// Every contender runs twice: as above, and with a snapshot older than the
// long jobs' claims held open (a REPEATABLE READ transaction that read a
// table before they were taken, as pg_dump or hot_standby_feedback hold one),
// which keeps every dead row version and index entry of the run. Rounds are
// interleaved; the table gives the median round of each row.
//
// Reported per contender and row: the peak of the database connections it
// used (pg_stat_activity, sampled every 250 ms; the harness's own are left
// out), jobs finished per second, the stream jobs' p50 and p99 latency, how
// many of the stream jobs were claimed within the run, and the size of every
// table of its schema (heap, indexes and TOAST) after the fill and at the end.
//
// Settings (environment):
//   BENCH_REAL_JOBS (100000)  BENCH_REAL_WORKERS (32)  BENCH_REAL_SECONDS (60)
//   BENCH_REAL_JOB_MS (20)  BENCH_REAL_LONG (200)  BENCH_REAL_ROUNDS (1)
//   BENCH_REAL_RATE (stream jobs a second; by default 70 % of the slowest
//   contender's jobs/s in a first run of each without the stream and without
//   the old snapshot, of BENCH_REAL_CALIBRATE_SECONDS (15))
//   BENCH_REAL_POOL (10: pg_throttle's pool, the libraries' default size)
//   BENCH_REAL_ONLY (a regular expression: only the contenders it matches)
import pg from "pg";
import { makeWorkerUtils, run as graphileRun, runMigrations } from "graphile-worker";
import { PgBoss } from "pg-boss";
import { connect, connection, fmt, listener, median, quantile, silent, sleep, url } from "./common.mjs";

const env = process.env;
const setting = (name, fallback) => {
  const value = Number(env[name] ?? fallback);
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number, not ${env[name]}`);
  return value;
};
const JOBS = setting("BENCH_REAL_JOBS", 100000);
const WORKERS = setting("BENCH_REAL_WORKERS", 32);
const SECONDS = setting("BENCH_REAL_SECONDS", 60);
const JOB_MS = setting("BENCH_REAL_JOB_MS", 20);
const LONG = setting("BENCH_REAL_LONG", 200);
const ROUNDS = setting("BENCH_REAL_ROUNDS", 1);
const POOL = setting("BENCH_REAL_POOL", 10);
// The stream's rate: BENCH_REAL_RATE, else 70 % of the slowest contender's
// throughput in a calibration run of CALIBRATE seconds without the stream
// and without the old snapshot (below), so that each has headroom there.
const CALIBRATE = setting("BENCH_REAL_CALIBRATE_SECONDS", 15);
const HARNESS = "rb-harness"; // application_name of the connections not counted
const QUEUE = "rb_real";

const admin = await connect(HARNESS);
const q = (text, values) => admin.query(text, values);
await q("CREATE EXTENSION IF NOT EXISTS pg_throttle");


// Every table of a schema: heap, indexes and TOAST (partitions included).
async function schemaBytes(schema) {
  const { rows } = await q(
    `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint AS bytes
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')`,
    [schema],
  );
  return Number(rows[0].bytes);
}

// ---- the contenders ---------------------------------------------------------
// fill(): the backlog and the long jobs, from empty tables, vacuumed.
// hold(): the long jobs taken by other workers; returns what releases them.
// start(run): WORKERS workers that call run.claimed(runAt, isStream) when they
//   get a job and run.finished() when it is done, until run.stopping; returns
//   { enqueue(n): n stream jobs due now, stop(): waits for the workers }.
const throttle = {
  name: "pg_throttle: throttle.claim + throttle.complete",
  schema: "throttle",
  async setup() {},
  async fill() {
    await q("TRUNCATE throttle.event, throttle.event_history, throttle.event_attempt");
    await q(
      `SELECT cardinality(throttle.schedule_many($1, array_agg('long' || g ORDER BY g),
                                                 array_agg(now() - interval '2 hours' + g * interval '1 microsecond' ORDER BY g)))
       FROM generate_series(1, $2) AS g`,
      [QUEUE, LONG],
    );
    for (let from = 1; from <= JOBS; from += 10000) {
      await q(
        `SELECT cardinality(throttle.schedule_many($1, array_agg('b' || g ORDER BY g),
                                                   array_agg(now() - interval '1 hour' + g * interval '1 microsecond' ORDER BY g)))
         FROM generate_series($2::int, $3::int) AS g`,
        [QUEUE, from, Math.min(JOBS, from + 9999)],
      );
    }
    await q("VACUUM ANALYZE throttle.event, throttle.event_history, throttle.event_attempt");
  },
  async hold() {
    // 200 workers' claims, taken over one connection that is closed after:
    // a claim needs no transaction, nor a connection, while its lease holds.
    const client = await connect("rb-throttle-holders");
    for (let i = 0; i < LONG; i++) {
      await client.query("SELECT id FROM throttle.claim($1, $2, $3, 1)", [QUEUE, `long-${i}`, `${SECONDS + 3600} seconds`]);
    }
    await client.end();
    return async () => {};
  },
  async start(run) {
    const pool = new pg.Pool({ ...connection, max: POOL, application_name: "rb-throttle" });
    pool.on("error", (e) => console.error("pg_throttle pool:", e.message));
    const wake = await listener(QUEUE, "rb-throttle");
    const workers = Array.from({ length: WORKERS }, async (_, i) => {
      while (!run.stopping) {
        const { rows } = await pool.query(
          "SELECT id, claim_token, run_at, priority FROM throttle.claim($1, $2, '5 minutes', 1)",
          [QUEUE, `w${i}`],
        );
        if (rows.length === 0) {
          await wake.wait(1000);
          continue;
        }
        run.claimed(rows[0].run_at, rows[0].priority === 1);
        await sleep(JOB_MS);
        await pool.query("SELECT throttle.complete($1::bigint[], $2)", [[rows[0].id], rows[0].claim_token]);
        run.finished();
      }
    });
    let stream = 0;
    return {
      enqueue: (n) => {
        const keys = Array.from({ length: n }, () => `s${stream++}`);
        return pool.query(
          "SELECT cardinality(throttle.schedule_many($1, $2::text[], array_fill(now(), ARRAY[$3::int]), priority => 1))",
          [QUEUE, keys, n],
        );
      },
      async stop() {
        await Promise.all(workers);
        await wake.end();
        await pool.end();
      },
    };
  },
};

const RECIPE_CLAIM = `SELECT id, run_at, priority FROM rb_recipe.job
                      WHERE done_at IS NULL AND run_at <= now()
                      ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`;
const recipe = {
  name: "FOR UPDATE SKIP LOCKED recipe (transaction open while the job runs)",
  schema: "rb_recipe",
  async setup() {
    await q(`
      DROP SCHEMA IF EXISTS rb_recipe CASCADE;
      CREATE SCHEMA rb_recipe;
      CREATE TABLE rb_recipe.job (id bigserial PRIMARY KEY, payload jsonb NOT NULL DEFAULT '{}',
                                  priority integer NOT NULL DEFAULT 0,
                                  run_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz);
      CREATE INDEX job_due ON rb_recipe.job (priority DESC, run_at, id) WHERE done_at IS NULL;`);
  },
  async fill() {
    await q("TRUNCATE rb_recipe.job");
    await q(
      `INSERT INTO rb_recipe.job (run_at)
       SELECT now() - interval '2 hours' + g * interval '1 microsecond' FROM generate_series(1, $1) AS g`,
      [LONG],
    );
    await q(
      `INSERT INTO rb_recipe.job (run_at)
       SELECT now() - interval '1 hour' + g * interval '1 microsecond' FROM generate_series(1, $1) AS g`,
      [JOBS],
    );
    await q("VACUUM ANALYZE rb_recipe.job");
  },
  async hold() {
    // Each long job holds its row lock, so its transaction and connection, while it runs.
    const holders = [];
    for (let i = 0; i < LONG; i++) {
      const client = await connect("rb-recipe-holders");
      holders.push(client);
      await client.query("BEGIN");
      const { rows } = await client.query(RECIPE_CLAIM);
      if (rows.length !== 1) throw new Error("recipe: a long job found nothing to claim");
    }
    return async () => {
      await Promise.all(holders.map(async (c) => c.query("ROLLBACK").finally(() => c.end())));
    };
  },
  async start(run) {
    const wake = await listener("rb_recipe", "rb-recipe");
    const enqueuer = await connect("rb-recipe");
    const clients = await Promise.all(Array.from({ length: WORKERS }, () => connect("rb-recipe")));
    const workers = clients.map(async (c) => {
      while (!run.stopping) {
        await c.query("BEGIN");
        const { rows } = await c.query(RECIPE_CLAIM);
        if (rows.length === 0) {
          await c.query("COMMIT");
          await wake.wait(1000);
          continue;
        }
        run.claimed(rows[0].run_at, rows[0].priority === 1);
        await sleep(JOB_MS);
        await c.query("UPDATE rb_recipe.job SET done_at = now() WHERE id = $1", [rows[0].id]);
        await c.query("COMMIT");
        run.finished();
      }
    });
    return {
      enqueue: (n) =>
        enqueuer.query(
          `WITH added AS (INSERT INTO rb_recipe.job (priority) SELECT 1 FROM generate_series(1, $1) RETURNING 1)
           SELECT pg_notify('rb_recipe', count(*)::text) FROM added`,
          [n],
        ),
      async stop() {
        await Promise.all(workers);
        await Promise.all([...clients, enqueuer].map((c) => c.end()));
        await wake.end();
      },
    };
  },
};

const graphile = {
  name: "graphile-worker 0.18",
  schema: "graphile_worker",
  async setup() {
    await runMigrations({ connectionString: url, logger: silent });
  },
  async fill() {
    await q("TRUNCATE graphile_worker._private_jobs");
    const utils = await makeWorkerUtils({ connectionString: url, logger: silent });
    try {
      const base = Date.now();
      await utils.addJobs(
        Array.from({ length: LONG }, (_, i) => ({ identifier: "rb_long", payload: {}, runAt: new Date(base - 7200000 + i) })),
      );
      for (let from = 0; from < JOBS; from += 1000) {
        const n = Math.min(1000, JOBS - from);
        await utils.addJobs(
          Array.from({ length: n }, (_, k) => ({ identifier: "rb", payload: {}, runAt: new Date(base - 3600000 + from + k) })),
        );
      }
    } finally {
      await utils.release();
    }
    await q("VACUUM ANALYZE graphile_worker._private_jobs");
  },
  async hold() {
    // A second runner takes the long jobs (its own task, so the workers below
    // never wait on them, nor it on theirs) and keeps them until released.
    let release;
    const held = new Promise((resolve) => (release = resolve));
    const runner = await graphileRun({
      connectionString: url,
      concurrency: LONG,
      noHandleSignals: true,
      pollInterval: 1000,
      logger: silent,
      taskList: { rb_long: () => held },
    });
    const deadline = Date.now() + 120000;
    for (;;) {
      const { rows } = await q(
        `SELECT count(*)::int AS n FROM graphile_worker._private_jobs j
         JOIN graphile_worker._private_tasks t ON t.id = j.task_id
         WHERE t.identifier = 'rb_long' AND j.locked_at IS NOT NULL`,
      );
      if (rows[0].n >= LONG) break;
      if (Date.now() > deadline) throw new Error(`graphile-worker: only ${rows[0].n} of ${LONG} long jobs locked`);
      await sleep(50);
    }
    return async () => {
      release();
      await runner.stop();
    };
  },
  async start(run) {
    const utils = await makeWorkerUtils({ connectionString: url, logger: silent });
    const runner = await graphileRun({
      connectionString: url,
      concurrency: WORKERS,
      noHandleSignals: true,
      pollInterval: 1000,
      logger: silent,
      taskList: {
        rb: async (_payload, helpers) => {
          run.claimed(helpers.job.run_at, helpers.job.priority === -1);
          await sleep(JOB_MS);
          run.finished();
        },
      },
    });
    return {
      // Smaller numbers run first in graphile-worker.
      enqueue: (n) => utils.addJobs(Array.from({ length: n }, () => ({ identifier: "rb", payload: {}, priority: -1 }))),
      async stop() {
        await runner.stop();
        await utils.release();
      },
    };
  },
};

// pg-boss with its queue statistics refreshed every second, so that
// burstWhenReadyExceeds (fetch again at once while jobs are ready) works, as
// in queues.mjs, and LISTEN/NOTIFY on the queue, so that idle workers wake.
let boss = null;
const bossQueue = { notify: true, expireInSeconds: Math.max(900, 2 * SECONDS + 600) };
const pgBoss = {
  name: "pg-boss 12",
  schema: "pgboss",
  async setup() {},
  async fill() {
    boss = new PgBoss({
      ...connection,
      schema: "pgboss",
      schedule: false,
      useListenNotify: true,
      monitorIntervalSeconds: 1,
      queueCacheIntervalSeconds: 1,
      superviseIntervalSeconds: 1,
    });
    boss.on("error", (e) => console.error("pg-boss:", e.message));
    boss.on("warning", () => {}); // its old-snapshot and bloat warnings are what the run shows
    await boss.start();
    if (await boss.getQueue(QUEUE)) await boss.updateQueue(QUEUE, bossQueue);
    else await boss.createQueue(QUEUE, bossQueue);
    await q("TRUNCATE pgboss.job");
    // The long jobs first: fetch takes the oldest.
    await boss.insert(QUEUE, Array.from({ length: LONG }, () => ({ data: {} })));
    for (let from = 0; from < JOBS; from += 1000) {
      await boss.insert(QUEUE, Array.from({ length: Math.min(1000, JOBS - from) }, () => ({ data: {} })));
    }
    await q("VACUUM ANALYZE pgboss.job");
  },
  async hold() {
    const jobs = await boss.fetch(QUEUE, { batchSize: LONG });
    if ((jobs?.length ?? 0) !== LONG) throw new Error(`pg-boss: fetched ${jobs?.length ?? 0} of ${LONG} long jobs`);
    return async () => {};
  },
  async start(run) {
    const id = await boss.work(
      QUEUE,
      {
        localConcurrency: WORKERS,
        batchSize: 1,
        pollingIntervalSeconds: 0.5,
        burstWhenReadyExceeds: 1,
        includeMetadata: true,
      },
      async ([job]) => {
        run.claimed(job.startAfter, job.priority === 1);
        await sleep(JOB_MS);
        run.finished();
      },
    );
    return {
      enqueue: (n) => boss.insert(QUEUE, Array.from({ length: n }, () => ({ data: {}, priority: 1 }))),
      async stop() {
        await boss.offWork(QUEUE, { id, wait: true }).catch(() => boss.offWork(QUEUE));
        await boss.stop({ graceful: false, close: true }).catch(() => {});
        boss = null;
      },
    };
  },
};

// ---- one run ------------------------------------------------------------------
async function oldSnapshot() {
  const client = await connect(HARNESS);
  await client.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
  await client.query("SELECT count(*) FROM pg_class");
  return client;
}

// One run of `seconds` with a stream of `rate` jobs a second.
async function once(contender, { withSnapshot, rate, seconds }) {
  await contender.fill();
  const bytesBefore = await schemaBytes(contender.schema);
  const snapshot = withSnapshot ? await oldSnapshot() : null;
  let release = null;
  let workers = null;
  const run = {
    stopping: false,
    counting: false,
    done: 0,
    latencies: [],
    claimed(runAt, stream) {
      if (this.counting && stream) this.latencies.push(Date.now() - runAt.getTime());
    },
    finished() {
      if (this.counting) this.done++;
    },
  };
  // The peak of the contender's connections (all but the harness's).
  let peak = 0;
  let sampling = true;
  const sampler = (async () => {
    const client = await connect(HARNESS);
    while (sampling) {
      const { rows } = await client.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND datname = current_database()
           AND application_name IS DISTINCT FROM $1`,
        [HARNESS],
      );
      peak = Math.max(peak, rows[0].n);
      await sleep(250);
    }
    await client.end();
  })();
  let enqueued = 0;
  let result;
  try {
    release = await contender.hold();
    workers = await contender.start(run);
    run.counting = true;
    const started = performance.now();
    const end = started + seconds * 1000;
    while (performance.now() < end) {
      const due = Math.floor((rate * (performance.now() - started)) / 1000) - enqueued;
      if (due > 0) {
        await workers.enqueue(due);
        enqueued += due;
      }
      await sleep(5); // small batches: a batch of k waits for k workers to come free
    }
    run.counting = false;
    const elapsed = (performance.now() - started) / 1000;
    run.stopping = true;
    await workers.stop();
    workers = null;
    const bytesAfter = await schemaBytes(contender.schema);
    result = {
      rate: run.done / elapsed,
      p50: quantile(run.latencies, 0.5),
      p99: quantile(run.latencies, 0.99),
      claimed: run.latencies.length,
      enqueued,
      bytesBefore,
      bytesAfter,
    };
  } finally {
    run.stopping = true;
    run.counting = false;
    if (workers) await workers.stop().catch(() => {});
    if (release) await release();
    if (boss) await boss.stop({ graceful: false, close: true }).catch(() => {});
    boss = null;
    if (snapshot) await snapshot.query("COMMIT").finally(() => snapshot.end());
    sampling = false;
    await sampler;
  }
  return { ...result, connections: peak };
}

// ---- the runs -------------------------------------------------------------------
const only = env.BENCH_REAL_ONLY ? new RegExp(env.BENCH_REAL_ONLY) : null;
const contenders = [throttle, recipe, graphile, pgBoss].filter((c) => !only || only.test(c.name));
for (const contender of contenders) await contender.setup();
let RATE = env.BENCH_REAL_RATE === undefined ? null : setting("BENCH_REAL_RATE", 0);
let rateFrom = "BENCH_REAL_RATE";
if (RATE === null) {
  const capacity = [];
  for (const contender of contenders) {
    const { rate } = await once(contender, { withSnapshot: false, rate: 0, seconds: CALIBRATE });
    console.error(`calibration  ${contender.name}: ${rate.toFixed(0)} jobs/s without the stream`);
    capacity.push([rate, contender.name]);
  }
  const [slowest, name] = capacity.sort((a, b) => a[0] - b[0])[0];
  RATE = Math.max(1, Math.round(0.7 * slowest));
  rateFrom =
    `70 % of the slowest contender's ${fmt(slowest)} jobs/s (${name}) in a ${CALIBRATE} s run ` +
    `without the stream and the old snapshot; those runs: ` +
    capacity.map(([r, n]) => `${n} ${fmt(r)}`).join(", ");
}
const results = new Map(); // name + snapshot -> [round results]
for (let round = 1; round <= ROUNDS; round++) {
  for (const withSnapshot of [false, true]) {
    for (const contender of contenders) {
      const result = await once(contender, { withSnapshot, rate: RATE, seconds: SECONDS });
      const key = `${contender.name}\u0000${withSnapshot}`;
      results.set(key, [...(results.get(key) ?? []), result]);
      console.error(
        `round ${round}  ${contender.name}${withSnapshot ? ", older snapshot open" : ""}: ` +
          `${result.rate.toFixed(0)} jobs/s, stream p50 ${result.p50} ms, p99 ${result.p99} ms ` +
          `(${result.claimed} of ${result.enqueued} claimed), ${result.connections} connections, ` +
          `${(result.bytesBefore / 1048576).toFixed(1)} -> ${(result.bytesAfter / 1048576).toFixed(1)} MB`,
      );
    }
  }
}

const mb = (bytes) => (bytes / 1048576).toFixed(1);
const ms = (x) => (Number.isNaN(x) ? "–" : fmt(x)); // whole ms: the libraries hand run_at over as a Date
console.log(
  `\nQueues as they really run: Node ${process.version}, node-postgres; ${WORKERS} workers, ` +
    `${JOB_MS} ms of client-side work per job, a backlog of ${fmt(JOBS)} due jobs, ${LONG} long jobs held ` +
    `all run, a stream of ${fmt(RATE)} jobs/s due at once (above the backlog's priority: ${rateFrom}); ` +
    `${SECONDS} s per run, median of ${ROUNDS} interleaved round${ROUNDS === 1 ? "" : "s"}.\n`,
);
console.log(
  "| contender | older snapshot open | connections (peak) | jobs/s | stream p50 (ms) | stream p99 (ms) | stream jobs claimed | tables at start → end (MB) |",
);
console.log("|---|---|---:|---:|---:|---:|---:|---:|");
for (const withSnapshot of [false, true]) {
  for (const contender of contenders) {
    const xs = results.get(`${contender.name}\u0000${withSnapshot}`);
    const m = (f) => median(xs.map(f));
    console.log(
      `| ${contender.name} | ${withSnapshot ? "yes" : "no"} | ${fmt(m((r) => r.connections))} | ${fmt(m((r) => r.rate))} | ` +
        `${ms(m((r) => r.p50))} | ${ms(m((r) => r.p99))} | ${fmt(m((r) => r.claimed))} of ${fmt(m((r) => r.enqueued))} | ` +
        `${mb(m((r) => r.bytesBefore))} → ${mb(m((r) => r.bytesAfter))} |`,
    );
  }
}
await admin.end();
