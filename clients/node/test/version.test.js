'use strict';
const test = require('node:test');
const assert = require('node:assert');
const { SUPPORTED, VERSION, checkVersion, ensureVersion, schedule, Worker } = require('..');
const { connect, unique } = require('../testkit/db');

test('the client supports the extension version it ships with', () => {
  assert.deepStrictEqual(SUPPORTED, ['0.4.0']);
  assert.strictEqual(VERSION, '0.4.0');
});

test('checkVersion returns the installed version', async (t) => {
  const db = await connect();
  t.after(() => db.end());
  assert.strictEqual(await checkVersion(db), '0.4.0');
  assert.strictEqual(await ensureVersion(db), '0.4.0');
});

test('an unsupported version is a clear error with code PG_THROTTLE_VERSION', async () => {
  const fake = { query: async () => ({ rows: [{ extversion: '0.3.0' }] }) };
  await assert.rejects(checkVersion(fake), (err) => {
    assert.strictEqual(err.code, 'PG_THROTTLE_VERSION');
    assert.strictEqual(err.found, '0.3.0');
    assert.match(err.message, /pg_throttle 0\.3\.0 is installed.*supports 0\.4\.0/);
    return true;
  });
});

test('a database without the extension: every entry point fails with PG_THROTTLE_VERSION', async (t) => {
  const admin = await connect();
  const dbname = unique('pgt_noext').replace(/\./g, '_');
  await admin.query(`CREATE DATABASE ${dbname}`);
  t.after(async () => {
    await admin.query(`DROP DATABASE IF EXISTS ${dbname} WITH (FORCE)`);
    await admin.end();
  });
  const db = await connect({ database: dbname });
  const notInstalled = (err) => {
    assert.strictEqual(err.code, 'PG_THROTTLE_VERSION');
    assert.strictEqual(err.found, null);
    assert.match(err.message, /pg_throttle is not installed in this database: run CREATE EXTENSION pg_throttle/);
    return true;
  };
  try {
    await assert.rejects(checkVersion(db), notInstalled);
    await assert.rejects(schedule(db, 'q', 'k'), notInstalled);
    // A failed check is not cached: it runs again once the extension is there.
    await db.query('CREATE EXTENSION pg_throttle');
    assert.strictEqual(await ensureVersion(db), '0.4.0');
    await db.query('DROP EXTENSION pg_throttle');
    // A real older version (0.1.0 updated to 0.3.0): a clear error naming it.
    await db.query("CREATE EXTENSION pg_throttle VERSION '0.3.0'");
    await assert.rejects(checkVersion(db), (err) => {
      assert.strictEqual(err.code, 'PG_THROTTLE_VERSION');
      assert.strictEqual(err.found, '0.3.0');
      assert.match(err.message, /pg_throttle 0\.3\.0 is installed, but this client \(pg-throttle 0\.4\.0\) supports 0\.4\.0/);
      return true;
    });
    await db.query('DROP EXTENSION pg_throttle');
  } finally {
    await db.end();
  }
  const worker = new Worker({ queue: 'q', handler: async () => {}, connection: { database: dbname } });
  await assert.rejects(worker.start(), notInstalled);
});
