'use strict';
// The actions: each is one call of pg_throttle's SQL, as the connected role.
// The dashboard checks nothing the SQL checks: a role without EXECUTE gets the
// server's 42501, answered 403 with its message.
const { isSqlError } = require('./queries');

const MAX_BIGINT = 9223372036854775807n;

class BadRequest extends Error {
  constructor(message, status = 400) {
    super(message);
    this.status = status;
  }
}

function quote(s) {
  return `'${String(s).replace(/'/g, "''")}'`;
}

function bytes(s) {
  return Buffer.byteLength(s, 'utf8');
}

function eventId(body) {
  const id = body.id;
  const text = typeof id === 'number' && Number.isSafeInteger(id) ? String(id) : id;
  if (typeof text !== 'string' || !/^[0-9]{1,19}$/.test(text) || BigInt(text) > MAX_BIGINT) {
    throw new BadRequest('"id" must be an event id: a positive integer, as a string or a number');
  }
  return text;
}

function text(body, field, { max, optional = false } = {}) {
  const v = body[field];
  if (v === undefined || v === null) {
    if (optional) return null;
    throw new BadRequest(`"${field}" is required`);
  }
  if (typeof v !== 'string') throw new BadRequest(`"${field}" must be a string`);
  if (v.includes('\u0000')) throw new BadRequest(`"${field}" must not contain NUL characters`);
  if (max && bytes(v) > max) throw new BadRequest(`"${field}" is longer than ${max} bytes`);
  return v;
}

// `pool`: anything with connect() handing out node-postgres clients.
// Runs fn(client, notices) on a client of its own, collecting the NOTICEs
// the statements raise (the reason pg_throttle gives when cancel, pause or
// resume change nothing); a client whose connection broke is discarded.
async function withClient(pool, fn) {
  const client = await pool.connect();
  const notices = [];
  const onNotice = (n) => notices.push(n.message + (n.hint ? ` (${n.hint})` : ''));
  client.on('notice', onNotice);
  let broken;
  try {
    return await fn(client, notices);
  } catch (e) {
    if (!isSqlError(e)) broken = e;
    throw e;
  } finally {
    client.removeListener('notice', onNotice);
    client.release(broken);
  }
}

// One statement: its rows and the NOTICEs it raised.
function call(pool, sql, params) {
  return withClient(pool, async (client, notices) => {
    const { rows } = await client.query(sql, params);
    return { rows, notices };
  });
}

const ACTIONS = {
  // throttle.retry(bigint): true when the dead event is pending again.
  async retry(pool, body) {
    const id = eventId(body);
    const { rows } = await call(pool, 'SELECT throttle.retry($1::bigint) AS retried', [id]);
    if (rows[0].retried) return { status: 200, body: { ok: true, message: `event ${id} is pending again, due now` } };
    // Why not: the state as throttle.all_events shows it to this role.
    let state;
    try {
      ({ rows: [state] } = await call(pool, 'SELECT state FROM throttle.all_events WHERE id = $1::bigint', [id]));
    } catch (e) {
      if (!isSqlError(e)) throw e;
      return { status: 409, body: { ok: false, error: `event ${id} was not retried` } };
    }
    if (!state) return { status: 404, body: { ok: false, error: `no event ${id}` } };
    if (state.state !== 'dead') {
      return { status: 409, body: { ok: false, error: `event ${id} is ${state.state}, not dead` } };
    }
    return { status: 409, body: { ok: false, error: `event ${id} was not retried: its item_key has a newer run, pending or claimed` } };
  },

  // throttle.cancel(queue, item_key), for the event the page's row shows: the
  // id it sends must be the key's pending event, or nothing is cancelled
  // (409): a stale row never cancels a newer run of the same key. One
  // REPEATABLE READ transaction: cancel acts on the rows of the snapshot the
  // check read, where the key's pending event is that id (event_pending_key
  // allows one); if that event changed since, the database refuses (40001).
  async cancel(pool, body) {
    const id = eventId(body);
    const queue = text(body, 'queue', { max: 63, optional: true });
    const itemKey = text(body, 'item_key', { optional: true });
    return withClient(pool, async (client, notices) => {
      try {
        await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
        const { rows: [event] } = await client.query(
          'SELECT queue, item_key, state, claimed_by FROM throttle.all_events WHERE id = $1::bigint', [id]);
        let refusal = null;
        if (!event) refusal = { status: 404, error: `no event ${id}` };
        else if ((queue !== null && queue !== event.queue) || (itemKey !== null && itemKey !== event.item_key)) {
          refusal = { status: 409, error: `event ${id} is not ${JSON.stringify(itemKey)} of queue ${JSON.stringify(queue)}` };
        } else if (event.state !== 'pending') {
          const by = event.state === 'claimed' && event.claimed_by !== null ? ` by ${quote(event.claimed_by)}` : '';
          refusal = { status: 409, error: `event ${id} is ${event.state}${by}, not pending: nothing was cancelled (reload the page)` };
        }
        if (refusal) {
          await client.query('ROLLBACK');
          return { status: refusal.status, body: { ok: false, error: refusal.error } };
        }
        const { rows } = await client.query('SELECT throttle.cancel($1, $2) AS cancelled', [event.queue, event.item_key]);
        await client.query('COMMIT');
        if (rows[0].cancelled) return { status: 200, body: { ok: true, message: `event ${id} is cancelled` } };
        return { status: 409, body: { ok: false, error: notices.join('\n') || 'nothing was cancelled' } };
      } catch (e) {
        await client.query('ROLLBACK').catch(() => {});
        if (e.code === '40001') {
          return { status: 409, body: { ok: false, error: `event ${id} changed meanwhile (claimed, done or cancelled): nothing was cancelled (reload the page)` } };
        }
        throw e;
      }
    });
  },

  async pause(pool, body) {
    return pauseOrResume(pool, body, 'pause');
  },

  async resume(pool, body) {
    return pauseOrResume(pool, body, 'resume');
  },
};

async function pauseOrResume(pool, body, fn) {
  const queue = text(body, 'queue', { max: 63 });
  const groupKey = text(body, 'group_key', { max: 1024, optional: true });
  const { rows, notices } = await call(pool, `SELECT throttle.${fn}($1, $2) AS changed`, [queue, groupKey]);
  const what = groupKey === null ? `queue ${JSON.stringify(queue)}` : `group ${JSON.stringify(groupKey)} of queue ${JSON.stringify(queue)}`;
  if (rows[0].changed) {
    return { status: 200, body: { ok: true, message: `${what} is ${fn === 'pause' ? 'paused' : 'resumed'}` } };
  }
  return { status: 409, body: { ok: false, error: notices.join('\n') || `${what} was not changed` } };
}

// SQLSTATE classes the page can act on, as HTTP statuses.
function statusForSql(code) {
  if (code === '42501') return 403; // no privilege
  if (/^22/.test(code) || code === '23514') return 400; // bad argument
  if (code === '25006') return 503; // a hot standby
  if (code === '40001' || code === '40P01' || code === '55P03' || code === '57014') return 503; // retry
  return 500;
}

async function runAction(pool, name, body) {
  const action = Object.prototype.hasOwnProperty.call(ACTIONS, name) ? ACTIONS[name] : null;
  if (!action) return { status: 404, body: { ok: false, error: `no action "${name}"` } };
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    return { status: 400, body: { ok: false, error: 'the body must be a JSON object' } };
  }
  try {
    return await action(pool, body);
  } catch (e) {
    if (e instanceof BadRequest) return { status: e.status, body: { ok: false, error: e.message } };
    if (isSqlError(e)) {
      return { status: statusForSql(e.code), body: { ok: false, error: e.message, code: e.code, ...(e.hint ? { hint: e.hint } : {}) } };
    }
    throw e;
  }
}

module.exports = { runAction, statusForSql, ACTION_NAMES: Object.keys(ACTIONS) };
