'use strict';
// The dashboard's page: reads /api/overview every few seconds and draws it with
// DOM nodes; every value from the database goes in as text (textContent,
// setAttribute), never as HTML. Actions POST JSON with the CSRF token the
// server set in a SameSite=Strict cookie.
(function () {
  const REFRESH_MS = 5000;
  let loading = false;
  let renders = 0;
  let csrfCookie = null; // the server names it in each overview

  // ---- DOM helpers ----
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'onclick') node.addEventListener('click', value);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function replace(sectionId, ...nodes) {
    const body = document.querySelector(`#${sectionId} .body`);
    body.replaceChildren(...nodes.filter((n) => n));
  }

  // columns: [{key, label, value(row) -> text|Node, num}]; attrs(row) -> tr's attributes.
  function table(columns, rows, attrs) {
    const head = el('tr', {}, ...columns.map((c) => el('th', { scope: 'col', class: c.num ? 'num' : null }, c.label)));
    const body = rows.map((row) => el('tr', attrs ? attrs(row) : {},
      ...columns.map((c) => {
        const v = c.value ? c.value(row) : row[c.key];
        const raw = row[c.key];
        return el('td', {
          'data-col': c.key,
          'data-value': raw !== undefined && raw !== null && typeof raw !== 'object' ? String(raw) : null,
          class: c.num ? 'num' : null,
        }, v === null || v === undefined ? '—' : v);
      })));
    return el('table', {}, el('thead', {}, head), el('tbody', {}, ...body));
  }

  function note(text, kind) {
    return el('p', { class: kind || 'note' }, text);
  }

  // What happened, by SQLSTATE: a privilege the role lacks, the statement
  // timeout, or the database's message.
  function sectionError(section, role) {
    const e = section.error;
    let text;
    if (e.code === '42501') text = `Role ${role} may not read this: ${e.message}`;
    else if (e.code === '57014') text = `Reading this took longer than the statement timeout: ${e.message}`;
    else text = `Could not read this: ${e.message}`;
    return note(`${text} (SQLSTATE ${e.code})`, 'error');
  }

  // A note when a list was cut at the server's limit.
  function cut(s, text) {
    return s.limit && s.rows.length >= s.limit ? note(text || `The first ${s.limit} shown; there may be more.`, 'note cut') : null;
  }

  // ---- formats ----
  function time(iso) {
    if (!iso) return null;
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return el('time', { datetime: d.toISOString(), title: relative(d) },
      `${d.toISOString().slice(0, 19).replace('T', ' ')}Z`);
  }

  function relative(d) {
    const s = (d.getTime() - Date.now()) / 1000;
    return s >= 0 ? `in ${seconds(s)}` : `${seconds(-s)} ago`;
  }

  function seconds(s) {
    if (s === null || s === undefined) return null;
    const n = Math.floor(Number(s));
    if (n < 60) return `${n} s`;
    if (n < 3600) return `${Math.floor(n / 60)} min ${n % 60} s`;
    if (n < 86400) return `${Math.floor(n / 3600)} h ${Math.floor((n % 3600) / 60)} min`;
    return `${Math.floor(n / 86400)} d ${Math.floor((n % 86400) / 3600)} h`;
  }

  function rate(x) {
    return x === null || x === undefined ? '—' : `${x < 10 ? x.toFixed(2) : x.toFixed(0)}/s`;
  }

  function bar(part, whole) {
    const pct = whole ? Math.min(100, (100 * part) / whole) : 0;
    const meter = el('meter', { min: 0, max: 100, value: pct.toFixed(2), title: `${pct.toFixed(2)} %` });
    return el('span', { class: 'bar' }, meter, ` ${pct < 1 && pct > 0 ? pct.toFixed(2) : pct.toFixed(0)} %`);
  }

  // ---- actions ----
  function csrfToken() {
    const name = csrfCookie || `pgtd_csrf_${window.location.port || '80'}`;
    for (const part of document.cookie.split(';')) {
      const i = part.indexOf('=');
      if (i > 0 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim();
    }
    return '';
  }

  function setStatus(text, kind) {
    const status = document.getElementById('status');
    status.textContent = text;
    status.setAttribute('data-kind', kind || 'info');
  }

  async function act(name, body, question) {
    if (question && !window.confirm(question)) return;
    setStatus(`${name}…`, 'info');
    let res;
    let data = {};
    try {
      res = await fetch(`/api/actions/${name}`, {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrfToken() },
        body: JSON.stringify(body),
      });
      data = await res.json().catch(() => ({}));
    } catch (e) {
      setStatus(`${name} failed: ${e.message}`, 'error');
      return;
    }
    if (res.ok) setStatus(data.message || `${name}: done`, 'ok');
    else setStatus(`${name} refused (HTTP ${res.status}): ${data.error || res.statusText}`, 'error');
    await refresh();
  }

  function button(label, onclick, attrs) {
    return el('button', { type: 'button', onclick, ...attrs }, label);
  }

  // ---- sections ----
  function drawQueues(data, can, role) {
    const s = data.queues;
    if (s.error) return replace('queues', sectionError(s, role));
    if (s.rows.length === 0) return replace('queues', note('No queue has events or a pause.'));
    const columns = [
      { key: 'queue', label: 'queue' },
      { key: 'due', label: 'due', num: true },
      { key: 'scheduled', label: 'scheduled', num: true },
      { key: 'claimed', label: 'claimed', num: true },
      { key: 'claims_expired', label: 'claims expired', num: true },
      { key: 'dead', label: 'dead', num: true },
      { key: 'oldest_due_seconds', label: 'oldest due', num: true, value: (r) => seconds(r.oldest_due_seconds) },
      {
        key: 'paused',
        label: 'paused',
        value: (r) => (r.paused ? 'paused' : 'no') + (r.paused_groups ? `, ${r.paused_groups} group${r.paused_groups > 1 ? 's' : ''}` : ''),
      },
    ];
    if (can.pause || can.resume) {
      columns.push({
        key: 'action',
        label: '',
        value: (r) => {
          if (r.paused && can.resume) {
            return button('Resume', () => act('resume', { queue: r.queue }), { 'data-action': 'resume' });
          }
          if (!r.paused && can.pause) {
            return button('Pause', () => act('pause', { queue: r.queue },
              `Pause queue "${r.queue}"? Claims hand out none of its events until it is resumed.`), { 'data-action': 'pause' });
          }
          return '';
        },
      });
    }
    return replace('queues', table(columns, s.rows, (r) => ({ 'data-queue': r.queue, class: r.paused ? 'paused' : null })),
      cut(s, `The first ${s.limit} queues by name shown; there may be more.`));
  }

  function drawPauses(data, can, role) {
    const s = data.pauses;
    if (s.error) return replace('pauses', sectionError(s, role));
    if (s.rows.length === 0) return replace('pauses', note('Nothing is paused.'));
    const columns = [
      { key: 'queue', label: 'queue' },
      { key: 'group_key', label: 'group', value: (r) => (r.group_key === null ? 'the whole queue' : r.group_key) },
      { key: 'paused_at', label: 'paused at', value: (r) => time(r.paused_at) },
      { key: 'paused_by', label: 'by' },
    ];
    if (can.resume) {
      columns.push({
        key: 'action',
        label: '',
        value: (r) => button('Resume', () => act('resume', { queue: r.queue, group_key: r.group_key }), { 'data-action': 'resume' }),
      });
    }
    return replace('pauses', table(columns, s.rows, (r) => ({ 'data-queue': r.queue, 'data-group': r.group_key })), cut(s));
  }

  function drawGroups(data, can, role) {
    const s = data.groups;
    if (s.error) return replace('groups', sectionError(s, role));
    if (s.rows.length === 0) return replace('groups', note('No group is claimed.'));
    const columns = [
      { key: 'queue', label: 'queue' },
      { key: 'group_key', label: 'group' },
      { key: 'claimed_by', label: 'worker' },
      { key: 'claimed_role', label: 'role' },
      { key: 'events', label: 'events', num: true },
      { key: 'claimed_at', label: 'claimed at', value: (r) => time(r.claimed_at) },
      { key: 'lease_until', label: 'lease until', value: (r) => time(r.lease_until) },
      { key: 'lease_ended', label: 'lease', value: (r) => (r.lease_ended ? 'ended: the next claim takes it over' : 'in force') },
    ];
    return replace('groups', table(columns, s.rows, (r) => ({
      'data-queue': r.queue, 'data-group': r.group_key, class: r.lease_ended ? 'warn' : null,
    })), cut(s));
  }

  function drawDead(data, can, role) {
    const s = data.dead;
    if (s.error) return replace('dead', sectionError(s, role));
    if (s.rows.length === 0) return replace('dead', note('No dead event.'));
    const columns = [
      { key: 'id', label: 'id', num: true },
      { key: 'queue', label: 'queue' },
      { key: 'item_key', label: 'item key' },
      { key: 'group_key', label: 'group' },
      { key: 'attempts', label: 'attempts', num: true, value: (r) => `${r.attempts}/${r.max_attempts}` },
      { key: 'died_at', label: 'died at', value: (r) => time(r.died_at) },
      { key: 'completed_by', label: 'worker' },
      {
        key: 'last_error',
        label: 'last error',
        value: (r) => el('span', { class: 'error-text' }, r.last_error === null ? '—' : r.last_error + (r.error_truncated ? ' …' : '')),
      },
    ];
    if (can.retry) {
      columns.push({
        key: 'action',
        label: '',
        value: (r) => button('Retry', () => act('retry', { id: r.id }), { 'data-action': 'retry' }),
      });
    }
    const summary = note(s.total > s.rows.length
      ? `${s.total} dead events; the newest ${s.rows.length} shown.` : `${s.total} dead event${s.total > 1 ? 's' : ''}.`);
    return replace('dead', summary, table(columns, s.rows, (r) => ({ 'data-id': r.id, 'data-queue': r.queue })),
      note('A dead event has used up its attempts: Retry makes it pending and due now, its attempts back to 0 ' +
        '(throttle.retry). It is not cancelled: throttle.cancel changes pending events only; ' +
        'throttle.purge(..., states => \'{dead}\') deletes dead events.'));
  }

  function drawPending(data, can, role) {
    const s = data.pending;
    if (s.error) return replace('pending', sectionError(s, role));
    if (s.rows.length === 0) return replace('pending', note('No pending event.'));
    const columns = [
      { key: 'id', label: 'id', num: true },
      { key: 'queue', label: 'queue' },
      { key: 'item_key', label: 'item key' },
      { key: 'group_key', label: 'group' },
      { key: 'run_at', label: 'run at', value: (r) => time(r.run_at) },
      { key: 'due', label: 'state', value: (r) => (r.due ? 'due' : 'scheduled') },
      { key: 'attempts', label: 'attempts', num: true, value: (r) => `${r.attempts}/${r.max_attempts}` },
      { key: 'priority', label: 'priority', num: true },
    ];
    if (can.cancel) {
      columns.push({
        key: 'action',
        label: '',
        // The row's id: the server cancels that event only, never a newer run of its key.
        value: (r) => button('Cancel', () => act('cancel', { id: r.id, queue: r.queue, item_key: r.item_key },
          `Cancel event ${r.id} ("${r.item_key}" in queue "${r.queue}")?`), { 'data-action': 'cancel' }),
      });
    }
    return replace('pending', table(columns, s.rows, (r) => ({ 'data-id': r.id, 'data-queue': r.queue })),
      cut(s, `The ${s.limit} that fall due first shown; the queues' counts are above.`));
  }

  function drawRecurring(data, can, role) {
    const s = data.recurring;
    if (s.error) return replace('recurring', sectionError(s, role));
    if (s.rows.length === 0) return replace('recurring', note('No recurring schedule.'));
    const columns = [
      { key: 'name', label: 'name' },
      { key: 'queue', label: 'queue' },
      { key: 'cron', label: 'cron', value: (r) => el('code', {}, r.cron) },
      { key: 'time_zone', label: 'time zone' },
      { key: 'enabled', label: 'enabled', value: (r) => (r.enabled ? 'yes' : 'no') },
      { key: 'last_firing', label: 'last firing', value: (r) => time(r.last_firing) },
      { key: 'last_outcome', label: 'outcome' },
      {
        key: 'last_event_id',
        label: 'last event',
        value: (r) => (r.last_event_id === null ? null : `${r.last_event_id} (${r.last_event_state || 'purged'})`),
      },
      { key: 'next_firing', label: 'next firing', value: (r) => time(r.next_firing) },
      { key: 'behind_seconds', label: 'behind', num: true, value: (r) => seconds(r.behind_seconds) },
    ];
    return replace('recurring', table(columns, s.rows, (r) => ({
      'data-name': r.name, class: r.behind_seconds > 60 ? 'warn' : null,
    })), cut(s));
  }

  function drawRegistry(data, can, role) {
    const s = data.registry;
    if (s.error) return replace('registry', sectionError(s, role));
    const parts = [];
    parts.push(el('h3', {}, 'Entries per kind, server-wide'));
    if (s.metrics.error) {
      parts.push(sectionError(s.metrics, role),
        note('throttle.registry_metrics sums every database and role: it is granted to pg_read_all_stats (pg_monitor).'));
    } else {
      parts.push(table([
        { key: 'kind', label: 'kind' },
        { key: 'entries', label: 'entries', num: true },
        { key: 'in_force', label: 'in force', num: true },
        { key: 'capacity', label: 'capacity', num: true },
        { key: 'use', label: 'use', value: (r) => bar(r.entries, r.capacity) },
        { key: 'grants_per_second', label: 'grants', num: true, value: (r) => rate(r.grants_per_second) },
        { key: 'denials_per_second', label: 'denials', num: true, value: (r) => rate(r.denials_per_second) },
        { key: 'grants', label: 'grants since start', num: true },
        { key: 'denials', label: 'denials since start', num: true },
        { key: 'waiters', label: 'waiters', num: true },
      ], s.metrics.rows, (r) => ({ 'data-kind': r.kind })));
    }
    parts.push(el('h3', {}, 'Quota use'));
    if (s.usage.error) parts.push(sectionError(s.usage, role));
    else if (s.usage.rows.length === 0) parts.push(note('No role or database this role may see holds entries.'));
    else {
      parts.push(table([
        { key: 'scope', label: 'scope' },
        { key: 'name', label: 'name', value: (r) => (r.name === null ? `(a dropped ${r.scope})` : r.name) },
        { key: 'entries', label: 'entries', num: true },
        { key: 'quota', label: 'quota', num: true, value: (r) => (r.quota === null ? 'none' : r.quota) },
        { key: 'percent_of_quota', label: 'of its quota', value: (r) => (r.quota === null ? '—' : bar(r.entries, r.quota)) },
      ], s.usage.rows, (r) => ({ 'data-scope': r.scope, 'data-name': r.name })));
    }
    parts.push(el('h3', {}, 'This database: entries in force'));
    if (s.database.error) parts.push(sectionError(s.database, role));
    else if (s.database.rows.length === 0) parts.push(note('None.'));
    else {
      parts.push(table([
        { key: 'kind', label: 'kind' },
        { key: 'entries', label: 'entries', num: true },
        { key: 'waiters', label: 'waiters', num: true },
      ], s.database.rows, (r) => ({ 'data-kind': r.kind })));
    }
    const metrics = parts.find((p) => p.tagName === 'TABLE');
    if (metrics && !s.metrics.error) metrics.setAttribute('id', 'registry-metrics');
    return replace('registry', ...parts);
  }

  function drawLocks(data, can, role) {
    const s = data.locks;
    if (s.error) return replace('locks', sectionError(s, role));
    if (s.rows.length === 0) return replace('locks', note('No lock is held.'));
    return replace('locks', table([
      { key: 'name', label: 'name' },
      { key: 'owner', label: 'owner' },
      { key: 'holder', label: 'holder' },
      { key: 'holder_pid', label: 'pid', num: true },
      { key: 'granted_at', label: 'granted at', value: (r) => time(r.granted_at) },
      { key: 'expires_at', label: 'expires at', value: (r) => (r.session ? 'held by its session' : time(r.expires_at)) },
      { key: 'waiters', label: 'waiters', num: true },
    ], s.rows, (r) => ({ 'data-name': r.name })), cut(s));
  }

  function draw(data) {
    const p = data.permissions;
    const can = p.actions;
    document.getElementById('database').textContent = p.database;
    document.getElementById('role').textContent = p.role +
      (Object.values(can).some(Boolean) ? ` (may ${Object.keys(can).filter((k) => can[k]).join(', ')})` : ' (read only)');
    document.getElementById('extversion').textContent = p.extversion;
    document.getElementById('taken-at').replaceChildren(time(data.taken_at));
    drawQueues(data, can, p.role);
    drawPauses(data, can, p.role);
    drawGroups(data, can, p.role);
    drawDead(data, can, p.role);
    drawPending(data, can, p.role);
    drawRecurring(data, can, p.role);
    drawRegistry(data, can, p.role);
    drawLocks(data, can, p.role);
    renders += 1;
    document.body.setAttribute('data-renders', String(renders));
  }

  async function refresh() {
    if (loading) return;
    loading = true;
    const banner = document.getElementById('banner');
    try {
      // X-PGTD-Read: the server answers reads that carry it only (a page of
      // another origin cannot send it without a CORS preflight, refused).
      const res = await fetch('/api/overview', { credentials: 'same-origin', cache: 'no-store', headers: { 'X-PGTD-Read': '1' } });
      const data = await res.json().catch(() => ({ error: res.statusText }));
      if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
      csrfCookie = data.csrf_cookie;
      draw(data);
      banner.hidden = true;
      banner.textContent = '';
    } catch (e) {
      banner.textContent = `Could not read the dashboard's data: ${e.message}`;
      banner.hidden = false;
    } finally {
      loading = false;
    }
  }

  document.getElementById('refresh').addEventListener('click', () => refresh());
  setInterval(() => {
    if (document.getElementById('auto-refresh').checked && document.visibilityState === 'visible') refresh();
  }, REFRESH_MS);
  refresh();
}());
