// couchq dashboard: polls the JSON endpoints of the same server and draws
// with uPlot. Every path is relative to the page, so that the handler
// works mounted under a prefix (http.StripPrefix) as well as at the root. No frameworks, no network beyond couchq itself. Everything
// from the server is put in the page as text (textContent), never as HTML.
(function () {
  'use strict';
  var FAST = 5000, SLOW = 15000; // ms between polls: tables, plots
  // s: a site's heartbeat older than this is marked stale. A few of the
  // workers' default heartbeat intervals (10 s), plus the links' delay.
  var SITE_FRESH = 60;
  var creds = null; // "Basic ..." once logged in; kept in memory only
  var charts = {};
  var notice = ''; // what the last action did, shown until the next one
  var $ = function (id) { return document.getElementById(id); };

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function td(text, cls) { return el('td', text, cls); }
  function age(s) {
    if (!s) return '—';
    if (s < 120) return Math.round(s) + ' s';
    if (s < 7200) return Math.round(s / 60) + ' min';
    if (s < 172800) return (s / 3600).toFixed(1) + ' h';
    return (s / 86400).toFixed(1) + ' d';
  }
  function when(unix) { return unix ? new Date(unix * 1000).toLocaleString() : '—'; }

  // headers of every request: the login once there is one, and the mark
  // that makes the server's 401 leave the asking to this page's form
  // rather than the browser's own dialog.
  function headers() {
    var h = {Accept: 'application/json', 'X-Couchq-Page': '1'};
    if (creds) h.Authorization = creds;
    return h;
  }

  // The reads need the login too when the server says so (couchq serve
  // --read-auth): a 401 asks for it in the form. A 401 to a request sent
  // before the user logged in (or in again) says nothing of the new login:
  // it must not drop it, or a refresh under way while the user logged in
  // logs them out. Such a request fails quietly (stale); the refresh the
  // login started reads with it.
  function staleAnswer() {
    var e = new Error('answered for an earlier login');
    e.stale = true;
    return e;
  }
  function getJSON(path) {
    var sent = creds;
    return fetch(path, {headers: headers()}).then(function (r) {
      return r.json().then(function (body) {
        if (r.status === 401) {
          if (creds !== sent) throw staleAnswer();
          creds = null;
          showWho(null, true);
          askLogin();
          throw new Error('log in with a CouchDB user to see the queue');
        }
        if (!r.ok) throw new Error(path + ': ' + (body.error || r.status));
        return body;
      });
    });
  }

  // askLogin puts the cursor in the login form, unless it is there
  // already: every refresh without a login is answered 401, and moving
  // the cursor to the user field then sent the rest of a password being
  // typed into it.
  function askLogin() {
    if (!$('login').contains(document.activeElement)) $('user').focus();
  }

  function act(path, label) {
    if (!creds) { setStatus('log in to ' + label, true); askLogin(); return Promise.resolve(); }
    var sent = creds;
    return fetch(path, {method: 'POST', headers: headers()})
      .then(function (r) {
        return r.json().then(function (body) {
          if (r.status === 401 && creds === sent) { creds = null; showWho(null); }
          if (!r.ok) throw new Error(label + ': ' + (body.error || r.status));
          notice = label + ' ' + decodeURIComponent(path.split('/')[2]) +
            (r.status === 202 ? ': requested from site ' + body.forwarded.site + ', its owner, which applies it when the request reaches it' : ': done');
          document.body.dataset.done = path;
          refreshFast();
        });
      }).catch(function (e) { notice = ''; setStatus(e.message, true); });
  }
  function actButton(label, path) {
    var b = el('button', label, 'act');
    b.type = 'button';
    b.dataset.action = path;
    b.addEventListener('click', function () { act(path, label); });
    return b;
  }

  function setStatus(msg, bad) {
    var s = $('status');
    s.textContent = msg;
    s.className = bad ? 'error' : 'muted';
  }
  var readsNeedLogin = false; // once a read was answered 401
  function showWho(user, needed) {
    if (needed) readsNeedLogin = true;
    $('who').textContent = user ? 'signed in as ' + user :
      (readsNeedLogin ? 'reading needs a CouchDB user' : 'actions need a CouchDB user');
    document.body.dataset.user = user || '';
  }

  $('login').addEventListener('submit', function (ev) {
    ev.preventDefault();
    var u = $('user').value, p = $('password').value;
    creds = 'Basic ' + btoa(unescape(encodeURIComponent(u + ':' + p)));
    $('password').value = '';
    showWho(u);
    refreshFast();
    refreshSlow();
  });

  // --- tables -----------------------------------------------------------

  function fill(table, rows) {
    var body = $(table).tBodies[0];
    body.replaceChildren.apply(body, rows);
  }

  function renderBatches(batches) {
    $('batches-section').hidden = batches.length === 0;
    fill('batches', batches.map(function (b) {
      var tr = el('tr');
      var finished = b.done + b.failed + b.cancelled;
      tr.append(td(b.id), td(b.size, 'num'), td(b.done, 'num'), td(b.failed, 'num'), td(b.cancelled, 'num'),
        td(b.pending, 'num'), td(b.size ? Math.floor(100 * finished / b.size) + ' %' : '', 'num'));
      return tr;
    }));
  }

  function renderQueues(queues) {
    var sel = $('type'), chosen = sel.value;
    var known = {};
    Array.prototype.forEach.call(sel.options, function (o) { known[o.value] = true; });
    fill('queues', queues.map(function (q) {
      if (!known[q.type]) { sel.appendChild(el('option', q.type)).value = q.type; }
      var tr = el('tr');
      tr.dataset.type = q.type;
      tr.append(td(q.type), td(q.due, 'num'), td(q.scheduled, 'num'), td(q.waiting || 0, 'num'), td(q.running, 'num'),
        td(q.failed, 'num'), td(q.paused ? 'paused' : age(q.oldest_due_age), 'num'),
        td(q.paused ? 'paused' : 'no', q.paused ? 'paused' : ''));
      var cell = td();
      var t = encodeURIComponent(q.type);
      cell.append(q.paused ? actButton('Resume', 'api/types/' + t + '/resume') : actButton('Pause', 'api/types/' + t + '/pause'));
      tr.append(cell);
      return tr;
    }));
    if (queues.length === 0) fill('queues', [emptyRow(9, 'no jobs yet')]);
    sel.value = chosen;
  }

  function emptyRow(cols, text) {
    var tr = el('tr'), c = td(text, 'muted');
    c.colSpan = cols;
    tr.append(c);
    return tr;
  }

  function renderWorkers(ws) {
    var alive = ws.filter(function (w) { return w.alive; }).length;
    $('workers-summary').textContent = alive + ' alive, ' + (ws.length - alive) + ' dead';
    fill('workers', ws.map(function (w) {
      var tr = el('tr');
      tr.append(td(w.claimant), td(w.alive ? 'alive' : 'dead', w.alive ? 'alive' : 'dead'),
        td((w.types || []).join(', ')), td(w.running + ' / ' + (w.concurrency * Math.max((w.types || []).length, 1)), 'num'),
        td(Math.round(w.utilization * 100) + ' %', 'num'), td(w.completed, 'num'), td(w.failed, 'num'),
        td(age(w.heartbeat_age) + ' ago'));
      return tr;
    }));
    if (ws.length === 0) fill('workers', [emptyRow(8, 'no worker has registered')]);
  }

  // Sites: shown only for a queue of several databases. A heartbeat's age
  // is how far behind this database's copy of that site is, plus up to a
  // heartbeat interval.
  function renderSites(r) {
    var sites = r.sites || [];
    $('sites-section').hidden = sites.length === 0;
    if (sites.length === 0) return;
    var fresh = function (s) { return s.heartbeat_age_seconds !== null && s.heartbeat_age_seconds <= SITE_FRESH; };
    var stale = sites.filter(function (s) { return !fresh(s); }).length;
    $('sites-summary').textContent = sites.length + ' sites' + (stale ? ', ' + stale + ' without a recent heartbeat' : '');
    fill('sites', sites.map(function (s) {
      var tr = el('tr'), beat = s.heartbeat_age_seconds;
      tr.dataset.site = s.site;
      tr.append(td(s.site), td(s.default ? 'yes' : ''),
        td(beat === null ? 'never' : age(Math.max(beat, 1)) + ' ago' + (s.catching_up ? ' (catching up: not claiming yet)' : ''),
          fresh(s) ? 'alive' : 'dead'),
        td(s.taken_over_by || ''));
      return tr;
    }));
    var links = r.links;
    $('links').hidden = !links;
    if (!links) return;
    fill('links', links.map(function (l) {
      var tr = el('tr');
      tr.append(td(l.from + ' → ' + l.to), td(l.state, l.state === 'running' ? 'alive' : 'dead'),
        td(l.changes_pending === null ? '?' : l.changes_pending, 'num'), td(l.docs_written, 'num'), td(l.error || '', 'error'));
      return tr;
    }));
    if (links.length === 0) fill('links', [emptyRow(5, 'this server holds no links for the database')]);
  }

  // payloadText is how a job's payload shows: "hidden" where the server
  // keeps the type's payloads back (couchq serve --hide-payload).
  function payloadText(job) {
    if (job.payload_hidden) return 'payload: hidden';
    return 'payload: ' + (job.payload === undefined ? 'none' : JSON.stringify(job.payload));
  }

  function historyDetails(job) {
    var d = el('details');
    d.append(el('summary', (job.history || []).length + ' events'));
    d.append(el('pre', payloadText(job), 'payload'));
    d.append(el('pre', (job.history || []).map(function (h) {
      return h.at + '  ' + h.event + (h.by ? '  by ' + h.by : '') + (h.attempt ? '  attempt ' + h.attempt : '') + (h.error ? '\n    ' + h.error : '');
    }).join('\n'), 'history'));
    return d;
  }

  function jobActions(job) {
    var cell = td(), id = encodeURIComponent(job._id);
    if (job.status === 'failed' || job.status === 'cancelled') cell.append(actButton('Retry', 'api/jobs/' + id + '/retry'));
    if (job.status === 'queued' || job.status === 'running' || job.status === 'waiting') cell.append(actButton('Cancel', 'api/jobs/' + id + '/cancel'));
    return cell;
  }

  function renderFailed(jobs) {
    fill('failed', jobs.map(function (j) {
      var tr = el('tr');
      tr.dataset.job = j._id;
      var err = td();
      err.append(el('div', j.last_error || ''), historyDetails(j));
      tr.append(td(j._id), td(j.worker), td(j.attempts, 'num'), td(when(j.finished_at)), err, jobActions(j));
      return tr;
    }));
    if (jobs.length === 0) fill('failed', [emptyRow(6, 'no failed jobs')]);
  }

  // statusCell is a job's status with, when its handler or agent reported
  // any, how far it got: a bar when the total is known, and the note.
  function statusCell(job) {
    var cell = td(job.status || 'queued'), p = job.progress;
    if (!p) return cell;
    var text = p.total > 0 ? p.done + '/' + p.total + ' (' + Math.floor(100 * p.done / p.total) + '%)' : String(p.done);
    var div = el('div', null, 'progress');
    if (p.total > 0) {
      var bar = el('progress');
      bar.max = p.total;
      bar.value = p.done;
      div.append(bar, ' ');
    }
    div.append(text + (p.note ? ' ' + p.note : ''));
    if (p.at) div.title = 'reported ' + new Date(p.at * 1000).toLocaleString();
    cell.append(div);
    return cell;
  }

  function renderJobs(jobs) {
    fill('jobs', jobs.filter(function (j) { return j._id; }).map(function (j) {
      var tr = el('tr');
      tr.dataset.job = j._id;
      var err = td();
      err.append(el('div', j.last_error || ''), historyDetails(j));
      tr.append(td(j._id), td(j.worker), statusCell(j), td(j.attempts || 0, 'num'),
        td(j.claimed ? j.claimed_by : ''), err, jobActions(j));
      return tr;
    }));
    if (jobs.length === 0) fill('jobs', [emptyRow(7, 'none')]);
  }

  // --- plots ------------------------------------------------------------

  var COLORS = ['#3182ce', '#38a169', '#e53e3e', '#dd6b20', '#805ad5', '#718096'];

  function plot(id, labels, data, yLabel) {
    var box = $(id);
    var points = 0;
    for (var i = 1; i < data.length; i++) {
      for (var k = 0; k < data[i].length; k++) if (data[i][k] !== null) points++;
    }
    box.dataset.points = String(points);
    var width = Math.max(box.clientWidth - 16, 300);
    var c = charts[id];
    if (c && c.series.length === labels.length + 1) {
      c.setData(data);
      if (c.width !== width) c.setSize({width: width, height: 220});
      return;
    }
    if (c) c.destroy();
    charts[id] = new uPlot({
      width: width, height: 220,
      scales: {x: {time: true}},
      axes: [{}, {label: yLabel, size: 60}],
      series: [{}].concat(labels.map(function (l, i) {
        return {label: l, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
          points: {show: data[0].length < 100}};
      }))
    }, data, box);
  }

  function renderSeries(s) {
    var perMin = s.step / 60;
    var rate = function (xs) { return xs.map(function (n) { return n / perMin; }); };
    plot('chart-throughput', ['started', 'finished'], [s.t, rate(s.started), rate(s.finished)], 'jobs/min');
    plot('chart-failures', ['failed for good', 'failed, retry scheduled'], [s.t, rate(s.failed), rate(s.retried)], 'jobs/min');
    plot('chart-depth', ['waiting'], [s.t, s.depth], 'jobs');
    plot('chart-timings', ['wait p50', 'wait p95', 'service p50', 'service p95'],
      [s.t, s.wait_p50, s.wait_p95, s.service_p50, s.service_p95], 'seconds');
    $('series-note').textContent = (s.type || 'all types') + ', ' + (s.step >= 3600 ? 'per hour' : s.step / 60 + '-minute buckets') +
      (s.truncated ? '; percentiles from the newest timings only' : '');
  }

  // --- polling ----------------------------------------------------------

  var fastTimer = null, slowTimer = null;

  function refreshFast() {
    clearTimeout(fastTimer);
    var status = encodeURIComponent($('jobs-status').value), type = encodeURIComponent($('type').value);
    return Promise.all([
      getJSON('api/queues').then(renderQueues),
      getJSON('api/batches').then(renderBatches),
      getJSON('api/workers').then(renderWorkers),
      getJSON('api/failed?type=' + type).then(renderFailed),
      getJSON('api/jobs?limit=50&status=' + status + '&type=' + type).then(renderJobs),
      getJSON('api/sites').then(renderSites)
    ]).then(function () {
      setStatus((notice ? notice + ' · ' : '') + 'updated ' + new Date().toLocaleTimeString());
    }).catch(function (e) { if (!e.stale) setStatus(e.message, true); })
      .then(function () { fastTimer = setTimeout(refreshFast, FAST); });
  }

  function refreshSlow() {
    clearTimeout(slowTimer);
    var q = 'api/series?window=' + encodeURIComponent($('window').value) + '&type=' + encodeURIComponent($('type').value);
    return getJSON(q).then(function (s) {
      renderSeries(s);
      document.body.dataset.loaded = '1';
    }).catch(function (e) { if (!e.stale) setStatus(e.message, true); })
      .then(function () { slowTimer = setTimeout(refreshSlow, SLOW); });
  }

  $('window').addEventListener('change', refreshSlow);
  $('type').addEventListener('change', function () { refreshSlow(); refreshFast(); });
  $('jobs-status').addEventListener('change', refreshFast);
  window.addEventListener('resize', function () { refreshSlow(); });
  showWho(null);
  refreshFast();
  refreshSlow();
})();
