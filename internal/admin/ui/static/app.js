// Spool dashboard: a single page over the REST API (/api/v1). No framework and no build step.
//
// Safety: every datum from the broker (topic and group names, payloads, headers, errors) is put in
// the page with textContent or as an attribute value, never parsed as markup; links are built as
// "#/..." fragments with encodeURIComponent. Mutations are JSON POSTs to the same origin, which
// the API's CSRF checks accept, with the user's token when authentication is on.
'use strict';

(() => {
  const POLL_MS = 2000; // a view's poll interval unless it sets pollMs
  const SLOW_FACTOR = 5; // the next poll waits at least this many times the last one's duration
  const POLL_MAX_MS = 60000; // ... but no longer than this
  const TOKEN_KEY = 'spool.token';
  const DLQ_PAGE = 100;
  const DLQ_MAX = 1000; // the API's largest page
  const MSG_PAGE = 20; // messages per page of the topic page's reader (read on demand, with payloads)
  const HIST = 30; // samples kept for a sparkline (one minute at POLL_MS)

  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;

  // ---------- DOM helpers ----------

  // el makes an element. attrs: class, text (textContent), on<event> handlers, boolean properties,
  // other attributes as strings. Children are nodes or values shown as text.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = String(v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'checked' || k === 'disabled' || k === 'indeterminate') e[k] = true;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const nf = new Intl.NumberFormat('en-US');
  const fmtNum = (n) => (n === null || n === undefined ? '—' : nf.format(n));

  function fmtBytes(n) {
    if (n === null || n === undefined) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? String(n) : n.toFixed(n < 10 ? 1 : 0)) + ' ' + units[i];
  }

  function fmtRate(r) {
    if (r === null || r === undefined) return '—';
    if (r === 0) return '0/s';
    if (r < 10) return r.toFixed(1) + '/s';
    return nf.format(Math.round(r)) + '/s';
  }

  // fmtDur shortens a Go duration string: "168h0m0s" -> "168h", "5m0s" -> "5m".
  function fmtDur(s) {
    if (!s) return '—';
    return String(s).replace(/(\d)h0m0s$/, '$1h').replace(/(\d)m0s$/, '$1m');
  }

  const pad = (n) => String(n).padStart(2, '0');
  function fmtTime(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    if (isNaN(d)) return String(iso);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  function fmtAgo(iso) {
    const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
    if (!isFinite(s)) return '';
    if (s < 60) return `${Math.max(s, 0)}s ago`;
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return `${Math.floor(s / 86400)} d ago`;
  }

  function badge(level, text, title) {
    return el('span', { class: 'badge ' + level, text, title });
  }

  const STATE_LEVEL = { ACTIVE: 'ok', PAUSED: 'warn', DEAD: 'crit', CANCELLED: 'idle', DELETED: 'idle' };
  const stateBadge = (s) => badge(STATE_LEVEL[s] || 'idle', s, 'subscription state');

  // spark draws the rate history as an inline SVG line, newest on the right.
  function spark(hist) {
    const NS = 'http://www.w3.org/2000/svg';
    const w = 72, h = 18;
    const svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('class', 'spark');
    svg.setAttribute('width', w);
    svg.setAttribute('height', h);
    svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
    svg.setAttribute('aria-hidden', 'true');
    const base = document.createElementNS(NS, 'line');
    base.setAttribute('x1', 1);
    base.setAttribute('x2', w - 1);
    base.setAttribute('y1', h - 1.5);
    base.setAttribute('y2', h - 1.5);
    svg.append(base);
    if (hist.length >= 3) {
      const top = Math.max(...hist) || 1;
      const step = (w - 2) / (HIST - 1);
      const pts = hist.map((v, i) => {
        const x = w - 1 - (hist.length - 1 - i) * step;
        const y = h - 2 - (v / top) * (h - 4);
        return x.toFixed(1) + ',' + y.toFixed(1);
      });
      const line = document.createElementNS(NS, 'polyline');
      line.setAttribute('points', pts.join(' '));
      svg.append(line);
    }
    return svg;
  }

  // ---------- API ----------

  class APIError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
    toString() { return `${this.code}: ${this.message}`; }
  }

  // api calls the REST API with the token of this tab, JSON in and out. A 401 opens the sign-in
  // dialog; every failure is an APIError with the API's error code and message.
  async function api(path, opts = {}) {
    const headers = { Accept: 'application/json' };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = 'Bearer ' + token;
    const init = { method: opts.method || 'GET', headers, cache: 'no-store' };
    if (opts.body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(opts.body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new APIError(0, 'UNREACHABLE', 'the broker did not answer (' + e.message + ')');
    }
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch { /* not JSON: keep the status */ }
    }
    if (!res.ok) {
      const err = (data && data.error) || {};
      const e = new APIError(res.status, err.code || 'HTTP_' + res.status, err.message || res.statusText || 'request failed');
      if (res.status === 401) {
        if (token) sessionStorage.removeItem(TOKEN_KEY);
        needLogin(token ? 'That token was refused. ' + e.message : '');
      }
      throw e;
    }
    return data;
  }

  const topicPath = (t) => '/api/v1/topics/' + enc(t);
  const groupPath = (t, g) => topicPath(t) + '/groups/' + enc(g);
  const topicHref = (t) => '#/topics/' + enc(t);
  const dlqHref = (t, g) => topicHref(t) + '/groups/' + enc(g) + '/dlq';

  // ---------- rates from successive polls ----------

  // samples keeps, per key, the last counter value and the rates computed from it.
  const samples = new Map();

  // sample records value (a monotonic counter) and returns {rate, hist}; rate is null until two
  // polls were seen. Polls closer than 500 ms (a refresh after an action) do not make a rate.
  function sample(key, value) {
    const now = performance.now();
    let s = samples.get(key);
    if (!s) {
      s = { t: now, v: value, rate: null, hist: [] };
      samples.set(key, s);
      return s;
    }
    if (now - s.t >= 500) {
      s.rate = Math.max(0, (value - s.v) / ((now - s.t) / 1000));
      s.hist.push(s.rate);
      if (s.hist.length > HIST) s.hist.shift();
      s.t = now;
      s.v = value;
    }
    return s;
  }

  // lagGrowing keeps a group's recent lag values and says whether it rose over the last five polls
  // without ever falling.
  const lags = new Map();
  function lagGrowing(key, lag) {
    const h = lags.get(key) || [];
    h.push(lag);
    if (h.length > 5) h.shift();
    lags.set(key, h);
    if (h.length < 5) return false;
    for (let i = 1; i < h.length; i++) if (h[i] < h[i - 1]) return false;
    return h[h.length - 1] > h[0];
  }

  const sum = (xs, f) => xs.reduce((a, x) => a + (f(x) || 0), 0);

  // ---------- health ----------

  const RANK = { ok: 0, idle: 0, warn: 1, crit: 2 };
  const LABEL = { ok: 'OK', warn: 'WARN', crit: 'CRITICAL', idle: 'ENDED' };

  // groupHealth says how a subscription is doing, with the reasons in words.
  function groupHealth(g) {
    if (g.state === 'CANCELLED' || g.state === 'DELETED') return { level: 'idle', why: ['cancelled: holds nothing'] };
    let level = 'ok';
    const why = [];
    const bump = (l, w) => { why.push(w); if (RANK[l] > RANK[level]) level = l; };
    if (g.state === 'DEAD') bump('crit', 'dead: no member within the heartbeat timeout');
    if (g.state === 'PAUSED') bump('warn', 'paused: receives nothing');
    if (g.state === 'ACTIVE' && g.member_count === 0) bump('warn', 'no member connected here');
    if (g.dead_lettered > 0) bump('warn', fmtNum(g.dead_lettered) + ' in the DLQ');
    if (lagGrowing(g.topic + '\u0000' + g.group, g.lag)) bump('warn', 'lag growing');
    return { level, why };
  }

  function healthCell(h) {
    return el('td', { 'data-col': 'health' }, badge(h.level, h.label || LABEL[h.level]),
      h.why.length ? el('span', { class: 'health-why', text: h.why.join(' · ') }) : null);
  }

  // ---------- page chrome: live indicator, banner, toasts, dialogs ----------

  const ui = { paused: false, authNeeded: false, timer: 0, gen: 0, route: null, lastOK: null, lastLoadMs: 0 };

  // stale says whether the page moved on (another route, a sign-in) since a load that started at
  // generation gen: each view's load checks it after every await, before it draws or keeps data,
  // so a slow answer for the page left never draws into the page shown.
  const stale = (gen) => gen !== ui.gen;

  function setLive(kind, text) {
    const l = $('live');
    l.className = 'live ' + kind;
    l.textContent = text;
  }

  function showBanner(text) {
    const b = $('banner');
    b.textContent = text;
    b.hidden = false;
  }
  const hideBanner = () => { $('banner').hidden = true; };

  function toast(text, isError) {
    const t = el('div', { class: 'toast' + (isError ? ' error' : ''), role: isError ? 'alert' : 'status', text });
    $('toasts').append(t);
    setTimeout(() => t.remove(), isError ? 9000 : 4000);
  }

  // confirmDialog asks before an action; resolves true when confirmed.
  function confirmDialog({ title, text, ok, danger }) {
    return new Promise((resolve) => {
      const box = $('confirm');
      $('confirm-title').textContent = title;
      $('confirm-text').textContent = text;
      const okBtn = $('confirm-ok');
      const cancel = $('confirm-cancel');
      okBtn.textContent = ok;
      okBtn.className = 'primary' + (danger ? ' danger' : '');
      box.hidden = false;
      (danger ? cancel : okBtn).focus();
      const done = (v) => {
        box.hidden = true;
        okBtn.removeEventListener('click', yes);
        cancel.removeEventListener('click', no);
        document.removeEventListener('keydown', key);
        resolve(v);
      };
      const yes = () => done(true);
      const no = () => done(false);
      const key = (e) => { if (e.key === 'Escape') no(); };
      okBtn.addEventListener('click', yes);
      cancel.addEventListener('click', no);
      document.addEventListener('keydown', key);
    });
  }

  function needLogin(message) {
    ui.authNeeded = true;
    clearTimeout(ui.timer);
    $('signout').hidden = true;
    setLive('paused', 'sign-in needed');
    const errEl = $('login-error');
    errEl.textContent = message || '';
    errEl.hidden = !message;
    $('login').hidden = false;
    $('token').focus();
  }

  function crumbs(...items) {
    const nav = $('crumbs');
    nav.replaceChildren();
    items.forEach((it, i) => {
      if (i) nav.append(el('span', { class: 'sep', text: '›' }));
      nav.append(it.href ? el('a', { href: it.href, text: it.text }) : el('span', { text: it.text }));
    });
  }

  function card(label, value, sub, cls, col) {
    return el('div', { class: 'card' + (cls ? ' ' + cls : ''), 'data-card': col },
      el('div', { class: 'label', text: label }),
      el('div', { class: 'value', text: value }),
      sub ? el('div', { class: 'sub', text: sub }) : null);
  }

  function table(head, rows, emptyText) {
    if (!rows.length) return el('div', { class: 'empty', text: emptyText });
    return el('div', { class: 'scroll' }, el('table', {},
      el('thead', {}, el('tr', {}, head.map((h) => (h instanceof Node ? h : el('th', { class: h.num ? 'num' : h.cls, text: h.text !== undefined ? h.text : h }))))),
      el('tbody', {}, rows)));
  }

  // focusSel and restoreFocus keep the keyboard focus across a redraw: focusSel names the focused
  // control by its row (data-entry, data-group or data-topic) and its kind; restoreFocus focuses
  // the same control of the new row when the focus was lost (the old one left the page).
  function focusSel() {
    const a = document.activeElement;
    const row = a && a !== document.body ? a.closest('[data-entry],[data-group],[data-topic]') : null;
    if (!row) return null;
    const attr = ['data-entry', 'data-group', 'data-topic'].find((n) => row.hasAttribute(n));
    let sel = `[${attr}="${CSS.escape(row.getAttribute(attr))}"]`;
    if (a !== row) {
      const action = a.getAttribute('data-action');
      sel += ' ' + (action ? `[data-action="${CSS.escape(action)}"]` : a.tagName.toLowerCase());
    }
    return sel;
  }
  function restoreFocus(sel) {
    if (!sel || (document.activeElement && document.activeElement !== document.body)) return;
    const again = document.querySelector(sel);
    if (again) again.focus();
  }

  const num = (v, col) => el('td', { class: 'num', 'data-col': col, text: fmtNum(v) });

  // ---------- a message's details (DLQ inspector and message reader) ----------

  // messageFields appends a message's identity and times to the definition list dl.
  function messageFields(dl, m) {
    const row = (k, v, col) => dl.append(el('dt', { text: k }), el('dd', { 'data-field': col, text: v }));
    row('Message id', m.id, 'id');
    row('Partition / offset', `${m.partition} / ${m.offset}`, 'position');
    if (m.key !== undefined) row('Key', m.key, 'key');
    if (m.key_base64 !== undefined) row('Key (base64)', m.key_base64, 'key');
    row('Published', fmtTime(m.published_at) + ' (' + fmtAgo(m.published_at) + ')', 'published');
    if (m.producer_id) row('Producer id', m.producer_id, 'producer');
    if (m.not_before) row('Not before', fmtTime(m.not_before), 'not_before');
    if (m.expires_at) row('Expires', fmtTime(m.expires_at), 'expires_at');
    return row;
  }

  // messageContent shows a message's headers and payload as text: the payload pretty-printed when
  // it is JSON, in base64 when it is not UTF-8. ids names the two elements (headers, payload).
  function messageContent(m, ids) {
    const headers = Object.entries(m.headers || {}).sort((a, b) => (a[0] < b[0] ? -1 : 1));
    const htable = headers.length
      ? el('dl', { class: 'kv', id: ids.headers }, headers.flatMap(([k, v]) => [el('dt', { class: 'mono', text: k }), el('dd', { class: 'mono', text: v })]))
      : el('p', { class: 'muted', text: 'No headers.' });
    let body, note;
    if (m.payload_base64 !== undefined) {
      body = m.payload_base64;
      note = `binary, ${fmtBytes(atob(m.payload_base64).length)}, shown in base64`;
    } else {
      body = m.payload || '';
      note = `${fmtBytes(new TextEncoder().encode(body).length)} of text`;
      if (/^\s*[[{]/.test(body)) {
        try { body = JSON.stringify(JSON.parse(body), null, 2); note += ', JSON'; } catch { /* shown as is */ }
      }
    }
    return [el('h3', { text: 'Headers' }), htable,
      el('h3', {}, 'Payload ', el('span', { class: 'muted', text: '(' + note + ')' })),
      el('pre', { class: 'payload', id: ids.payload, text: body })];
  }

  // payloadSize is a message's payload size in bytes.
  function payloadSize(m) {
    if (m.payload_bytes !== undefined) return m.payload_bytes;
    if (m.payload_base64 !== undefined) return atob(m.payload_base64).length;
    return new TextEncoder().encode(m.payload || '').length;
  }

  // ---------- view: topics ----------

  // cleanupCard shows the cleanup jobs' health (GET /api/v1/cleanup): seed 000's rules, CRITICAL
  // when a job falls behind production, WARNING when the retention backlog passes 1,000,000.
  function cleanupCard(cl) {
    if (!cl) return card('Cleanup', '—', 'status unavailable', null, 'cleanup');
    const backlog = sum(cl.jobs, (j) => j.backlog);
    const behind = cl.jobs.filter((j) => j.behind);
    const warn = cl.jobs.filter((j) => j.warning);
    const bad = behind.length ? behind : warn;
    const sub = `backlog ${fmtNum(backlog)} messages` + (bad.length ? ' · ' + bad.map((j) => j.job + ': ' + j.reason).join(' · ') : '');
    return card('Cleanup', behind.length ? 'BEHIND' : warn.length ? 'WARNING' : 'OK', sub,
      behind.length ? 'crit' : warn.length ? 'warn' : null, 'cleanup');
  }

  const topicsView = {
    filter: '',
    mount(main) {
      crumbs({ text: 'Topics' });
      const filter = el('input', {
        type: 'search', id: 'filter', placeholder: 'Filter topics', 'aria-label': 'Filter topics', value: this.filter,
        oninput: (e) => { this.filter = e.target.value; this.draw(); },
      });
      main.append(
        el('div', { class: 'page-head' }, el('h1', { text: 'Topics' }), el('div', { class: 'spacer' }), filter),
        el('div', { class: 'cards', id: 'cards' }),
        el('div', { class: 'section' }, el('div', { id: 'topics' }, el('div', { class: 'empty', text: 'Loading…' }))));
    },
    async load(r, gen) {
      const [tl, gl, cl] = await Promise.all([api('/api/v1/topics?limit=1000'), api('/api/v1/groups?limit=1000'),
        api('/api/v1/cleanup').catch(() => null)]);
      if (stale(gen)) return;
      // Rates and health trends are sampled here, once per poll; draw (also run on each key of
      // the filter) only shows them.
      const rates = new Map();
      for (const t of tl.topics) {
        const st = t.stats || { partitions: [] };
        rates.set(t.name, sample('topic\u0000' + t.name, sum(st.partitions, (p) => p.high_water)));
      }
      const healths = gl.groups.map(groupHealth);
      this.data = { tl, gl, cl, rates, healths };
      this.draw();
    },
    draw() {
      if (!this.data) return;
      const { tl, gl, cl, rates, healths } = this.data;
      const byTopic = new Map();
      let attention = 0, critical = 0;
      for (const [i, g] of gl.groups.entries()) {
        const h = healths[i];
        if (h.level === 'warn') attention++;
        if (h.level === 'crit') { attention++; critical++; }
        if (!byTopic.has(g.topic)) byTopic.set(g.topic, []);
        byTopic.get(g.topic).push({ g, h });
      }
      let total = null, depth = 0;
      const rows = [];
      const f = this.filter.trim().toLowerCase();
      for (const t of tl.topics) {
        const st = t.stats || { messages: 0, bytes: 0, partitions: [] };
        const s = rates.get(t.name);
        if (s.rate !== null) total = (total || 0) + s.rate;
        depth += st.messages;
        if (f && !t.name.toLowerCase().includes(f)) continue;
        const groups = byTopic.get(t.name) || [];
        let worst = { level: 'ok', why: [] };
        if (!groups.length) worst = { level: 'idle', label: 'NO GROUPS', why: ['no subscription: nothing consumes it'] };
        for (const { g, h } of groups) {
          if (RANK[h.level] > RANK[worst.level]) worst = { level: h.level, why: [] };
          if (h.level === worst.level && h.level !== 'ok') worst.why.push(g.group + ': ' + h.why.join(', '));
        }
        if (worst.level === 'idle' && groups.length) worst.level = 'ok';
        const maxLag = groups.length ? Math.max(...groups.map(({ g }) => g.lag)) : null;
        const damaged = st.partitions.filter((p) => p.damaged).length;
        if (damaged) worst = { level: 'crit', why: [damaged + ' partition(s) damaged: unavailable until repaired', ...worst.why] };
        rows.push(el('tr', { class: 'clickable', 'data-topic': t.name, onclick: (e) => { if (!e.target.closest('a')) location.hash = topicHref(t.name); } },
          el('td', { class: 'name' }, el('a', { href: topicHref(t.name), text: t.name })),
          el('td', {}, badge('info', t.config.semantics)),
          num(t.config.partitions, 'partitions'),
          num(st.messages, 'depth'),
          el('td', { class: 'num', 'data-col': 'bytes', text: fmtBytes(st.bytes) }),
          el('td', { class: 'num', 'data-col': 'rate' }, fmtRate(s.rate), spark(s.hist)),
          num(groups.length, 'groups'),
          num(t.members, 'members'),
          num(maxLag, 'lag'),
          healthCell(worst)));
      }
      $('cards').replaceChildren(
        card('Topics', fmtNum(tl.total), tl.total > tl.topics.length ? `first ${fmtNum(tl.topics.length)} shown` : null, null, 'topics'),
        card('Messages retained', fmtNum(depth), 'sum of depths', null, 'depth'),
        card('Publish rate', fmtRate(total), 'all topics, msg/s', null, 'rate'),
        card('Groups needing attention', fmtNum(attention),
          `${fmtNum(critical)} critical of ${gl.next_after_id ? 'the first ' : ''}${fmtNum(gl.groups.length)} groups`,
          critical ? 'crit' : attention ? 'warn' : null, 'attention'),
        cleanupCard(cl));
      $('topics').replaceChildren(table(
        ['Topic', 'Semantics', { text: 'Partitions', num: true }, { text: 'Depth', num: true }, { text: 'Size', num: true },
          { text: 'Publish rate', num: true }, { text: 'Groups', num: true }, { text: 'Members', num: true },
          { text: 'Max lag', num: true }, 'Health'],
        rows, f ? 'No topic matches the filter.' : 'No topics yet. Publish a message or create a topic with spool topic create.'));
    },
  };

  // ---------- view: one topic ----------

  const topicView = {
    mount(main, r) {
      this.r = r;
      this.msgs = null; // the page of messages shown: the API's answer and the from it was read at
      this.msgShown = null; // the message in the inspector
      this.msgSeq = 0;
      crumbs({ text: 'Topics', href: '#/' }, { text: r.topic });
      main.append(
        el('div', { class: 'page-head', id: 'head' }, el('h1', { text: r.topic })),
        el('div', { class: 'cards', id: 'cards' }),
        el('div', { class: 'section' },
          el('div', { class: 'section-head' }, el('h2', { text: 'Consumer groups' })),
          el('div', { id: 'groups' }, el('div', { class: 'empty', text: 'Loading…' }))),
        el('div', { class: 'section' },
          el('div', { class: 'section-head' }, el('h2', { text: 'Partitions' })),
          el('div', { id: 'partitions' })),
        el('div', { class: 'section' },
          el('div', { class: 'section-head' }, el('h2', { text: 'Configuration' })),
          el('div', { class: 'config', id: 'config' })),
        el('div', { class: 'dlq-layout', id: 'msg-layout' },
          el('div', { class: 'section', id: 'messages-section' },
            el('form', { class: 'section-head', id: 'msg-form', onsubmit: (e) => { e.preventDefault(); this.readMessages(null); } },
              el('h2', { text: 'Messages' }), el('span', { class: 'muted', text: 'read without consuming' }), el('div', { class: 'spacer' }),
              el('label', { for: 'msg-partition', text: 'Partition' }),
              el('select', { id: 'msg-partition' }, el('option', { value: '0', text: '0' })),
              el('input', { type: 'text', id: 'msg-from', spellcheck: 'false', 'aria-label': 'Read from',
                placeholder: 'from: offset, id or time (empty: the start)', title: 'Empty: the first retained message. An offset (42), a message id (3:42) or a time (2026-11-26T10:00:00Z: the first message published at or after it).' }),
              el('button', { type: 'submit', id: 'msg-read', text: 'Read' }),
              el('button', { type: 'button', id: 'msg-next', text: 'Next page', disabled: true, onclick: () => this.readMessages(this.msgs.next_offset) })),
            el('div', { id: 'messages' }, el('div', { class: 'empty', text: 'Pick a partition and where to start, then Read: the page shows ' + MSG_PAGE + ' messages at a time, and consumes nothing.' })),
            el('div', { class: 'note', id: 'msg-note', hidden: true })),
          el('div', { class: 'section inspector', id: 'msg-inspector', hidden: true })));
    },
    // readMessages reads a page of the chosen partition: from next (an offset of the partition
    // read last: "Next page"), else from what the from field says.
    async readMessages(next) {
      const r = this.r;
      const gen = ui.gen;
      const seq = ++this.msgSeq;
      const q = new URLSearchParams({ limit: String(MSG_PAGE) });
      let from;
      if (next !== null) {
        from = String(next);
        q.set('partition', String(this.msgs.partition));
      } else {
        from = $('msg-from').value.trim();
        // A message id names its partition; an offset or a time reads the one picked.
        if (from.includes('T') || !from.includes(':')) q.set('partition', $('msg-partition').value);
      }
      if (from) q.set('from', from);
      try {
        const page = await api(topicPath(r.topic) + '/messages?' + q);
        if (stale(gen) || seq !== this.msgSeq) return;
        this.msgs = Object.assign(page, { from });
        this.msgShown = null;
        $('msg-partition').value = String(page.partition);
        this.drawMessages();
      } catch (e) {
        if (stale(gen) || seq !== this.msgSeq || e.status === 401) return;
        this.msgs = null;
        this.msgShown = null;
        $('msg-next').disabled = true;
        $('msg-note').hidden = true;
        $('messages').replaceChildren(el('div', { class: 'empty form-error', id: 'msg-error', text: String(e) }));
        this.drawMessage();
      }
    },
    drawMessages() {
      const pg = this.msgs;
      const rows = pg.messages.map((m) => el('tr', {
        class: 'clickable' + (this.msgShown === m ? ' selected' : ''), 'data-message': m.id, tabindex: 0,
        title: 'Inspect this message', 'aria-selected': String(this.msgShown === m),
        onclick: () => this.showMessage(m),
        onkeydown: (ev) => { if (ev.key === 'Enter') this.showMessage(m); },
      },
      num(m.offset, 'offset'),
      el('td', { class: 'mono', 'data-col': 'key', text: m.key !== undefined ? m.key : m.key_base64 !== undefined ? m.key_base64 + ' (base64)' : '—' }),
      num(Object.keys(m.headers || {}).length, 'headers'),
      el('td', { class: 'num', 'data-col': 'size', text: fmtBytes(payloadSize(m)) }),
      el('td', { 'data-col': 'published', title: fmtAgo(m.published_at), text: fmtTime(m.published_at) })));
      $('messages').replaceChildren(table(
        [{ text: 'Offset', num: true }, 'Key', { text: 'Headers', num: true }, { text: 'Size', num: true }, 'Published'],
        rows, `No message in partition ${pg.partition} from ${pg.from || 'its start'} yet.`));
      const note = $('msg-note');
      const n = pg.messages.length;
      note.hidden = n === 0;
      if (n) {
        note.textContent = `Partition ${pg.partition}, offsets ${fmtNum(pg.messages[0].offset)} to ${fmtNum(pg.messages[n - 1].offset)}` +
          // A page also ends at 4 MiB of messages: a short one is not always the end.
          (n < MSG_PAGE ? ': the end of the partition for now, or of the 4 MiB of messages a page holds.'
            : '. "Next page" reads on from offset ' + fmtNum(pg.next_offset) + '.');
      }
      $('msg-next').disabled = false; // also after the end: messages published since show up
      this.drawMessage();
    },
    showMessage(m) {
      this.msgShown = m;
      this.drawMessages();
    },
    // drawMessage shows the inspected message: its fields, headers and payload, as text.
    drawMessage() {
      const box = $('msg-inspector');
      const m = this.msgShown;
      $('msg-layout').classList.toggle('inspecting', m !== null);
      box.hidden = m === null;
      if (m === null) return;
      const close = el('button', { type: 'button', class: 'ghost', id: 'msg-close', text: 'Close', 'aria-label': 'Close the inspector', onclick: () => this.showMessage(null) });
      const dl = el('dl', { class: 'kv' });
      messageFields(dl, m);
      box.replaceChildren(
        el('div', { class: 'section-head' }, el('h2', { text: `Message ${m.id}` }), el('div', { class: 'spacer' }), close),
        el('div', { class: 'body' }, dl, messageContent(m, { headers: 'msg-headers', payload: 'msg-payload' })));
    },
    async load(r, gen) {
      const [t, gl] = await Promise.all([api(topicPath(r.topic)), api(topicPath(r.topic) + '/groups')]);
      if (stale(gen)) return;
      const st = t.stats || { messages: 0, bytes: 0, partitions: [] };
      const s = sample('topic\u0000' + t.name, sum(st.partitions, (p) => p.high_water));
      const healths = gl.groups.map(groupHealth);
      const bad = healths.filter((h) => h.level === 'warn' || h.level === 'crit').length;
      const pick = $('msg-partition');
      if (pick.options.length !== t.config.partitions) {
        const v = Number(pick.value);
        pick.replaceChildren(...Array.from({ length: t.config.partitions }, (_, i) => el('option', { value: String(i), text: String(i) })));
        pick.value = String(v < t.config.partitions ? v : 0);
      }
      $('head').replaceChildren(el('h1', { text: t.name }), badge('info', t.config.semantics),
        el('span', { class: 'muted', text: 'created ' + fmtTime(t.created_at) }));
      $('cards').replaceChildren(
        card('Depth', fmtNum(st.messages), 'messages retained', null, 'depth'),
        card('Size', fmtBytes(st.bytes), `${fmtNum(t.config.partitions)} partition(s)`, null, 'bytes'),
        card('Publish rate', fmtRate(s.rate), 'msg/s, from the last two polls', null, 'rate'),
        card('Groups', fmtNum(gl.groups.length) + (gl.next_after_id ? '+' : ''),
          (bad ? `${bad} need attention` : 'all healthy') + (gl.next_after_id ? ` · the first ${fmtNum(gl.groups.length)} shown` : ''),
          bad ? 'warn' : null, 'groups'),
        card('Members', fmtNum(t.members), 'connected to this broker', null, 'members'));

      const rows = gl.groups.map((g, i) => {
        const h = healths[i];
        const done = sample('done\u0000' + g.topic + '\u0000' + g.group, sum(g.partitions, (p) => p.ack_floor));
        const name = el('td', { class: 'name' }, g.group);
        if (g.pattern) name.append(el('div', { class: 'members', text: 'via pattern ' + g.pattern }));
        if (g.ephemeral) name.append(' ', badge('idle', 'ephemeral'));
        const members = el('td', { 'data-col': 'members' }, fmtNum(g.member_count));
        if (g.members.length) {
          members.append(el('div', { class: 'members' }, g.members.map((m) =>
            el('div', { title: 'member id · leases held (of its credit) · deliveries since it joined' },
              `${m.id} · ${fmtNum(m.in_flight)}${m.max_in_flight ? ' of ' + fmtNum(m.max_in_flight) : ''} in flight · ${fmtNum(m.delivered)} delivered`))));
        }
        const dlq = el('td', { class: 'num', 'data-col': 'dlq' },
          el('a', { href: dlqHref(g.topic, g.group), title: 'Open the dead-letter queue', text: fmtNum(g.dead_lettered) + ' →' }));
        const processed = el('td', { class: 'num', 'data-col': 'processed',
          title: 'completed by acks (processed), nacked (failed) and filtered out through this broker since it started' }, fmtNum(g.processed));
        if (g.failed || g.filtered) {
          processed.append(el('div', { class: 'members', text: [g.failed ? fmtNum(g.failed) + ' failed' : '',
            g.filtered ? fmtNum(g.filtered) + ' filtered' : ''].filter(Boolean).join(' · ') }));
        }
        let action = null;
        if (g.state === 'ACTIVE' && !g.ephemeral) {
          action = el('button', { type: 'button', class: 'ghost', 'data-action': 'pause', text: 'Pause', title: 'Pause group ' + g.group, onclick: () => this.groupOp(g, 'pause') });
        } else if (g.state === 'PAUSED' || g.state === 'DEAD') {
          action = el('button', { type: 'button', 'data-action': 'resume', text: 'Resume', title: 'Resume group ' + g.group, onclick: () => this.groupOp(g, 'resume') });
        }
        return el('tr', { 'data-group': g.group },
          name, el('td', { 'data-col': 'state' }, stateBadge(g.state)), healthCell(h), members,
          num(g.lag, 'lag'), num(g.pending, 'pending'), num(g.in_flight, 'in_flight'), num(g.redelivering, 'redelivering'),
          el('td', { class: 'num', 'data-col': 'done_rate' }, fmtRate(done.rate), spark(done.hist)), processed, dlq,
          el('td', { 'data-col': 'actions' }, action));
      });
      $('groups').replaceChildren(table(
        ['Group', 'State', 'Health', 'Members', { text: 'Lag', num: true }, { text: 'Pending', num: true },
          { text: 'In flight', num: true }, { text: 'Redelivering', num: true }, { text: 'Done rate', num: true }, { text: 'Processed', num: true }, { text: 'DLQ', num: true }, ''],
        rows, t.config.semantics === 'PUB_SUB'
          ? 'No consumer group yet: messages are kept for zero_subscription_retention (' + fmtDur(t.config.zero_subscription_retention) + ').'
          : 'No consumer yet.'));

      $('partitions').replaceChildren(table(
        [{ text: 'Partition', num: true }, { text: 'Low offset', num: true }, { text: 'High water', num: true },
          { text: 'Retained', num: true }, { text: 'Size', num: true }, 'Status'],
        st.partitions.map((p) => el('tr', { 'data-partition': p.partition },
          num(p.partition), num(p.low_offset), num(p.high_water), num(p.high_water - p.low_offset),
          el('td', { class: 'num', text: fmtBytes(p.bytes) }),
          el('td', {}, p.damaged ? badge('crit', 'DAMAGED', 'unavailable until repaired') : badge('ok', 'OK')))),
        'No partition statistics.'));

      const c = t.config;
      const kv = (k, v) => el('span', {}, k + ' ', el('b', { text: v }));
      $('config').replaceChildren(
        kv('semantics', c.semantics), kv('partitions', fmtNum(c.partitions)), kv('ack_wait', fmtDur(c.ack_wait)),
        kv('max_deliveries', fmtNum(c.max_deliveries)), kv('message_retention', fmtDur(c.message_retention)),
        kv('max_retention', fmtDur(c.max_retention)), kv('zero_subscription_retention', fmtDur(c.zero_subscription_retention)),
        kv('block_writes_on_zero_subscriptions', String(!!c.block_writes_on_zero_subscriptions)),
        kv('completion_tracking', c.completion_tracking || '—'), kv('zombie_ttl', fmtDur(c.zombie_ttl)),
        kv('max_message_bytes', fmtBytes(c.max_message_bytes)), kv('dedup_window', fmtDur(c.dedup_window)),
        ...(c.max_messages ? [kv('max_messages', fmtNum(c.max_messages))] : []),
        ...(c.max_bytes ? [kv('max_bytes', fmtBytes(c.max_bytes))] : []),
        ...(c.max_messages || c.max_bytes ? [kv('size_policy', (c.size_policy || 'keep_needed') +
          (t.size_bound_exceeded ? ' (exceeded: groups still need the oldest messages)' : ''))] : []));
    },
  };

  // groupOp pauses (after asking) or resumes a subscription.
  topicView.groupOp = async function groupOp(g, op) {
    if (op === 'pause') {
      const ok = await confirmDialog({
        title: `Pause group ${g.group}?`, ok: 'Pause group',
        text: `Pause group ${g.group} on topic ${g.topic}? It receives nothing until resumed, and keeps holding retention (up to zombie_ttl and max_retention).`,
      });
      if (!ok) return;
    }
    try {
      const res = await api(groupPath(g.topic, g.group) + '/' + op, { method: 'POST' });
      toast(`Group ${g.group} is ${res.state}.`);
    } catch (e) {
      if (e.status !== 401) toast(`${op === 'pause' ? 'Pause' : 'Resume'} failed: ${e}`, true);
    }
    refresh();
  };

  // ---------- view: a group's dead-letter queue ----------

  const dlqView = {
    pollMs: 5000, // a DLQ changes seldom; its page is the largest answer polled
    mount(main, r) {
      this.r = r;
      this.selected = new Set();
      this.inspect = null; // entry id shown in the inspector
      this.limit = DLQ_PAGE;
      this.entries = [];
      this.group = null;
      crumbs({ text: 'Topics', href: '#/' }, { text: r.topic, href: topicHref(r.topic) }, { text: 'DLQ of ' + r.group });
      main.append(
        el('div', { class: 'page-head', id: 'head' }, el('h1', { text: 'Dead letters of ' + r.group })),
        el('div', { class: 'cards', id: 'cards' }),
        el('div', { class: 'dlq-layout', id: 'layout' },
          el('div', { class: 'section' },
            el('div', { class: 'section-head' },
              el('h2', { text: 'Entries' }), el('div', { class: 'spacer' }),
              el('button', { type: 'button', id: 'replay-selected', onclick: () => this.act('replay', [...this.selected]) }),
              el('button', { type: 'button', id: 'purge-selected', class: 'danger', onclick: () => this.act('purge', [...this.selected]) }),
              el('button', { type: 'button', id: 'replay-all', onclick: () => this.act('replay', null), text: 'Replay all' }),
              el('button', { type: 'button', id: 'purge-all', class: 'danger', onclick: () => this.act('purge', null), text: 'Purge all' })),
            el('div', { id: 'entries' }, el('div', { class: 'empty', text: 'Loading…' })),
            el('div', { id: 'more' })),
          el('div', { class: 'section inspector', id: 'inspector', hidden: true })));
      this.drawButtons();
    },
    async load(r, gen) {
      // The list comes without payloads (a page of 1000 entries could be gigabytes); the
      // inspector fetches its one entry whole, once (an entry never changes).
      const [g, list] = await Promise.all([api(groupPath(r.topic, r.group)),
        api(groupPath(r.topic, r.group) + '/dlq?payload=false&limit=' + this.limit)]);
      if (stale(gen)) return;
      this.group = g;
      this.entries = list.entries;
      this.more = list.next_after_id !== undefined;
      const ids = new Set(this.entries.map((e) => e.id));
      for (const id of this.selected) if (!ids.has(id)) this.selected.delete(id);
      const want = this.inspect;
      if (want !== null && this.gone !== want) {
        if (!ids.has(want) && !this.more) {
          this.gone = want; // not in the whole DLQ: replayed or purged (entry ids are never reused)
        } else if (!ids.has(want) || !this.inspected || this.inspected.id !== want) {
          // Not fetched yet, or beyond the loaded page: ask for the entry itself.
          try {
            const entry = await api(groupPath(r.topic, r.group) + '/dlq/' + want);
            if (stale(gen)) return;
            if (this.inspect === want) this.inspected = entry;
          } catch (e) {
            if (e.status !== 404) throw e;
            if (stale(gen)) return;
            this.gone = want;
          }
        }
      }
      this.draw();
    },
    draw() {
      const sel = focusSel();
      this.drawAll();
      restoreFocus(sel);
    },
    drawAll() {
      const g = this.group;
      const r = this.r;
      $('head').replaceChildren(el('h1', { text: 'Dead letters of ' + r.group }), stateBadge(g.state),
        el('span', { class: 'muted' }, 'on topic ', el('a', { href: topicHref(r.topic), text: r.topic })));
      const reasons = new Map();
      for (const e of this.entries) reasons.set(e.reason, (reasons.get(e.reason) || 0) + 1);
      const top = [...reasons.entries()].sort((a, b) => b[1] - a[1])[0];
      const oldest = this.entries.length ? this.entries.reduce((a, e) => (e.dead_at < a ? e.dead_at : a), this.entries[0].dead_at) : null;
      $('cards').replaceChildren(
        card('Entries', fmtNum(g.dead_lettered), 'in this group\'s DLQ', g.dead_lettered ? 'warn' : null, 'dead_lettered'),
        card('Oldest shown', oldest ? fmtAgo(oldest) : '—', oldest ? fmtTime(oldest) : null, null, 'oldest'),
        card('Top reason', top ? top[0] : '—', top ? `${fmtNum(top[1])} of ${fmtNum(this.entries.length)} shown` : null, null, 'reason'),
        card('Group', g.state, `${fmtNum(g.member_count)} member(s) · lag ${fmtNum(g.lag)}`, STATE_LEVEL[g.state] === 'crit' ? 'crit' : null, 'group'));

      const all = this.entries.length > 0 && this.entries.every((e) => this.selected.has(e.id));
      const some = !all && this.entries.some((e) => this.selected.has(e.id));
      const head = [
        el('th', { class: 'check' }, el('input', {
          type: 'checkbox', id: 'select-all', 'aria-label': 'Select every entry shown', checked: all, indeterminate: some,
          onchange: (e) => { for (const x of this.entries) (e.target.checked ? this.selected.add(x.id) : this.selected.delete(x.id)); this.draw(); },
        })),
        { text: 'Entry', num: true }, 'Message', 'Reason', { text: 'Attempts', num: true }, 'Last error', 'Dead at'];
      const rows = this.entries.map((e) => el('tr', {
        class: 'clickable' + (this.inspect === e.id ? ' selected' : ''), 'data-entry': e.id, tabindex: 0,
        title: 'Inspect this entry', 'aria-selected': String(this.inspect === e.id),
        onclick: (ev) => { if (ev.target.closest('input')) return; this.show(e); },
        onkeydown: (ev) => { if (ev.key === 'Enter' && !ev.target.closest('input')) this.show(e); },
      },
      el('td', { class: 'check' }, el('input', {
        type: 'checkbox', 'aria-label': 'Select entry ' + e.id, checked: this.selected.has(e.id),
        onchange: (ev) => { (ev.target.checked ? this.selected.add(e.id) : this.selected.delete(e.id)); this.draw(); },
      })),
      num(e.id, 'id'),
      el('td', { class: 'mono', 'data-col': 'message' }, e.message.id, e.message.key !== undefined ? el('div', { class: 'members', text: 'key ' + e.message.key }) : null),
      el('td', { 'data-col': 'reason' }, badge('warn', e.reason)),
      num(e.attempts, 'attempts'),
      el('td', { class: 'err', 'data-col': 'last_error', text: e.last_error || '—' }),
      el('td', { 'data-col': 'dead_at', title: fmtAgo(e.dead_at), text: fmtTime(e.dead_at) })));
      $('entries').replaceChildren(table(head, rows, 'The dead-letter queue is empty.'));
      const more = $('more');
      more.replaceChildren();
      if (this.more) {
        if (this.limit < DLQ_MAX) {
          more.append(el('div', { class: 'note' }, `Showing the first ${fmtNum(this.entries.length)} entries. `,
            el('button', { type: 'button', class: 'ghost', text: 'Show more', onclick: () => { this.limit = Math.min(this.limit + DLQ_PAGE, DLQ_MAX); refresh(); } })));
        } else {
          more.append(el('div', { class: 'note', text: `Showing the first ${fmtNum(this.entries.length)} entries; "Replay all" and "Purge all" act on every entry.` }));
        }
      }
      this.drawButtons();
      this.drawInspector();
    },
    drawButtons() {
      const n = this.selected.size;
      const count = this.group ? this.group.dead_lettered : 0;
      $('replay-selected').textContent = `Replay selected (${n})`;
      $('purge-selected').textContent = `Purge selected (${n})`;
      $('replay-selected').disabled = $('purge-selected').disabled = n === 0;
      $('replay-all').disabled = $('purge-all').disabled = count === 0 && this.entries.length === 0;
    },
    // show opens the inspector on entry e, then fetches the entry with its payload.
    async show(e) {
      if (this.inspect === e.id) return;
      this.inspect = e.id;
      this.draw();
      const gen = ui.gen;
      try {
        const entry = await api(groupPath(this.r.topic, this.r.group) + '/dlq/' + e.id);
        if (stale(gen) || this.inspect !== e.id) return;
        this.inspected = entry;
      } catch (err) {
        if (stale(gen) || this.inspect !== e.id || err.status === 401) return;
        if (err.status !== 404) { toast(`Reading entry ${e.id} failed: ${err}`, true); return; }
        this.gone = e.id;
      }
      this.draw();
    },
    drawInspector() {
      const box = $('inspector');
      $('layout').classList.toggle('inspecting', this.inspect !== null);
      box.hidden = this.inspect === null;
      if (this.inspect === null) return;
      const close = el('button', { type: 'button', class: 'ghost', text: 'Close', 'aria-label': 'Close the inspector', onclick: () => { this.inspect = null; this.inspected = null; this.draw(); } });
      const gone = this.gone === this.inspect;
      const e = !gone && this.inspected && this.inspected.id === this.inspect ? this.inspected : null;
      if (!e) {
        box.replaceChildren(el('div', { class: 'section-head' }, el('h2', { text: `Entry ${this.inspect}` }), el('div', { class: 'spacer' }), close),
          gone ? el('div', { class: 'empty', id: 'inspect-gone', text: 'This entry is no longer in the DLQ: it was replayed or purged.' })
            : el('div', { class: 'empty', id: 'inspect-loading', text: 'Loading…' }));
        return;
      }
      const m = e.message;
      const dl = el('dl', { class: 'kv' });
      const row = messageFields(dl, m);
      row('Reason', e.reason, 'reason');
      row('Attempts', fmtNum(e.attempts), 'attempts');
      row('Last error', e.last_error || '—', 'last_error');
      row('Dead at', fmtTime(e.dead_at) + ' (' + fmtAgo(e.dead_at) + ')', 'dead_at');
      box.replaceChildren(
        el('div', { class: 'section-head' }, el('h2', { text: `Entry ${e.id}` }), el('div', { class: 'spacer' }), close),
        el('div', { class: 'body' }, dl, messageContent(m, { headers: 'inspect-headers', payload: 'inspect-payload' })),
        el('div', { class: 'actions' },
          el('button', { type: 'button', id: 'inspect-replay', text: 'Replay', onclick: () => this.act('replay', [e.id]) }),
          el('button', { type: 'button', id: 'inspect-purge', class: 'danger', text: 'Purge', onclick: () => this.act('purge', [e.id]) })));
    },
    // act replays or purges the entries ids (null: all) after asking.
    async act(kind, ids) {
      const r = this.r;
      const n = ids ? ids.length : this.group ? this.group.dead_lettered : 0;
      const what = ids ? `${fmtNum(n)} entr${n === 1 ? 'y' : 'ies'}` : `all ${fmtNum(n)} entries`;
      const ok = await confirmDialog(kind === 'replay'
        ? { title: 'Replay ' + what + '?', ok: 'Replay',
          text: `Replay ${what} of the DLQ to group ${r.group} on topic ${r.topic}? The messages are delivered again to this group only, at once, with a fresh attempt count.` }
        : { title: 'Purge ' + what + '?', ok: 'Purge', danger: true,
          text: `Purge ${what} from the DLQ of group ${r.group} on topic ${r.topic}? The messages are removed for good: this cannot be undone.` });
      if (!ok) return;
      try {
        const res = await api(groupPath(r.topic, r.group) + '/dlq/' + kind, { method: 'POST', body: ids ? { ids } : { all: true } });
        const done = kind === 'replay' ? res.replayed : res.purged;
        toast(`${kind === 'replay' ? 'Replayed' : 'Purged'} ${fmtNum(done)} entr${done === 1 ? 'y' : 'ies'}.`);
        this.selected.clear();
        if (this.inspect !== null && (!ids || ids.includes(this.inspect))) this.gone = this.inspect;
      } catch (e) {
        if (e.status !== 401) toast(`${kind === 'replay' ? 'Replay' : 'Purge'} failed: ${e}`, true);
      }
      refresh();
    },
  };

  // ---------- routing and the refresh loop ----------

  const views = { topics: topicsView, topic: topicView, dlq: dlqView };

  // parseRoute reads the fragment: #/, #/topics/<topic>, #/topics/<topic>/groups/<group>/dlq.
  function parseRoute() {
    let parts;
    try {
      parts = location.hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
    } catch {
      return { view: 'topics' };
    }
    if (parts[0] === 'topics' && parts.length >= 2) {
      if (parts.length === 5 && parts[2] === 'groups' && parts[4] === 'dlq') return { view: 'dlq', topic: parts[1], group: parts[3] };
      if (parts.length === 2) return { view: 'topic', topic: parts[1] };
    }
    return { view: 'topics' };
  }

  function route() {
    ui.route = parseRoute();
    ui.gen++;
    const main = $('main');
    main.replaceChildren();
    hideBanner();
    views[ui.route.view].mount(main, ui.route);
    refresh();
  }

  let running = null;
  let again = false;

  // refresh loads the current view once (or once more after the load under way) and schedules the
  // next poll.
  function refresh() {
    if (running) { again = true; return running; }
    running = (async () => {
      try {
        do {
          again = false;
          await loadOnce();
        } while (again);
      } finally {
        running = null;
        schedule();
      }
    })();
    return running;
  }

  async function loadOnce() {
    if (ui.authNeeded) return;
    const gen = ui.gen;
    const r = ui.route;
    const started = performance.now();
    try {
      const focused = focusSel();
      await views[r.view].load(r, gen);
      if (stale(gen)) return;
      restoreFocus(focused);
      ui.lastOK = new Date();
      hideBanner();
      if (!ui.paused) setLive('ok', 'live · updated ' + fmtTime(ui.lastOK).slice(11));
      document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
    } catch (e) {
      if (stale(gen) || e.status === 401) return;
      if (!(e instanceof APIError)) e = new APIError(0, 'UI_ERROR', e.message);
      if (e.status === 404) {
        showBanner(`${e.code}: ${e.message}. It may have been deleted.`);
      } else if (e.status === 403) {
        showBanner(`${e.code}: ${e.message}. Your token does not give admin rights here.`);
      } else {
        showBanner(`${e.code}: ${e.message}` + (ui.lastOK ? ` (last good data ${fmtTime(ui.lastOK).slice(11)}; retrying every ${Math.round(pollDelay() / 1000)} s)` : ''));
      }
      setLive('down', e.status === 0 ? 'broker unreachable' : 'error ' + e.status);
    } finally {
      ui.lastLoadMs = performance.now() - started;
      if (!ui.authNeeded) $('signout').hidden = !sessionStorage.getItem(TOKEN_KEY);
    }
  }

  // pollDelay is the time to the next poll: the view's interval, stretched to SLOW_FACTOR times
  // the last load's duration when the broker answers slowly, so that a loaded broker is not kept
  // busier by its dashboard.
  function pollDelay() {
    const base = (ui.route && views[ui.route.view].pollMs) || POLL_MS;
    return Math.min(Math.max(base, Math.round(SLOW_FACTOR * (ui.lastLoadMs || 0))), Math.max(base, POLL_MAX_MS));
  }

  function schedule() {
    clearTimeout(ui.timer);
    if (ui.paused || ui.authNeeded) return;
    const ms = pollDelay();
    document.body.dataset.poll = String(ms); // for the tests
    ui.timer = setTimeout(() => { if (!document.hidden) refresh(); else schedule(); }, ms);
  }

  function init() {
    $('pause').addEventListener('click', () => {
      ui.paused = !ui.paused;
      $('pause').textContent = ui.paused ? 'Resume updates' : 'Pause updates';
      if (ui.paused) { clearTimeout(ui.timer); setLive('paused', 'paused'); } else refresh();
    });
    $('signout').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      samples.clear();
      route();
    });
    $('login-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const tok = $('token').value.trim();
      if (!tok) return;
      sessionStorage.setItem(TOKEN_KEY, tok);
      $('token').value = '';
      $('login').hidden = true;
      ui.authNeeded = false;
      route();
    });
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && $('confirm').hidden && ui.route.view === 'dlq' && dlqView.inspect !== null) {
        dlqView.inspect = null;
        dlqView.inspected = null;
        dlqView.draw();
      }
    });
    document.addEventListener('visibilitychange', () => { if (!document.hidden && !ui.paused) refresh(); });
    window.addEventListener('hashchange', route);
    route();
  }

  init();
})();
