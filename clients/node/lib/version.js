'use strict';
// The extension versions this client speaks, and the check each entry point makes on its
// first use of a connection or pool: the server's pg_throttle must be one of them.

const SUPPORTED = Object.freeze(['0.4.0']);

const checked = new WeakMap();   // a Client or Pool -> the promise of its check

function versionError(message, found) {
  const err = new Error(message);
  err.code = 'PG_THROTTLE_VERSION';
  err.found = found;             // the installed version, or null when not installed
  err.supported = SUPPORTED.slice();
  return err;
}

// The installed version of pg_throttle in the database `db` (a pg Client or Pool) talks to;
// throws an Error with code 'PG_THROTTLE_VERSION' when the extension is not installed there
// or its version is not one this client supports.
async function checkVersion(db) {
  const { rows } = await db.query(
    "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_throttle'");
  if (rows.length === 0) {
    throw versionError(
      'pg_throttle is not installed in this database: run CREATE EXTENSION pg_throttle ' +
      `(this client supports version ${SUPPORTED.join(', ')})`, null);
  }
  const found = rows[0].extversion;
  if (!SUPPORTED.includes(found)) {
    throw versionError(
      `pg_throttle ${found} is installed, but this client (pg-throttle ` +
      `${require('../package.json').version}) supports ${SUPPORTED.join(', ')}: ` +
      'install the client version that matches the extension, or ALTER EXTENSION pg_throttle UPDATE',
      found);
  }
  return found;
}

// checkVersion once per Client or Pool: a check that failed (or could not connect) runs
// again on the next use.
function ensureVersion(db) {
  let p = checked.get(db);
  if (!p) {
    p = checkVersion(db);
    checked.set(db, p);
    p.catch(() => { if (checked.get(db) === p) checked.delete(db); });
  }
  return p;
}

module.exports = { SUPPORTED, checkVersion, ensureVersion };
