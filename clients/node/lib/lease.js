'use strict';
// withLease: runs a function while holding a pg_throttle lease (throttle.lock with a ttl),
// renews the lease every ttl/3 while it runs, and unlocks it at the end.
//
// The function gets { fence, token, signal }: `fence` (= `token`, a bigint as a string) is the
// lock's fence token, greater than every token handed out before, to pass to whatever the work
// writes so that a stale holder's writes can be refused; `signal` aborts when a renewal fails
// (the lease expired and another holder may have it), and the function should stop then.

const { ensureVersion } = require('./version');
const { seconds } = require('./util');

function leaseError(code, message) {
  const err = new Error(message);
  err.code = code;
  return err;
}

// db: a pg Client or Pool. ttl and options.wait in seconds; options.wait: how long to wait
// for the lock (0, the default: try once; null or Infinity: no limit); options.holder: the
// name throttle.locks shows. Resolves with fn's result. Rejects with code
// 'PG_THROTTLE_LOCK_BUSY' when the lock was not had within `wait` (fn not run), and with code
// 'PG_THROTTLE_LEASE_LOST' (the function's own error as `cause`) when the lease was lost while
// fn ran, whatever fn returned: its work was not exclusive.
async function withLease(db, name, ttl, fn, options = {}) {
  const ttlS = seconds(ttl, 'ttl', { positive: true });
  const { wait = 0, holder = null } = options;
  const waitS = wait === null || wait === Infinity ? null : seconds(wait, 'wait');
  if (typeof fn !== 'function') throw new TypeError('fn must be a function');
  await ensureVersion(db);
  const { rows } = await db.query(
    'SELECT throttle.lock($1, ttl => make_interval(secs => $2), ' +
    'wait => make_interval(secs => $3), holder => $4) AS token',
    [name, ttlS, waitS, holder]);
  const token = rows[0].token;
  if (token === null) {
    throw leaseError('PG_THROTTLE_LOCK_BUSY',
      `the lock ${JSON.stringify(name)} is held by another holder` +
      (waitS ? ` (waited ${waitS} s)` : ''));
  }

  const abort = new AbortController();
  let lost = null;
  function loseIt(why) {
    if (lost) return;
    lost = leaseError('PG_THROTTLE_LEASE_LOST', `the lease ${JSON.stringify(name)} was lost: ${why}`);
    abort.abort(lost);
  }
  let renewing = null;
  const timer = setInterval(() => {
    if (lost || renewing) return;
    renewing = db.query('SELECT throttle.renew($1, $2::bigint, make_interval(secs => $3)) AS ok',
                        [name, token, ttlS])
      .then(({ rows: r }) => { if (!r[0].ok) loseIt('renew found the token no longer current'); },
            (err) => loseIt(`renew failed: ${err.message}`))
      .finally(() => { renewing = null; });
  }, (ttlS * 1000) / 3);

  let result;
  let error = null;
  try {
    result = await fn({ fence: token, token, signal: abort.signal });
  } catch (err) {
    error = err;
  } finally {
    clearInterval(timer);
    if (renewing) await renewing;
  }
  if (!lost) {
    try {
      await db.query('SELECT throttle.unlock($1, $2::bigint)', [name, token]);
    } catch (err) {
      if (error === null) error = err;   // the lease ends with its ttl anyway
    }
  }
  if (lost) {
    if (error !== null && error !== lost) lost.cause = error;
    throw lost;
  }
  if (error !== null) throw error;
  return result;
}

module.exports = { withLease };
