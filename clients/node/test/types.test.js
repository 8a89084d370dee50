'use strict';
// index.d.ts fits its uses: testkit/types-check.ts compiles under tsc --strict (typescript is a
// devDependency; npm ci installs it).
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const root = path.join(__dirname, '..');
const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc');

test('the type declarations compile against a program that uses every export', { skip: !fs.existsSync(tsc) && 'typescript not installed (npm ci)' }, () => {
  const pkg = require('../package.json');
  const args = pkg.scripts.typecheck.split(' ').slice(1);
  const run = spawnSync(process.execPath, [tsc, ...args], { cwd: root, encoding: 'utf8' });
  assert.strictEqual(run.status, 0, run.stdout + run.stderr);
});

test('index.d.ts declares every export of index.js', () => {
  const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8');
  const missing = Object.keys(require('..')).filter(
    (name) => !new RegExp(`export (const|function|class) ${name}\\b`).test(dts));
  assert.deepStrictEqual(missing, []);
});
