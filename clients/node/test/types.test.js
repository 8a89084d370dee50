'use strict';
// index.d.ts fits its uses: testkit/types-check.ts compiles under tsc --strict (typescript is a
// devDependency; npm ci installs it).
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
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

test('a TypeScript consumer without @types/pg compiles: index.d.ts needs no types from \'pg\'', { skip: !fs.existsSync(tsc) && 'typescript not installed (npm ci)' }, (t) => {
  const app = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-throttle-ts.'));
  t.after(() => fs.rmSync(app, { recursive: true, force: true }));
  // What `npm install pg-throttle` brings (the package, pg and its dependencies) and what a
  // TypeScript project has (@types/node); not @types/pg, a devDependency of this package only.
  const nm = path.join(app, 'node_modules');
  const pkg = path.join(nm, 'pg-throttle');
  fs.mkdirSync(pkg, { recursive: true });
  for (const f of ['package.json', 'index.js', 'index.d.ts']) fs.copyFileSync(path.join(root, f), path.join(pkg, f));
  fs.cpSync(path.join(root, 'lib'), path.join(pkg, 'lib'), { recursive: true });
  fs.symlinkSync(path.join(root, 'node_modules', 'pg'), path.join(nm, 'pg'));
  fs.mkdirSync(path.join(nm, '@types'));
  fs.symlinkSync(path.join(root, 'node_modules', '@types', 'node'), path.join(nm, '@types', 'node'));
  const undici = path.join(root, 'node_modules', 'undici-types');
  if (fs.existsSync(undici)) fs.symlinkSync(undici, path.join(nm, 'undici-types'));
  fs.writeFileSync(path.join(app, 'app.ts'), [
    "import { Worker, withLease, schedule, Queryable } from 'pg-throttle';",
    "const w = new Worker({ queue: 'q', connection: { host: '/tmp', keepAlive: true }, queryTimeout: 5, abortGrace: 1,",
    '  handler: async (e, { signal }) => { signal.throwIfAborted(); console.log(e.id); } });',
    "const db: Queryable = { query: async () => ({ rows: [{ token: '1' }] }) };",
    "void withLease(db, 'l', 5, async ({ fence }) => fence.length);",
    "void schedule(db, 'q', 'k');",
    'void w;',
  ].join('\n'));
  const r = spawnSync(process.execPath, [tsc, '--noEmit', '--strict', '--module', 'commonjs', '--target', 'es2022',
                                         '--types', 'node', 'app.ts'], { cwd: app, encoding: 'utf8', timeout: 60000 });
  assert.strictEqual(r.status, 0, r.stdout + r.stderr);
});
