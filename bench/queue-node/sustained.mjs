// make bench-sustained: pg_throttle's event queue under steady load for a long
// time, autovacuum at its defaults, with a snapshot held open in the middle
// of the run; against the cluster the libpq environment names.
//
// An enqueuer schedules RATE events a second, due at once (schedule_many, a
// batch every 50 ms); WORKERS workers claim one at a time, work JOB_MS and
// complete it; a purge keeps KEEP seconds of history (throttle.purge, every
// sample), as an operator's cron job would. RATE is 70 % of the maximum that
// a first run of CALIBRATE seconds measures (each worker schedules, claims and
// completes one event per loop, as fast as it can), unless given. From a
// third of the run to two thirds, a REPEATABLE READ transaction that read the
// queue stays open (a long report, pg_dump, hot_standby_feedback): vacuum
// and index cleanup can remove nothing newer.
//
// Every SAMPLE seconds: the events enqueued and completed, the claims' wait
// (claimed_at − run_at, p50, p99 and max, from the server's clock), the
// pending backlog, and for each table its heap (pg_table_size) and indexes
// (pg_indexes_size) apart, dead and live tuples and autovacuum runs
// (pg_stat_user_tables). One CSV per contender and meta.json in OUT_DIR;
// bench/sustained_report.py checks the goal and draws the plot.
//
// With BENCH_SUSTAINED_RECIPE=1 the same load then runs on the FOR UPDATE
// SKIP LOCKED recipe (a job table whose finished rows stay KEEP seconds, then
// are deleted by the same periodic purge), at the same rate, to compare bloat.
//
//   node sustained.mjs OUT_DIR
//   BENCH_SUSTAINED_MINUTES (30)  BENCH_SUSTAINED_SAMPLE_SECONDS (60)
//   BENCH_SUSTAINED_WORKERS (8)  BENCH_SUSTAINED_JOB_MS (0)
//   BENCH_SUSTAINED_RATE (events/s; else 70 % of BENCH_SUSTAINED_MAXIMUM, or
//   of the maximum measured first)
//   BENCH_SUSTAINED_CALIBRATE_SECONDS (30)
//   BENCH_SUSTAINED_KEEP_SECONDS (a sixth of the run: 300 for 30 minutes)
//   BENCH_SUSTAINED_RECIPE (0)
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect, fmt, listener, quantile, sleep } from "./common.mjs";

const env = process.env;
const setting = (name, fallback) => {
  const value = Number(env[name] ?? fallback);
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number, not ${env[name]}`);
  return value;
};
const OUT = process.argv[2];
if (!OUT) throw new Error("usage: node sustained.mjs OUT_DIR");
const MINUTES = setting("BENCH_SUSTAINED_MINUTES", 30);
const TOTAL = MINUTES * 60; // seconds
const SAMPLE = setting("BENCH_SUSTAINED_SAMPLE_SECONDS", 60);
const WORKERS = setting("BENCH_SUSTAINED_WORKERS", 8);
const JOB_MS = setting("BENCH_SUSTAINED_JOB_MS", 0);
const CALIBRATE = setting("BENCH_SUSTAINED_CALIBRATE_SECONDS", 30);
const KEEP = setting("BENCH_SUSTAINED_KEEP_SECONDS", TOTAL / 6);
const RECIPE = env.BENCH_SUSTAINED_RECIPE === "1";
// The snapshot's window (minutes 10 to 20 of 30), and the reference sample
// and the time to recover that the goal check uses (minute 5; 5 minutes).
const SNAPSHOT_OPEN = TOTAL / 3;
const SNAPSHOT_CLOSE = (2 * TOTAL) / 3;
const QUEUE = "sustained";
if (SAMPLE <= 0 || TOTAL < 3 * SAMPLE) throw new Error("the run must last at least three samples");

const admin = await connect("sustained-harness");
const q = (text, values) => admin.query(text, values);
await q("CREATE EXTENSION IF NOT EXISTS pg_throttle");
await q("SET client_min_messages = warning");


// ---- the contenders -------------------------------------------------------------
// claim(client, worker) returns { job, waitMs } or null; finish(client, job).
const throttle = {
  name: "throttle",
  label: "pg_throttle: schedule_many + claim + complete, purge",
  channel: QUEUE,
  tables: ["throttle.event", "throttle.event_history", "throttle.event_attempt"],
  async reset() {
    await q("TRUNCATE throttle.event, throttle.event_history, throttle.event_attempt");
    await q("VACUUM ANALYZE throttle.event, throttle.event_history, throttle.event_attempt");
  },
  enqueue: (client, keys) =>
    client.query("SELECT cardinality(throttle.schedule_many($1, $2::text[], array_fill(now(), ARRAY[$3::int])))", [
      QUEUE,
      keys,
      keys.length,
    ]),
  async claim(client, worker) {
    const { rows } = await client.query(
      `SELECT id, claim_token, extract(epoch FROM claimed_at - run_at) * 1000 AS wait_ms
       FROM throttle.claim($1, $2, '1 minute', 1)`,
      [QUEUE, worker],
    );
    return rows.length ? { job: rows[0], waitMs: Number(rows[0].wait_ms) } : null;
  },
  finish: (client, job) => client.query("SELECT throttle.complete($1::bigint[], $2)", [[job.id], job.claim_token]),
  purge: () => q("SELECT throttle.purge(make_interval(secs => $1), $2)", [KEEP, QUEUE]),
  backlog: async () =>
    Number((await q("SELECT count(*) AS n FROM throttle.event WHERE queue = $1 AND state = 'pending'", [QUEUE])).rows[0].n),
};

const recipe = {
  name: "recipe",
  label: "FOR UPDATE SKIP LOCKED recipe: INSERT + claim + UPDATE done_at, purge",
  channel: "sustained_recipe",
  tables: ["rs.job"],
  async reset() {
    await q(`
      DROP SCHEMA IF EXISTS rs CASCADE;
      CREATE SCHEMA rs;
      CREATE TABLE rs.job (id bigserial PRIMARY KEY, payload jsonb NOT NULL DEFAULT '{}',
                           run_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz);
      CREATE INDEX job_due ON rs.job (run_at, id) WHERE done_at IS NULL;
      CREATE INDEX job_done ON rs.job (done_at) WHERE done_at IS NOT NULL;`);
    await q("VACUUM ANALYZE rs.job");
  },
  enqueue: (client, keys) =>
    client.query(
      `WITH added AS (INSERT INTO rs.job (payload) SELECT '{}' FROM generate_series(1, $1) RETURNING 1)
       SELECT pg_notify('sustained_recipe', count(*)::text) FROM added`,
      [keys.length],
    ),
  async claim(client) {
    await client.query("BEGIN");
    const { rows } = await client.query(
      `SELECT id, extract(epoch FROM clock_timestamp() - run_at) * 1000 AS wait_ms FROM rs.job
       WHERE done_at IS NULL AND run_at <= now() ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`,
    );
    if (rows.length === 0) {
      await client.query("COMMIT");
      return null;
    }
    return { job: rows[0], waitMs: Number(rows[0].wait_ms) };
  },
  async finish(client, job) {
    await client.query("UPDATE rs.job SET done_at = now() WHERE id = $1", [job.id]);
    await client.query("COMMIT");
  },
  purge: () => q("DELETE FROM rs.job WHERE done_at < now() - make_interval(secs => $1)", [KEEP]),
  backlog: async () => Number((await q("SELECT count(*) AS n FROM rs.job WHERE done_at IS NULL")).rows[0].n),
};

// ---- the maximum -------------------------------------------------------------------
// Each worker schedules one event due at once, claims one and completes it, in
// a loop, for CALIBRATE seconds: cycles a second.
async function measureMaximum() {
  await throttle.reset();
  const clients = await Promise.all(Array.from({ length: WORKERS }, () => connect("sustained")));
  let cycles = 0;
  const started = performance.now();
  const end = started + CALIBRATE * 1000;
  await Promise.all(
    clients.map(async (c, i) => {
      let n = 0;
      while (performance.now() < end) {
        await c.query("SELECT throttle.schedule($1, $2, now())", [QUEUE, `c${i}.${n++}`]);
        const claimed = await throttle.claim(c, `w${i}`);
        if (!claimed) continue;
        if (JOB_MS) await sleep(JOB_MS);
        await throttle.finish(c, claimed.job);
        cycles++;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  await Promise.all(clients.map((c) => c.end()));
  return cycles / seconds;
}

// ---- one sustained run -----------------------------------------------------------------
const columns = (contender) => [
  "contender",
  "sample",
  "t_end_s",
  "snapshot_open",
  "enqueued",
  "completed",
  "claims",
  "p50_ms",
  "p99_ms",
  "max_ms",
  "backlog",
  ...contender.tables.flatMap((t) => {
    const s = t.split(".")[1];
    return [`${s}_heap_bytes`, `${s}_index_bytes`, `${s}_dead_tup`, `${s}_live_tup`, `${s}_autovacuums`];
  }),
];

async function tableStats(tables) {
  const { rows } = await q(
    `SELECT t.ord, pg_table_size(t.rel) AS heap, pg_indexes_size(t.rel) AS idx,
            s.n_dead_tup, s.n_live_tup, s.autovacuum_count
     FROM unnest($1::regclass[]) WITH ORDINALITY AS t(rel, ord)
     JOIN pg_stat_user_tables s ON s.relid = t.rel
     ORDER BY t.ord`,
    [tables],
  );
  return rows.flatMap((r) => [r.heap, r.idx, r.n_dead_tup, r.n_live_tup, r.autovacuum_count].map(Number));
}

async function sustain(contender, rate) {
  await contender.reset();
  const file = join(OUT, `${contender.name}.csv`);
  writeFileSync(file, columns(contender).join(",") + "\n");
  const wake = await listener(contender.channel, "sustained");
  const enqueuer = await connect("sustained");
  const clients = await Promise.all(Array.from({ length: WORKERS }, () => connect("sustained")));
  const started = performance.now();
  const elapsed = () => (performance.now() - started) / 1000;
  let stopping = false;
  // The current sample's counts; the sampler swaps them.
  let current = { enqueued: 0, completed: 0, waits: [] };
  const workers = clients.map(async (c, i) => {
    while (!stopping) {
      const claimed = await contender.claim(c, `w${i}`);
      if (!claimed) {
        await wake.wait(100);
        continue;
      }
      current.waits.push(claimed.waitMs);
      if (JOB_MS) await sleep(JOB_MS);
      await contender.finish(c, claimed.job);
      current.completed++;
    }
  });
  const enqueuing = (async () => {
    let sent = 0;
    while (!stopping) {
      const due = Math.floor(rate * elapsed()) - sent;
      if (due > 0) {
        const keys = Array.from({ length: due }, (_, k) => `e${sent + k}`);
        await contender.enqueue(enqueuer, keys);
        sent += due;
        current.enqueued += due;
      }
      await sleep(50);
    }
  })();
  // The old snapshot, from SNAPSHOT_OPEN to SNAPSHOT_CLOSE.
  let snapshot = null;
  const window = { opened: null, closed: null };
  const snapshotting = (async () => {
    await sleep(SNAPSHOT_OPEN * 1000 - (performance.now() - started));
    if (stopping) return;
    snapshot = await connect("sustained-harness");
    await snapshot.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
    await snapshot.query(`SELECT count(*) FROM ${contender.tables[0]}`);
    window.opened = elapsed();
    console.error(`${contender.name}: snapshot opened at ${(window.opened / 60).toFixed(2)} min`);
    await sleep(SNAPSHOT_CLOSE * 1000 - (performance.now() - started));
    await snapshot.query("COMMIT");
    await snapshot.end();
    snapshot = null;
    window.closed = elapsed();
    console.error(`${contender.name}: snapshot closed at ${(window.closed / 60).toFixed(2)} min`);
  })();
  const samples = Math.round(TOTAL / SAMPLE);
  try {
    for (let k = 1; k <= samples; k++) {
      await sleep(k * SAMPLE * 1000 - (performance.now() - started));
      const t = elapsed();
      const taken = current;
      current = { enqueued: 0, completed: 0, waits: [] };
      const tStart = (k - 1) * SAMPLE;
      const open =
        window.opened !== null && window.opened < t && (window.closed === null || window.closed > tStart) ? 1 : 0;
      const stats = await tableStats(contender.tables);
      const backlog = await contender.backlog();
      const row = [
        contender.name,
        k,
        t.toFixed(1),
        open,
        taken.enqueued,
        taken.completed,
        taken.waits.length,
        quantile(taken.waits, 0.5).toFixed(3),
        quantile(taken.waits, 0.99).toFixed(3),
        quantile(taken.waits, 1).toFixed(3),
        backlog,
        ...stats,
      ];
      writeFileSync(file, row.join(",") + "\n", { flag: "a" });
      const sizes = contender.tables
        .map((name, i) => `${name.split(".")[1]} ${((stats[5 * i] + stats[5 * i + 1]) / 1048576).toFixed(1)} MB`)
        .join(", ");
      console.error(
        `${contender.name} ${(t / 60).toFixed(1)} min${open ? " [snapshot]" : ""}: ${fmt(taken.completed / SAMPLE)} jobs/s, ` +
          `wait p50 ${quantile(taken.waits, 0.5).toFixed(1)} ms, p99 ${quantile(taken.waits, 0.99).toFixed(1)} ms, ` +
          `backlog ${fmt(backlog)}; ${sizes}`,
      );
      // The operator's purge, after the figures of the sample.
      await contender.purge();
    }
  } finally {
    stopping = true;
    await enqueuing;
    await Promise.all(workers);
    await snapshotting.catch(() => {});
    if (snapshot) await snapshot.end();
    await Promise.all([...clients, enqueuer].map((c) => c.end()));
    await wake.end();
  }
  return { name: contender.name, label: contender.label, csv: `${contender.name}.csv`, tables: contender.tables, window };
}

// ---- the run --------------------------------------------------------------------------
mkdirSync(OUT, { recursive: true });
let maximum = env.BENCH_SUSTAINED_MAXIMUM === undefined ? null : setting("BENCH_SUSTAINED_MAXIMUM", 0);
let measured = false;
let rate = env.BENCH_SUSTAINED_RATE === undefined ? null : setting("BENCH_SUSTAINED_RATE", 0);
if (rate === null) {
  if (maximum === null) {
    maximum = await measureMaximum();
    measured = true;
  }
  rate = Math.max(1, Math.round(0.7 * maximum));
  console.error(
    `maximum: ${fmt(maximum)} events/s (${measured ? `schedule + claim + complete, ${WORKERS} workers, ${CALIBRATE} s` : "BENCH_SUSTAINED_MAXIMUM"}); rate ${fmt(rate)}/s`,
  );
} else {
  maximum = null;
}
const runs = [];
for (const contender of RECIPE ? [throttle, recipe] : [throttle]) {
  runs.push(await sustain(contender, rate));
}
const server = (await q("SHOW server_version")).rows[0].server_version;
writeFileSync(
  join(OUT, "meta.json"),
  JSON.stringify(
    {
      minutes: MINUTES,
      sample_seconds: SAMPLE,
      workers: WORKERS,
      job_ms: JOB_MS,
      rate,
      maximum,
      calibrate_seconds: measured ? CALIBRATE : null,
      keep_seconds: KEEP,
      snapshot_open_s: SNAPSHOT_OPEN,
      snapshot_close_s: SNAPSHOT_CLOSE,
      reference_s: TOTAL / 6,
      recovery_s: TOTAL / 6,
      node: process.version,
      server,
      finished: new Date().toISOString(),
      runs,
    },
    null,
    2,
  ) + "\n",
);
await admin.end();
