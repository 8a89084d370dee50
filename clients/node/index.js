'use strict';
// pg-throttle: the Node.js client of the pg_throttle PostgreSQL extension.

const { SUPPORTED, checkVersion, ensureVersion } = require('./lib/version');
const { Worker } = require('./lib/worker');
const { schedule, scheduleMany, cancel, reschedule } = require('./lib/queue');
const { withLease } = require('./lib/lease');
const { take, rateLimit, withRateLimit, defaultKey } = require('./lib/ratelimit');

module.exports = {
  VERSION: require('./package.json').version,
  SUPPORTED,
  checkVersion,
  ensureVersion,
  Worker,
  schedule,
  scheduleMany,
  cancel,
  reschedule,
  withLease,
  take,
  rateLimit,
  withRateLimit,
  defaultKey,
};
