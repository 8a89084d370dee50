'use strict';
// The extension versions this dashboard reads: its SQL names the views' and
// functions' columns as these versions define them.
const SUPPORTED = ['0.4.0'];

class VersionError extends Error {
  constructor(message, code, found) {
    super(message);
    this.name = 'VersionError';
    this.code = code; // 'PG_THROTTLE_MISSING' or 'PG_THROTTLE_VERSION'
    this.found = found;
  }
}

// Reads the installed version of pg_throttle in the connected database and
// throws a VersionError when it is missing or not one of `supported`.
async function checkVersion(queryable, supported = SUPPORTED) {
  const { rows } = await queryable.query(
    "SELECT current_database() AS db, (SELECT extversion FROM pg_extension WHERE extname = 'pg_throttle') AS v");
  const { db, v } = rows[0];
  if (v === null) {
    throw new VersionError(
      `pg_throttle is not installed in database "${db}" (CREATE EXTENSION pg_throttle; as a superuser)`,
      'PG_THROTTLE_MISSING', null);
  }
  if (!supported.includes(v)) {
    throw new VersionError(
      `pg_throttle ${v} is installed in database "${db}"; this dashboard supports ${supported.join(', ')}` +
      ' (install the dashboard of the same version as the extension)',
      'PG_THROTTLE_VERSION', v);
  }
  return v;
}

module.exports = { SUPPORTED, VersionError, checkVersion };
