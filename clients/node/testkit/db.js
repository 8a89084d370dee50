'use strict';
// Shared by the tests (outside test/, which node --test runs file by file). They connect with
// the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE); the role is a superuser.

const crypto = require('node:crypto');
const { Client } = require('pg');

// A name no earlier run has used: tests re-run in the same database.
function unique(prefix) {
  return `${prefix}.${process.pid}.${crypto.randomBytes(4).toString('hex')}`;
}

async function connect(config = {}) {
  const client = new Client({ application_name: 'pg-throttle tests', ...config });
  await client.connect();
  client.on('error', () => {});   // a session ended by a test: its queries reject
  return client;
}

// Polls fn until it returns something truthy; its value, or null after timeoutMs.
async function waitFor(fn, timeoutMs = 10000, stepMs = 50) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) return null;
    await new Promise((r) => setTimeout(r, stepMs));
  }
}

async function rows(db, sql, params) {
  return (await db.query(sql, params)).rows;
}

async function one(db, sql, params) {
  return (await db.query(sql, params)).rows[0];
}

module.exports = { unique, connect, waitFor, rows, one };
