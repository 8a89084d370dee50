// Helpers shared by the Node benches of this folder (queues.mjs, real.mjs,
// sustained.mjs): the connection the libpq environment names (PGHOST, PGPORT,
// PGUSER, PGPASSWORD, PGDATABASE), a silent graphile-worker logger, and the
// figures' arithmetic and formatting.
import pg from "pg";
import { Logger } from "graphile-worker";

const env = process.env;
export const connection = {
  host: env.PGHOST ?? "localhost",
  port: Number(env.PGPORT ?? 5432),
  user: env.PGUSER ?? "postgres",
  password: env.PGPASSWORD ?? "",
  database: env.PGDATABASE ?? "postgres",
};
// The host encoded, so that a socket directory (PGHOST=/run/...) works too.
export const url =
  `postgres://${encodeURIComponent(connection.user)}:${encodeURIComponent(connection.password)}` +
  `@${encodeURIComponent(connection.host)}:${connection.port}/${encodeURIComponent(connection.database)}`;
export const silent = new Logger(() => () => {});

// A new connection; application_name, when given, names it in pg_stat_activity.
export async function connect(application_name) {
  const client = new pg.Client({ ...connection, ...(application_name ? { application_name } : {}) });
  await client.connect();
  return client;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The sizes of batches of at most `size` that make `n`.
export const chunks = (n, size) =>
  Array.from({ length: Math.ceil(n / size) }, (_, i) => Math.min(size, n - i * size));

export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// The q-quantile (0..1) of xs, nearest rank; NaN when xs is empty.
export const quantile = (xs, q) => {
  if (xs.length === 0) return NaN;
  const s = Float64Array.from(xs).sort();
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
};

// 12345.6 -> "12 346"
export const fmt = (x) => Math.round(x).toLocaleString("en-US").replace(/,/g, " ");

// Wakes the idle workers of one contender when its channel is notified; a
// worker that hears nothing claims again after `ms` all the same.
export async function listener(channel, application_name) {
  const client = await connect(application_name);
  let waiters = [];
  client.on("notification", () => {
    const woken = waiters;
    waiters = [];
    for (const wake of woken) wake();
  });
  await client.query(`LISTEN ${channel}`);
  return {
    wait: (ms) =>
      new Promise((resolve) => {
        const timer = setTimeout(resolve, ms);
        waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      }),
    end: () => client.end(),
  };
}
