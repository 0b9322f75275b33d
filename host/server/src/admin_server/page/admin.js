// The homeserver's admin page. Plain JavaScript, no dependencies, no build step; the
// page is served with a strict Content-Security-Policy (no inline code or style), so
// everything is built with DOM calls and text nodes (never innerHTML with data).
//
// The password is sent once, to POST /admin/session, and is never kept: the browser
// holds only the HttpOnly session cookie the server sets. Every /admin/* request sends
// X-Homeserver-Admin: 1 (the server's CSRF guard for cookie sessions).
'use strict';

(() => {
  const PAGE_SIZE = 50;
  const EVENTS_LIMIT = 50;
  const AUTO_REFRESH_MS = 10000;
  const TOKEN_PAGE = 100;
  const TOKEN_PAGES_MAX = 20;

  const $ = (sel, root = document) => root.querySelector(sel);

  // ---- small DOM helper ---------------------------------------------------------
  // h('td', {class: 'x', title: 't', dataset: {key: k}}, 'text', childNode, ...)
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [name, value] of Object.entries(attrs)) {
        if (value === undefined || value === null || value === false) continue;
        if (name === 'class') el.className = value;
        else if (name === 'dataset') Object.assign(el.dataset, value);
        else if (name === 'text') el.textContent = value;
        else if (name.startsWith('on') && typeof value === 'function') el.addEventListener(name.slice(2), value);
        else if (name in el && typeof value !== 'string') el[name] = value;
        else el.setAttribute(name, value === true ? '' : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function show(el, visible = true) {
    el.hidden = !visible;
  }

  // ---- formatting ---------------------------------------------------------------
  const nf = new Intl.NumberFormat();

  function formatBytes(n) {
    if (n === null || n === undefined) return '–';
    if (n < 1024) return `${nf.format(n)} B`;
    const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = n / 1024;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} ${units[i]}`;
  }

  function formatDuration(secs) {
    if (secs === null || secs === undefined) return '–';
    const d = Math.floor(secs / 86400);
    const hh = Math.floor((secs % 86400) / 3600);
    const m = Math.floor((secs % 3600) / 60);
    const s = Math.floor(secs % 60);
    if (d > 0) return `${d} d ${hh} h`;
    if (hh > 0) return `${hh} h ${m} min`;
    if (m > 0) return `${m} min ${s} s`;
    return `${s} s`;
  }

  const pad = (n) => String(n).padStart(2, '0');

  // A Date from Unix seconds, an ISO string, or null.
  function toDate(value) {
    if (value === null || value === undefined || value === '') return null;
    const d = typeof value === 'number' ? new Date(value * 1000) : new Date(value);
    return Number.isNaN(d.getTime()) ? null : d;
  }

  function formatTime(value) {
    const d = toDate(value);
    if (!d) return '–';
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  function relative(value) {
    const d = toDate(value);
    if (!d) return '';
    const secs = Math.round((Date.now() - d.getTime()) / 1000);
    if (secs < -5) return 'in the future';
    if (secs < 5) return 'just now';
    return `${formatDuration(secs)} ago`;
  }

  // A time cell: local time, the exact UTC time on hover.
  function timeNode(value) {
    const d = toDate(value);
    if (!d) return h('span', {class: 'muted'}, '–');
    return h('time', {datetime: d.toISOString(), title: `${d.toISOString()} (${relative(d.getTime() / 1000)})`}, formatTime(value));
  }

  function shortKey(key) {
    if (!key) return '';
    return key.length > 16 ? `${key.slice(0, 8)}…${key.slice(-4)}` : key;
  }

  // "10MB", "1.5 GiB", "2048", "0" -> bytes; "" -> null (the default). Throws on junk.
  function parseBytes(text) {
    const t = text.trim().replace(/,/g, '').replace(/_/g, '');
    if (t === '') return null;
    const m = /^(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)$/i.exec(t);
    if (!m) throw new Error('not a size: use bytes, or e.g. 500MB, 1.5GiB');
    const [, num, prefix, bin] = m;
    const exp = ' kmgtp'.indexOf(prefix.toLowerCase() || ' ');
    const base = bin ? 1024 : 1000;
    const value = Math.round(Number(num) * base ** exp);
    if (!Number.isSafeInteger(value)) throw new Error('too large');
    return value;
  }

  // ---- status messages ----------------------------------------------------------
  let messageTimer = null;

  function say(text, kind = 'info') {
    const box = $('#message');
    $('#message-text').textContent = text;
    box.className = `message message-${kind}`;
    show(box);
    clearTimeout(messageTimer);
    if (kind !== 'error') messageTimer = setTimeout(() => show(box, false), 6000);
  }

  function sayError(err, what) {
    const prefix = what ? `${what}: ` : '';
    if (err instanceof ApiError) {
      const code = err.code ? ` [${err.code}${err.status ? `, HTTP ${err.status}` : ''}]` : '';
      say(`${prefix}${err.message}${code}`, 'error');
    } else {
      say(`${prefix}${err && err.message ? err.message : String(err)}`, 'error');
    }
  }

  // ---- the API ------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const init = {
      method,
      credentials: 'same-origin',
      cache: 'no-store',
      headers: {'X-Homeserver-Admin': '1', Accept: 'application/json'},
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, 'network_error', `the admin server did not answer (${e.message})`);
    }
    const text = res.status === 204 ? '' : await res.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (_) {
        data = null;
      }
    }
    if (!res.ok) {
      const code = data && data.error ? data.error : `http_${res.status}`;
      const message = data && data.message ? data.message : text.trim().slice(0, 300) || res.statusText || 'request failed';
      const err = new ApiError(res.status, code, message);
      if (res.status === 401 && path !== '/admin/session') sessionLost(err);
      throw err;
    }
    return data;
  }

  const enc = encodeURIComponent;

  function query(params) {
    const parts = Object.entries(params)
      .filter(([, v]) => v !== undefined && v !== null && v !== '')
      .map(([k, v]) => `${enc(k)}=${enc(v)}`);
    return parts.length ? `?${parts.join('&')}` : '';
  }

  // ---- signed in / out ----------------------------------------------------------
  let signedIn = false;
  let refreshTimer = null;

  function showSignIn(note) {
    signedIn = false;
    clearInterval(refreshTimer);
    refreshTimer = null;
    clearDashboard();
    show($('#dashboard'), false);
    show($('#refresh'), false);
    show($('#sign-out'), false);
    show($('#updated'), false);
    closeDeleteConfirm();
    show($('#signin'));
    const err = $('#sign-in-error');
    if (note) {
      err.textContent = note;
      show(err);
    } else {
      show(err, false);
    }
    $('#password').focus();
  }

  function showDashboard() {
    signedIn = true;
    show($('#signin'), false);
    show($('#sign-in-error'), false);
    show($('#dashboard'));
    show($('#refresh'));
    show($('#sign-out'));
    clearInterval(refreshTimer);
    refreshTimer = setInterval(autoRefresh, AUTO_REFRESH_MS);
  }

  function sessionLost(err) {
    if (!signedIn) return;
    showSignIn(`Your session ended (${err.message}). Sign in again.`);
  }

  function clearDashboard() {
    for (const id of ['#users-table', '#tokens-table', '#policies-table', '#events-table']) {
      $(`${id} tbody`).replaceChildren();
    }
    for (const id of ['#stat-users', '#stat-storage', '#stat-rpm', '#stat-uptime']) $(id).textContent = '–';
    $('#stat-backends').replaceChildren();
    $('#new-token').textContent = '';
    show($('#new-token-panel'), false);
    show($('#reload-result'), false);
    users.list = [];
    users.cursor = null;
  }

  async function signIn(ev) {
    ev.preventDefault();
    const input = $('#password');
    const button = $('#sign-in');
    const err = $('#sign-in-error');
    const password = input.value;
    if (!password) {
      err.textContent = 'Enter the admin password.';
      show(err);
      return;
    }
    button.disabled = true;
    show(err, false);
    try {
      await api('POST', '/admin/session', {password});
      input.value = '';
      showDashboard();
      await refreshAll();
      say('Signed in.', 'ok');
    } catch (e) {
      input.select();
      if (e.status === 401) err.textContent = `Wrong password. ${e.message}`;
      else if (e.status === 429) err.textContent = `Too many attempts: wait a moment. ${e.message}`;
      else err.textContent = `Sign-in failed: ${e.message}`;
      show(err);
    } finally {
      button.disabled = false;
    }
  }

  async function signOut() {
    try {
      await api('DELETE', '/admin/session');
      showSignIn();
      say('Signed out.', 'ok');
    } catch (e) {
      // Whatever the server said, forget the page's data; the cookie may still be valid.
      showSignIn();
      sayError(e, 'Sign-out');
    }
  }

  // ---- stats --------------------------------------------------------------------
  function backendBadge(name, b) {
    if (!b) return null;
    const ok = b.status === 'ok';
    return h('div', {class: `backend ${ok ? 'ok' : 'down'}`, title: b.error || ''},
      h('span', {class: 'dot', 'aria-hidden': 'true'}),
      h('span', {class: 'backend-name'}, name),
      h('span', {class: 'muted'}, b.backend || '?'),
      h('span', {class: `badge ${ok ? 'badge-ok' : 'badge-danger'}`}, ok ? 'ok' : (b.status || 'down')),
      !ok && b.error ? h('span', {class: 'backend-error'}, b.error) : null);
  }

  function renderStats(s) {
    $('#stat-users').textContent = s.users === null || s.users === undefined ? 'unknown' : nf.format(s.users);
    const storage = $('#stat-storage');
    storage.textContent = s.total_storage === null || s.total_storage === undefined ? 'unknown' : formatBytes(s.total_storage);
    storage.title = s.total_storage === null || s.total_storage === undefined ? '' : `${nf.format(s.total_storage)} bytes`;
    $('#stat-rpm').textContent = nf.format(s.requests_per_minute ?? 0);
    $('#stat-uptime').textContent = formatDuration(s.uptime_seconds);
    const b = s.backends || {};
    $('#stat-backends').replaceChildren(
      h('span', {class: 'stat-label'}, 'Backends'),
      backendBadge('metadata', b.metadata),
      backendBadge('blobs', b.blobs));
  }

  async function loadStats() {
    renderStats(await api('GET', '/admin/stats'));
  }

  // ---- users --------------------------------------------------------------------
  const users = {list: [], cursor: null, prefix: '', loading: 0};

  function userRow(u) {
    const key = u.public_key;
    const quota = u.storage_quota;
    const unlimited = quota === 0;
    const meter = unlimited
      ? null
      : h('meter', {min: 0, max: quota, value: Math.min(u.storage_used, quota), low: quota * 0.8, high: quota * 0.95, optimum: 0});
    return h('tr', {dataset: {key}, class: u.disabled ? 'is-disabled' : ''},
      h('td', {'data-label': 'Key', class: 'key-cell'},
        h('code', {class: 'key', title: key}, shortKey(key)),
        h('button', {type: 'button', class: 'btn-link copy-key', title: 'Copy the full key', 'aria-label': `Copy key ${key}`}, 'copy')),
      h('td', {'data-label': 'Storage', class: 'storage-cell'},
        h('div', {class: 'storage-body'},
          h('div', {class: 'storage-text'},
            h('span', {class: 'used', title: `${nf.format(u.storage_used)} bytes`}, formatBytes(u.storage_used)),
            h('span', {class: 'muted'}, ' / '),
            h('span', {class: 'quota-value', title: unlimited ? 'no quota' : `${nf.format(quota)} bytes`}, unlimited ? 'unlimited' : formatBytes(quota))),
          meter)),
      h('td', {'data-label': 'Created'}, timeNode(u.created_at)),
      h('td', {'data-label': 'Last activity'}, timeNode(u.last_activity)),
      h('td', {'data-label': 'Status'},
        h('span', {class: `status badge ${u.disabled ? 'badge-warn' : 'badge-ok'}`}, u.disabled ? 'disabled' : 'active')),
      h('td', {'data-label': 'Actions', class: 'actions'},
        h('button', {type: 'button', class: 'btn btn-small disable', hidden: u.disabled}, 'Disable'),
        h('button', {type: 'button', class: 'btn btn-small enable', hidden: !u.disabled}, 'Enable'),
        h('button', {type: 'button', class: 'btn btn-small quota'}, 'Quota'),
        h('button', {type: 'button', class: 'btn btn-small btn-danger-outline delete'}, 'Delete')));
  }

  function renderUsers() {
    const body = $('#users-table tbody');
    body.replaceChildren(...users.list.map(userRow));
    show($('#users-empty'), users.list.length === 0);
    show($('#users-more'), Boolean(users.cursor));
    const n = users.list.length;
    $('#users-count').textContent = n === 0 ? '' : `${n} shown${users.cursor ? ', more available' : ''}${users.prefix ? ` for prefix “${users.prefix}”` : ''}`;
  }

  async function loadUsers(more = false) {
    // Keys are lowercase z-base-32; the server refuses other characters (and says so).
    const prefix = $('#user-search').value.trim().toLowerCase();
    const table = $('#users-table');
    const ticket = ++users.loading;
    table.setAttribute('aria-busy', 'true');
    try {
      const data = await api('GET', `/admin/users${query({prefix, cursor: more ? users.cursor : null, limit: PAGE_SIZE})}`);
      if (ticket !== users.loading) return; // a newer search is on its way
      const list = data.users || [];
      users.list = more ? users.list.concat(list) : list;
      users.cursor = data.has_more && data.cursor ? data.cursor : null;
      users.prefix = prefix;
      renderUsers();
    } finally {
      if (ticket === users.loading) table.removeAttribute('aria-busy');
    }
  }

  function replaceUser(u) {
    const i = users.list.findIndex((x) => x.public_key === u.public_key);
    if (i >= 0) users.list[i] = u;
    const row = rowOf(u.public_key);
    if (row) {
      closeQuotaEditor();
      row.replaceWith(userRow(u));
    }
  }

  function rowOf(key) {
    return [...document.querySelectorAll('#users-table tbody tr[data-key]')].find((r) => r.dataset.key === key);
  }

  async function setDisabled(key, disabled, button) {
    button.disabled = true;
    try {
      const u = await api('POST', `/admin/users/${enc(key)}/${disabled ? 'disable' : 'enable'}`);
      replaceUser(u);
      say(`${disabled ? 'Disabled' : 'Enabled'} ${shortKey(key)}.`, 'ok');
    } catch (e) {
      button.disabled = false;
      sayError(e, disabled ? 'Disable' : 'Enable');
    }
  }

  // The quota editor: one at a time, a row under the user's row.
  function closeQuotaEditor() {
    const open = $('#users-table tr.editor-row');
    if (open) open.remove();
  }

  function openQuotaEditor(key) {
    closeQuotaEditor();
    const row = rowOf(key);
    if (!row) return;
    const user = users.list.find((u) => u.public_key === key);
    const input = h('input', {
      type: 'text', id: 'quota-input', inputmode: 'text', autocomplete: 'off', spellcheck: 'false',
      placeholder: 'e.g. 500MB, 2GiB, 0', 'aria-describedby': 'quota-help',
      value: user ? String(user.storage_quota) : '',
    });
    const preview = h('span', {id: 'quota-preview', class: 'muted small'});
    const updatePreview = () => {
      try {
        const v = parseBytes(input.value);
        preview.textContent = v === null ? '= the server default' : v === 0 ? '= unlimited' : `= ${nf.format(v)} bytes (${formatBytes(v)})`;
        preview.classList.remove('field-error');
      } catch (e) {
        preview.textContent = e.message;
        preview.classList.add('field-error');
      }
    };
    input.addEventListener('input', updatePreview);
    updatePreview();
    const form = h('form', {class: 'quota-form', action: '/', method: 'post'},
      h('label', {for: 'quota-input'}, `Quota for ${shortKey(key)}`),
      h('div', {class: 'inline-fields'},
        input,
        h('button', {type: 'submit', id: 'quota-save', class: 'btn btn-primary btn-small'}, 'Save'),
        h('button', {type: 'button', id: 'quota-default', class: 'btn btn-small'}, 'Use default'),
        h('button', {type: 'button', id: 'quota-cancel', class: 'btn btn-small'}, 'Cancel')),
      preview,
      h('p', {id: 'quota-help', class: 'muted small'},
        'Bytes, or a size with a unit: KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024). ',
        'Empty = the server default (storage.quota_bytes), 0 = unlimited.'));
    const submit = async (value) => {
      let quota;
      try {
        quota = value === undefined ? parseBytes(input.value) : value;
      } catch (e) {
        say(`Quota: ${e.message}`, 'error');
        input.focus();
        return;
      }
      try {
        const u = await api('PUT', `/admin/users/${enc(key)}/quota`, {quota_bytes: quota});
        replaceUser(u);
        say(`Quota of ${shortKey(key)}: ${u.storage_quota === 0 ? 'unlimited' : `${formatBytes(u.storage_quota)} (${nf.format(u.storage_quota)} bytes)`}.`, 'ok');
      } catch (e) {
        sayError(e, 'Quota');
      }
    };
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      submit();
    });
    form.querySelector('#quota-default').addEventListener('click', () => submit(null));
    form.querySelector('#quota-cancel').addEventListener('click', closeQuotaEditor);
    form.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape') closeQuotaEditor();
    });
    const cells = row.children.length;
    row.after(h('tr', {class: 'editor-row', dataset: {for: key}}, h('td', {colspan: cells}, form)));
    input.focus();
    input.select();
  }

  // The delete confirmation panel.
  let pendingDelete = null;

  function openDeleteConfirm(key) {
    pendingDelete = key;
    $('#delete-confirm-key').textContent = key;
    $('#delete-confirm-yes').disabled = false;
    show($('#delete-confirm'));
    $('#delete-confirm-no').focus();
  }

  function closeDeleteConfirm() {
    pendingDelete = null;
    show($('#delete-confirm'), false);
  }

  async function confirmDelete() {
    const key = pendingDelete;
    if (!key) return;
    const yes = $('#delete-confirm-yes');
    yes.disabled = true;
    try {
      const r = await api('DELETE', `/admin/users/${enc(key)}`);
      closeDeleteConfirm();
      users.list = users.list.filter((u) => u.public_key !== key);
      closeQuotaEditor();
      renderUsers();
      say(`Deleted ${shortKey(key)} and ${nf.format(r && r.entries_deleted ? r.entries_deleted : 0)} entries.`, 'ok');
      loadStats().catch(() => {});
    } catch (e) {
      closeDeleteConfirm();
      sayError(e, 'Delete');
    } finally {
      yes.disabled = false;
    }
  }

  function onUsersClick(ev) {
    const button = ev.target.closest('button');
    if (!button) return;
    const row = button.closest('tr[data-key]');
    if (!row) return;
    const key = row.dataset.key;
    if (button.classList.contains('disable')) setDisabled(key, true, button);
    else if (button.classList.contains('enable')) setDisabled(key, false, button);
    else if (button.classList.contains('quota')) openQuotaEditor(key);
    else if (button.classList.contains('delete')) openDeleteConfirm(key);
    else if (button.classList.contains('copy-key')) copyText(key, row.querySelector('code.key'));
  }

  // ---- signup tokens ------------------------------------------------------------
  function tokenRow(t) {
    const used = t.status === 'used';
    return h('tr', {dataset: {token: t.token}},
      h('td', {'data-label': 'Token'}, h('code', {class: 'token-text'}, t.token)),
      h('td', {'data-label': 'Status'}, h('span', {class: `status badge ${used ? 'badge-muted' : 'badge-ok'}`}, t.status)),
      h('td', {'data-label': 'Created'}, timeNode(t.created_at)),
      h('td', {'data-label': 'Used by', class: 'used-by'}, t.used_by ? h('code', {class: 'key', title: t.used_by}, shortKey(t.used_by)) : h('span', {class: 'muted'}, '–')),
      h('td', {'data-label': 'Used'}, timeNode(t.used_at)));
  }

  async function loadTokens() {
    let all = [];
    let cursor = null;
    let more = false;
    for (let page = 0; page < TOKEN_PAGES_MAX; page += 1) {
      const data = await api('GET', `/admin/signup_tokens${query({cursor, limit: TOKEN_PAGE})}`);
      all = all.concat(data.tokens || []);
      more = Boolean(data.has_more && data.cursor);
      if (!more) break;
      cursor = data.cursor;
    }
    const time = (t) => (toDate(t.created_at) || new Date(0)).getTime();
    all.sort((a, b) => time(b) - time(a) || (a.token < b.token ? -1 : 1));
    $('#tokens-table tbody').replaceChildren(...all.map(tokenRow));
    show($('#tokens-empty'), all.length === 0);
    const valid = all.filter((t) => t.status === 'valid').length;
    $('#tokens-count').textContent = all.length
      ? `${all.length} token${all.length === 1 ? '' : 's'}, ${valid} unused${more ? ` (the first ${all.length} only)` : ''}`
      : '';
  }

  async function createToken() {
    const button = $('#create-token');
    button.disabled = true;
    try {
      const r = await api('POST', '/admin/signup_tokens');
      $('#new-token').textContent = r.token;
      show($('#new-token-panel'));
      say(`Created signup token ${r.token}.`, 'ok');
      await loadTokens();
    } catch (e) {
      sayError(e, 'Create token');
    } finally {
      button.disabled = false;
    }
  }

  // ---- copy ---------------------------------------------------------------------
  function selectText(el) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }

  async function copyText(text, el) {
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(text);
        say('Copied to the clipboard.', 'ok');
        return;
      } catch (_) {
        // fall through: select it for the user
      }
    }
    if (el) {
      // Without the clipboard API (plain http on another host), select the text.
      const original = el.textContent;
      el.textContent = text;
      selectText(el);
      let copied = false;
      try {
        copied = document.execCommand && document.execCommand('copy');
      } catch (_) {
        copied = false;
      }
      say(copied ? 'Copied to the clipboard.' : 'Selected: press Ctrl+C (⌘C) to copy.', 'info');
      if (original !== text) setTimeout(() => { el.textContent = original; }, 8000);
    } else {
      say(text, 'info');
    }
  }

  // ---- policies -----------------------------------------------------------------
  const SPARKS = '\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588';

  function formatMs(ms) {
    if (ms == null) return '> 1 s';
    return ms < 1 ? `${Math.round(ms * 1000)} µs` : `${+ms.toFixed(ms < 10 ? 1 : 0)} ms`;
  }

  // The latency histogram as a row of bars, one per bucket (its bound in the title).
  function latencyNode(c) {
    if (!c || !c.count) return h('span', {class: 'muted'}, 'no calls');
    const most = Math.max(...c.latency.map((b) => b.calls));
    const bars = c.latency.map((b) => (b.calls ? SPARKS[Math.min(7, Math.floor((b.calls / most) * 7.999))] : ' ')).join('');
    const title = c.latency.filter((b) => b.calls).map((b) => `≤ ${formatMs(b.le_ms)}: ${b.calls}`).join('\n');
    return h('span', {class: 'latency'},
      h('span', null, `p50 ${formatMs(c.p50_ms)} · p99 ${formatMs(c.p99_ms)}`),
      h('span', {class: 'spark', title, 'aria-label': `latency histogram: ${title.replace(/\n/g, ', ')}`}, bars));
  }

  // Guest CPU time (1 ms epoch ticks seen running) and the time calls slept because the
  // guests' share of the cores (policies.guest_cpu_share) was used up.
  function cpuNode(c) {
    if (!c) return h('span', {class: 'muted'}, '–');
    // Per call too: the ticks are an estimate that adds up right over many calls.
    const perCall = c.count ? ` (~${formatMs(c.cpu_ms / c.count)} a call)` : '';
    const cpu = h('span', {title: 'guest CPU time, estimated from the 1 ms epoch ticks at which a call was running'}, `${c.cpu_ms} ms${perCall}`);
    if (!c.throttled_ms) return cpu;
    return h('span', null, cpu, h('span', {class: 'error-text', title: 'time its calls slept: guest calls had used up policies.guest_cpu_share'},
      ` (slowed ${formatMs(c.throttled_ms)})`));
  }

  function failuresNode(c) {
    const failed = c ? Object.entries(c.failures).filter(([, n]) => n > 0) : [];
    if (!failed.length) return h('span', {class: 'muted'}, 'none');
    return h('span', {class: 'error-text'}, failed.map(([reason, n]) => `${reason} ${n}`).join(', '));
  }

  // The modules the slot served before the serving one, each with its own figures.
  function earlierModulesNode(s) {
    const earlier = (s.modules || []).filter((m) => !m.serving);
    if (!earlier.length) return null;
    return h('details', {class: 'earlier-modules small'},
      h('summary', null, `${earlier.length} earlier`),
      h('ul', {class: 'plain-list'}, ...earlier.map((m) =>
        h('li', {dataset: {blake3: m.blake3}},
          h('code', {title: `${m.blake3}\n${m.source}`}, `${m.blake3.slice(0, 12)}…`),
          ` ${m.calls.count} calls`,
          m.calls.count ? `, p50 ${formatMs(m.calls.p50_ms)}, p99 ${formatMs(m.calls.p99_ms)}` : '',
          `, CPU ${m.calls.cpu_ms} ms`))));
  }

  function policyRow(s) {
    const err = s.last_error;
    // The figures of the module serving now (a hot swap starts them afresh; the slot's
    // since the process started are in the Calls cell's title).
    const serving = (s.modules || []).find((m) => m.serving);
    const c = serving ? serving.calls : s.calls;
    const sinceStart = s.calls ? `all modules since this process started: ${s.calls.count} calls, CPU ${s.calls.cpu_ms} ms` : '';
    return h('tr', {dataset: {slot: s.slot}, class: s.serving ? '' : 'is-problem'},
      h('td', {'data-label': 'Slot', class: 'nowrap'}, h('strong', null, s.slot)),
      h('td', {'data-label': 'Called by', class: 'called-by'}, s.called_by === 'homeserver'
        ? 'this server'
        : h('span', {class: 'muted', title: `this server never calls it: ${s.called_by} does, with the modules in its own policies.dir`},
          `${s.called_by} (not this server)`)),
      h('td', {'data-label': 'Serving'},
        h('span', {class: `serving badge ${s.serving ? 'badge-ok' : 'badge-danger'}`,
          title: s.serving ? '' : `no module: every call gets the safe default (${s.safe_default || '?'})`},
        s.serving ? 'serving' : `safe default (${s.safe_default || '?'})`)),
      h('td', {'data-label': 'Source', class: 'wrap'},
        h('span', null, s.source ? h('code', null, s.source) : h('span', {class: 'muted'}, '–'),
          s.from_cache ? h('span', {class: 'muted small', title: 'compiled code came from the guest cache'}, ' (cached)') : null)),
      h('td', {'data-label': 'BLAKE3'}, s.blake3 ? h('code', {title: s.blake3}, `${s.blake3.slice(0, 12)}…`) : h('span', {class: 'muted'}, '–'),
        earlierModulesNode(s)),
      h('td', {'data-label': 'WIT'}, s.wit_version || '–'),
      h('td', {'data-label': 'Loaded'}, timeNode(s.loaded_at)),
      h('td', {'data-label': 'Calls', class: 'calls', title: sinceStart}, c ? String(c.count) : '–'),
      h('td', {'data-label': 'Latency', class: 'nowrap'}, latencyNode(c)),
      h('td', {'data-label': 'Failures', class: 'failures'}, failuresNode(c)),
      h('td', {'data-label': 'Memory peak', class: 'memory-peak'}, formatBytes(c && c.memory_high_water_bytes)),
      h('td', {'data-label': 'CPU', class: 'cpu nowrap'}, cpuNode(c)),
      h('td', {'data-label': 'Last error', class: 'wrap'},
        err ? h('span', {class: 'error-text'}, err, s.last_error_at ? h('span', {class: 'muted small'}, ` (${formatTime(s.last_error_at)})`) : null)
          : h('span', {class: 'muted'}, 'none')));
  }

  function renderPolicies(slots) {
    $('#policies-table tbody').replaceChildren(...(slots || []).map(policyRow));
  }

  async function loadPolicies() {
    const data = await api('GET', '/admin/policies');
    renderPolicies(data.slots);
  }

  function describeOutcome(s) {
    switch (s.outcome) {
      case 'loaded':
        return `loaded ${s.source || ''}${s.blake3 ? ` (blake3 ${s.blake3.slice(0, 12)}…${s.from_cache ? ', from cache' : ''})` : ''}`;
      case 'failed':
        return `FAILED: ${s.error || 'unknown error'} (the previous module keeps serving)`;
      default:
        return s.outcome || 'unknown';
    }
  }

  async function reloadPolicies() {
    const button = $('#reload-policies');
    const box = $('#reload-result');
    button.disabled = true;
    box.className = 'callout';
    box.replaceChildren(h('span', {class: 'muted'}, 'Reloading…'));
    show(box);
    try {
      const r = await api('POST', '/admin/policies/reload');
      box.className = `callout ${r.ok ? 'callout-ok' : 'callout-danger'}`;
      box.replaceChildren(
        h('div', {class: 'callout-label'}, r.ok ? `Reload OK at ${formatTime(Date.now() / 1000)}` : 'Reload failed for some slots'),
        h('ul', {class: 'plain-list'}, ...(r.slots || []).map((s) =>
          h('li', {dataset: {slot: s.slot, outcome: s.outcome}, class: s.outcome === 'failed' ? 'error-text' : ''},
            h('strong', null, s.slot), `: ${describeOutcome(s)}`))));
      if (r.status) renderPolicies(r.status);
      else await loadPolicies();
    } catch (e) {
      box.className = 'callout callout-danger';
      box.replaceChildren(`Reload failed: ${e.message}`);
      sayError(e, 'Reload');
    } finally {
      button.disabled = false;
    }
  }

  // ---- events -------------------------------------------------------------------
  function eventUrl(url) {
    // pk://<52-char key>/path: shorten the key, keep the path readable.
    const m = /^([a-z]+:\/\/)([a-z0-9]{52})(\/.*)?$/i.exec(url || '');
    if (!m) return h('code', {class: 'wrap'}, url || '');
    return h('code', {class: 'event-url', title: url}, m[1], h('span', {class: 'muted'}, shortKey(m[2])), m[3] || '');
  }

  function eventRow(e) {
    const type = String(e.type || '').toUpperCase();
    return h('tr', {dataset: {cursor: String(e.cursor), url: e.url || '', type}},
      h('td', {'data-label': 'Type'}, h('span', {class: `badge ${type === 'PUT' ? 'badge-info' : type === 'DEL' ? 'badge-warn' : 'badge-muted'}`}, type)),
      h('td', {'data-label': 'URL', class: 'wrap'}, eventUrl(e.url)),
      h('td', {'data-label': 'Cursor', class: 'num'}, String(e.cursor)),
      h('td', {'data-label': 'Time'}, timeNode(e.created_at)));
  }

  async function loadEvents() {
    const data = await api('GET', `/admin/events${query({limit: EVENTS_LIMIT})}`);
    const list = data.events || [];
    $('#events-table tbody').replaceChildren(...list.map(eventRow));
    show($('#events-empty'), list.length === 0);
  }

  // ---- refresh ------------------------------------------------------------------
  function stamp() {
    const u = $('#updated');
    const d = new Date();
    u.textContent = `Updated ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    show(u);
  }

  // Runs each loader; one failing does not stop the others. Reports the first error.
  async function runAll(loaders) {
    const results = await Promise.allSettled(loaders.map((f) => f()));
    const failed = results.find((r) => r.status === 'rejected');
    if (failed && signedIn) sayError(failed.reason);
    if (!failed) stamp();
    return !failed;
  }

  async function refreshAll() {
    const button = $('#refresh');
    button.disabled = true;
    try {
      return await runAll([loadStats, () => loadUsers(false), loadTokens, loadPolicies, loadEvents]);
    } finally {
      button.disabled = false;
    }
  }

  let autoBusy = false;

  async function autoRefresh() {
    if (!signedIn || document.hidden || autoBusy) return;
    autoBusy = true;
    try {
      await runAll([loadStats, loadEvents]);
    } finally {
      autoBusy = false;
    }
  }

  // ---- start --------------------------------------------------------------------
  let searchTimer = null;

  function wire() {
    $('#sign-in-form').addEventListener('submit', signIn);
    $('#sign-out').addEventListener('click', signOut);
    $('#refresh').addEventListener('click', async () => {
      if (await refreshAll()) say('Refreshed.', 'ok');
    });
    $('#message-close').addEventListener('click', () => show($('#message'), false));

    const search = $('#user-search');
    const runSearch = () => loadUsers(false).catch((e) => sayError(e, 'Users'));
    search.addEventListener('input', () => {
      // Busy from the first keystroke until the answer to the last one is shown.
      $('#users-table').setAttribute('aria-busy', 'true');
      users.loading += 1;
      clearTimeout(searchTimer);
      searchTimer = setTimeout(runSearch, 250);
    });
    $('#user-search-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      clearTimeout(searchTimer);
      runSearch();
    });
    $('#users-more').addEventListener('click', async (ev) => {
      const b = ev.currentTarget;
      b.disabled = true;
      try {
        await loadUsers(true);
      } catch (e) {
        sayError(e, 'Users');
      } finally {
        b.disabled = false;
      }
    });
    $('#users-table').addEventListener('click', onUsersClick);

    $('#delete-confirm-yes').addEventListener('click', confirmDelete);
    $('#delete-confirm-no').addEventListener('click', closeDeleteConfirm);
    $('#delete-confirm').addEventListener('click', (ev) => {
      if (ev.target === ev.currentTarget) closeDeleteConfirm();
    });
    document.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && pendingDelete) closeDeleteConfirm();
    });

    $('#create-token').addEventListener('click', createToken);
    $('#copy-token').addEventListener('click', () => copyText($('#new-token').textContent, $('#new-token')));
    $('#reload-policies').addEventListener('click', reloadPolicies);
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden) autoRefresh();
    });
  }

  async function start() {
    wire();
    try {
      renderStats(await api('GET', '/admin/stats'));
      showDashboard();
      await runAll([() => loadUsers(false), loadTokens, loadPolicies, loadEvents]);
    } catch (e) {
      if (e.status === 401) showSignIn();
      else {
        showSignIn();
        sayError(e, 'The admin API');
      }
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
