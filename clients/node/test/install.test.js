'use strict';
// The install command the README gives works on a fresh clone: `npm install <path>` alone makes
// a symlink (npm's install-links is false by default), and require('pg-throttle') then
// resolves pg from the clone, where it is not installed.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');

const ROOT = path.join(__dirname, '..');

// The README's install line from a path: ["npm", "install", ..., "/path/to/.../clients/node"].
function readmeCommand() {
  const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const line = readme.split('\n').find((l) => /^npm install .*clients\/node\b/.test(l));
  assert.ok(line, 'the README gives an npm install command from a path');
  return line.replace(/#.*$/, '').trim().split(/\s+/);
}

test('the README\'s `npm install <repo>/clients/node`, on a fresh clone: require(\'pg-throttle\') finds pg', (t) => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-throttle-install.'));
  t.after(() => fs.rmSync(tmp, { recursive: true, force: true }));
  // What a fresh clone has: the package's files, no node_modules.
  const src = path.join(tmp, 'pg_throttle', 'clients', 'node');
  fs.mkdirSync(src, { recursive: true });
  for (const f of ['package.json', 'package-lock.json', 'index.js', 'index.d.ts', 'README.md']) {
    fs.copyFileSync(path.join(ROOT, f), path.join(src, f));
  }
  fs.cpSync(path.join(ROOT, 'lib'), path.join(src, 'lib'), { recursive: true });
  const app = path.join(tmp, 'app');
  fs.mkdirSync(app);
  fs.writeFileSync(path.join(app, 'package.json'), '{"name":"app","version":"1.0.0","private":true}');
  const [npm, ...args] = readmeCommand();
  assert.strictEqual(npm, 'npm');
  const target = args.pop();
  assert.match(target, /clients\/node$/);
  const run = spawnSync('npm', [...args, '--prefer-offline', '--no-audit', '--no-fund', src],
                        { cwd: app, encoding: 'utf8', timeout: 120000 });
  assert.strictEqual(run.status, 0, run.stdout + run.stderr);
  const r = spawnSync(process.execPath, ['-e', "console.log(require('pg-throttle').VERSION)"], { cwd: app, encoding: 'utf8' });
  assert.strictEqual(r.stdout.trim(), require('../package.json').version, r.stderr);
});
