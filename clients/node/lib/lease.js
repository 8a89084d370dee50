'use strict';
// withLease: runs a function while holding a pg_throttle lease (throttle.lock with a ttl),
// renews the lease every ttl/3 while it runs, and unlocks it at the end.
//
// The function gets { fence, token, signal }: `fence` (= `token`, a bigint as a string) is the
// lock's fence token, greater than every token handed out before, to pass to whatever the work
// writes so that a stale holder's writes can be refused; `signal` aborts when the lease may be
// lost (a renewal failed, or none answered within the ttl of the last one that did, reckoned
// from when that one was sent), and the function should stop then.
//
// The renewals need a connection the function is not busy on. Given a Pool, each of the lock,
// renewal and unlock calls takes any free connection of it (keep one spare for them: a
// renewal waiting for a connection is as late as one behind a long query). Given a Client, they
// share it with whatever the function runs there: a long query of the function's on the same
// Client delays the renewals behind it, and the local deadline then aborts the signal. So give
// it a Pool, or a Client the function does not use.

const { ensureVersion } = require('./version');
const { seconds, timerMs, Deadline, leaseMarginMs } = require('./util');

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
  const lockSentAt = performance.now();
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

  const ttlMs = ttlS * 1000;
  const marginMs = leaseMarginMs(ttlS);
  const renew = () => db.query('SELECT throttle.renew($1, $2::bigint, make_interval(secs => $3)) AS ok',
                               [name, token, ttlS]);
  // The lease runs from when the lock was granted, which is known to be no earlier than when
  // it was sent; after a wait, a renewal at once tells more.
  let leaseFrom = lockSentAt;
  if (performance.now() - lockSentAt > (ttlMs - marginMs) / 3) {
    const renewSentAt = performance.now();
    let ok = false;
    try {
      ok = (await renew()).rows[0].ok;
    } finally {
      if (!ok) await db.query('SELECT throttle.unlock($1, $2::bigint)', [name, token]).catch(() => {});
    }
    if (!ok) {
      throw leaseError('PG_THROTTLE_LEASE_LOST', `the lease ${JSON.stringify(name)} was lost before fn ` +
                       'ran: the renewal after the wait found the token no longer current');
    }
    leaseFrom = renewSentAt;
  }

  const abort = new AbortController();
  let lost = null;
  let expired;
  const deadlinePassed = new Promise((resolve) => { expired = resolve; });
  function loseIt(why) {
    if (lost) return;
    lost = leaseError('PG_THROTTLE_LEASE_LOST', `the lease ${JSON.stringify(name)} was lost: ${why}`);
    abort.abort(lost);
  }
  // The local deadline: the lease ends, as far as this holder can tell, a ttl after the lock
  // or the last renewal that succeeded was sent; it gives the lease up a margin before.
  const deadline = new Deadline(leaseFrom + ttlMs - marginMs, () => {
    loseIt(`no renewal answered within the ttl of ${ttlS} s`);
    expired();
  });
  let renewing = null;
  const timer = setInterval(() => {
    if (lost || renewing) return;
    const sentAt = performance.now();
    renewing = renew()
      .then(({ rows: r }) => {
        if (!r[0].ok) loseIt('renew found the token no longer current');
        else deadline.extendTo(sentAt + ttlMs - marginMs);
      }, (err) => loseIt(`renew failed: ${err.message}`))
      .finally(() => { renewing = null; });
  }, timerMs(ttlMs / 3));

  let result;
  let error = null;
  try {
    result = await fn({ fence: token, token, signal: abort.signal });
  } catch (err) {
    error = err;
  } finally {
    clearInterval(timer);
    // A renewal that never answers (a stalled connection) is not waited for past the deadline.
    if (renewing) await Promise.race([renewing, deadlinePassed]);
    deadline.clear();
  }
  // Unlocked also after a loss (a stale token unlocks nothing: harmless), since a renewal
  // that failed once (a dropped connection) may have left the lease held; its error then
  // does not matter. Not waited for beyond the ttl: by then the lease ended anyway.
  const unlocked = db.query('SELECT throttle.unlock($1, $2::bigint)', [name, token]);
  let unlockTimer;
  const unlockOutcome = await Promise.race([
    unlocked.then(() => null, (err) => err),
    new Promise((resolve) => { unlockTimer = setTimeout(() => resolve('timeout'), timerMs(ttlMs)); }),
  ]);
  clearTimeout(unlockTimer);
  if (unlockOutcome !== null && unlockOutcome !== 'timeout' && !lost && error === null) {
    error = unlockOutcome;   // the lease ends with its ttl anyway
  }
  if (lost) {
    if (error !== null && error !== lost) lost.cause = error;
    throw lost;
  }
  if (error !== null) throw error;
  return result;
}

module.exports = { withLease };
