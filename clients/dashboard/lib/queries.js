'use strict';
// What the dashboard reads: each section is one or two queries on pg_throttle's
// views and functions (docs/reference.md), run in a read-only transaction.
// Counts are bigint, which node-postgres returns as strings: they are turned
// into numbers (counts stay far below 2^53); ids stay strings.

// Rows shown at most per list; the page says when a list is cut.
const LIMITS = {
  dead: 200, pending: 100, groups: 500, queues: 500, pauses: 500, recurring: 500, locks: 500, error: 2000,
};

function num(v) {
  return v === null || v === undefined ? null : Number(v);
}

// The actions and the exact functions behind them: a role may take an action
// when it has USAGE on the schema and EXECUTE on that function.
const ACTIONS = {
  retry: 'throttle.retry(bigint)',
  cancel: 'throttle.cancel(text, text)',
  pause: 'throttle.pause(text, text)',
  resume: 'throttle.resume(text, text)',
};

// The claimed and pending events are read from throttle.event when the role
// may read its columns (an index serves each query), else from the view
// throttle.all_events (which the least-privilege recipe grants), whose
// event_history half the planner cannot skip.
const EVENT_COLUMNS = ['id', 'queue', 'item_key', 'group_key', 'state', 'run_at', 'attempts',
  'max_attempts', 'priority', 'claimed_at', 'claimed_by', 'claimed_role', 'lease_until'];

async function permissions(client) {
  const who = (await client.query(
    `SELECT current_user AS role, session_user AS session_role, current_database() AS database,
            (SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle') AS extversion,
            has_schema_privilege('throttle', 'USAGE') AS usage`)).rows[0];
  const actions = Object.fromEntries(Object.keys(ACTIONS).map((name) => [name, false]));
  let eventTable = false;
  // Without USAGE on the schema, naming its functions or tables is refused
  // (42501): such a role may take no action and read nothing.
  if (who.usage) {
    const actionSql = Object.entries(ACTIONS)
      .map(([name, fn]) => `has_function_privilege('${fn}', 'EXECUTE') AS ${name}`).join(', ');
    const columnsSql = EVENT_COLUMNS
      .map((c) => `has_column_privilege('throttle.event', '${c}', 'SELECT')`).join(' AND ');
    const r = (await client.query(`SELECT ${actionSql}, (${columnsSql}) AS event_table`)).rows[0];
    for (const name of Object.keys(ACTIONS)) actions[name] = Boolean(r[name]);
    eventTable = r.event_table;
  }
  return {
    role: who.role, session_role: who.session_role, database: who.database, extversion: who.extversion,
    schema_usage: who.usage, actions, functions: ACTIONS,
    event_source: eventTable ? 'throttle.event' : 'throttle.all_events',
  };
}

async function queues(client) {
  const { rows } = await client.query(
    `SELECT queue, due, scheduled, claimed, claims_expired, dead, oldest_due_seconds, paused, paused_groups
       FROM throttle.queue_metrics ORDER BY queue LIMIT ${LIMITS.queues}`);
  return {
    limit: LIMITS.queues,
    rows: rows.map((r) => ({
      queue: r.queue, due: num(r.due), scheduled: num(r.scheduled), claimed: num(r.claimed),
      claims_expired: num(r.claims_expired), dead: num(r.dead),
      oldest_due_seconds: num(r.oldest_due_seconds), paused: r.paused, paused_groups: num(r.paused_groups),
    })),
  };
}

async function pauses(client) {
  const { rows } = await client.query(
    `SELECT queue, group_key, paused_at, paused_by FROM throttle.queue_pause
      ORDER BY queue, group_key NULLS FIRST LIMIT ${LIMITS.pauses}`);
  return { rows, limit: LIMITS.pauses };
}

async function groups(client, ctx) {
  const source = ctx.eventSource || 'throttle.all_events';
  const { rows } = await client.query(
    `SELECT queue, group_key, claimed_by, claimed_role::regrole::text AS claimed_role,
            count(*) AS events, min(claimed_at) AS claimed_at, max(lease_until) AS lease_until,
            max(lease_until) < throttle.now() AS lease_ended
       FROM ${source} WHERE state = 'claimed' AND group_key IS NOT NULL
      GROUP BY queue, group_key, claimed_by, claimed_role
      ORDER BY queue, group_key, claimed_by LIMIT ${LIMITS.groups}`);
  return { rows: rows.map((r) => ({ ...r, events: num(r.events) })), limit: LIMITS.groups };
}

// The newest dead events first, ties by id as a number (d.id: the bigint
// column, not the output column id::text). The LIMIT applies first, in the
// subquery: left() and length() of last_error (detoasted) run on the rows
// shown only, not on every dead event.
const DEAD_SQL = `SELECT d.id::text AS id, d.queue, d.item_key, d.group_key, d.attempts, d.max_attempts,
            d.completed_at AS died_at, d.completed_by, d.failed_at,
            left(d.last_error, ${LIMITS.error}) AS last_error,
            length(d.last_error) > ${LIMITS.error} AS error_truncated
       FROM (SELECT id, queue, item_key, group_key, attempts, max_attempts, completed_at, completed_by,
                    failed_at, last_error
               FROM throttle.dead_events
              ORDER BY completed_at DESC NULLS LAST, id DESC LIMIT ${LIMITS.dead}) d
      ORDER BY d.completed_at DESC NULLS LAST, d.id DESC`;

async function dead(client) {
  const { rows } = await client.query(DEAD_SQL);
  const total = await client.query('SELECT count(*) AS n FROM throttle.dead_events');
  return { rows, total: num(total.rows[0].n), limit: LIMITS.dead };
}

async function pending(client, ctx) {
  const source = ctx.eventSource || 'throttle.all_events';
  const { rows } = await client.query(
    `SELECT e.id::text AS id, e.queue, e.item_key, e.group_key, e.run_at, e.run_at <= throttle.now() AS due,
            e.attempts, e.max_attempts, e.priority
       FROM ${source} e WHERE e.state = 'pending' ORDER BY e.run_at, e.id LIMIT ${LIMITS.pending}`);
  return { rows, limit: LIMITS.pending };
}

async function recurring(client) {
  const { rows } = await client.query(
    `SELECT name, queue, cron, time_zone, enabled, last_firing, last_outcome,
            last_event_id::text AS last_event_id, last_event_state, next_firing,
            extract(epoch FROM behind)::float8 AS behind_seconds
       FROM throttle.recurring_status ORDER BY name LIMIT ${LIMITS.recurring}`);
  return { rows, limit: LIMITS.recurring };
}

// Server-wide per kind (throttle.registry_metrics: pg_read_all_stats) with the
// rates the tracker computes; each role's and database's use against its
// quota (throttle.registry_usage(): rows filtered for the caller); and this
// database's entries in force per kind (throttle.status).
async function registry(client, ctx) {
  const out = {};
  await client.query('SAVEPOINT registry_metrics');
  try {
    const started = ctx.clock();
    const { rows } = await client.query(
      `SELECT kind, entries, in_force, capacity, grants, denials, waiters,
              pg_postmaster_start_time()::text AS server_started
         FROM throttle.registry_metrics ORDER BY kind`);
    const at = (started + ctx.clock()) / 2;
    const metrics = rows.map((r) => ({
      kind: r.kind, entries: num(r.entries), in_force: num(r.in_force), capacity: num(r.capacity),
      grants: num(r.grants), denials: num(r.denials), waiters: num(r.waiters),
    }));
    // The counters start again with the server: a sample is compared only with
    // one of the same start (an empty view: no counters, nothing to compare).
    const rates = ctx.rates.observe(metrics, at, rows.length ? rows[0].server_started : null);
    for (const m of metrics) {
      const rate = rates.get(m.kind);
      m.grants_per_second = rate ? rate.grants_per_second : null;
      m.denials_per_second = rate ? rate.denials_per_second : null;
      m.rate_over_seconds = rate ? rate.over_seconds : null;
    }
    out.metrics = { rows: metrics };
    await client.query('RELEASE SAVEPOINT registry_metrics');
  } catch (e) {
    if (!isSqlError(e)) throw e;
    await client.query('ROLLBACK TO SAVEPOINT registry_metrics');
    out.metrics = { error: sqlError(e) };
  }
  await client.query('SAVEPOINT registry_usage');
  try {
    const { rows } = await client.query(
      `SELECT scope, name, entries, quota FROM throttle.registry_usage() ORDER BY scope, name`);
    out.usage = {
      rows: rows.map((r) => ({
        scope: r.scope, name: r.name, entries: num(r.entries), quota: num(r.quota),
        percent_of_quota: r.quota === null || Number(r.quota) === 0 ? null
          : Math.round((10000 * Number(r.entries)) / Number(r.quota)) / 100,
      })),
    };
    await client.query('RELEASE SAVEPOINT registry_usage');
  } catch (e) {
    if (!isSqlError(e)) throw e;
    await client.query('ROLLBACK TO SAVEPOINT registry_usage');
    out.usage = { error: sqlError(e) };
  }
  await client.query('SAVEPOINT registry_status');
  try {
    const { rows } = await client.query(
      'SELECT kind, count(*) AS entries, coalesce(sum(waiters), 0) AS waiters FROM throttle.status GROUP BY kind ORDER BY kind');
    out.database = { rows: rows.map((r) => ({ kind: r.kind, entries: num(r.entries), waiters: num(r.waiters) })) };
    await client.query('RELEASE SAVEPOINT registry_status');
  } catch (e) {
    if (!isSqlError(e)) throw e;
    await client.query('ROLLBACK TO SAVEPOINT registry_status');
    out.database = { error: sqlError(e) };
  }
  return out;
}

async function locks(client) {
  // The fence token is left out: the page has no use for it.
  const { rows } = await client.query(
    `SELECT name, owner::text AS owner, holder, holder_pid, granted_at, expires_at, session, waiters
       FROM throttle.locks ORDER BY name LIMIT ${LIMITS.locks}`);
  return { rows, limit: LIMITS.locks };
}

const SECTIONS = { queues, pauses, groups, dead, pending, recurring, registry, locks };

function sqlError(e) {
  const out = { code: e.code, message: e.message };
  if (e.hint) out.hint = e.hint;
  return out;
}

// Whether an error came from the server as an SQL error (so the session is
// usable after a rollback), rather than from a lost connection.
function isSqlError(e) {
  return typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code) && !/^(08|57P)/.test(e.code);
}

// Reads `names` (sections) in one read-only REPEATABLE READ transaction, so
// that the numbers of one answer come from one snapshot; a section the role
// may not read answers {error: {code, message}} and the others still read.
async function read(pool, names, state) {
  const client = await pool.connect();
  let broken = null;
  try {
    await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    const out = { taken_at: new Date().toISOString() };
    out.permissions = await permissions(client);
    const ctx = { eventSource: out.permissions.event_source, rates: state.rates, clock: state.clock };
    for (const name of names) {
      await client.query('SAVEPOINT section');
      try {
        out[name] = await SECTIONS[name](client, ctx);
        await client.query('RELEASE SAVEPOINT section');
      } catch (e) {
        if (!isSqlError(e)) throw e;
        await client.query('ROLLBACK TO SAVEPOINT section');
        out[name] = { error: sqlError(e) };
      }
    }
    await client.query('COMMIT');
    return out;
  } catch (e) {
    broken = e;
    throw e;
  } finally {
    // A client whose transaction failed is dropped rather than reused.
    client.release(broken || undefined);
  }
}

module.exports = { SECTIONS, ACTIONS, LIMITS, DEAD_SQL, read, permissions, sqlError, isSqlError };
