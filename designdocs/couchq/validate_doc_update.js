function (newDoc, oldDoc, userCtx, secObj) {
  // validate_doc_update: first who may write what, then rejects WorkItems
  // that no worker could run, with a forbidden message naming the field and
  // the reason. Other documents pass.
  //
  // Roles: when the database's _security has a "couchq" section (couchq init
  // --workers/--producers writes it), a producer may only create jobs; a
  // worker may do anything to couchq's documents; admins may do anything.
  // Without the section every member may do anything (couchq's behaviour
  // before roles).
  var couchqDocs = ['WorkItem', 'TypeControl', 'Worker', 'RateSlot', 'RunSlot', 'PeriodicSchedule', 'SlotReservation', 'Sequence', 'Sites', 'SiteHeartbeat', 'SiteRequest'];
  function inGroup(group) {
    if (!group || !userCtx) {
      return false;
    }
    if (userCtx.name && group.names && group.names.indexOf(userCtx.name) >= 0) {
      return true;
    }
    var roles = userCtx.roles || [];
    for (var r = 0; r < roles.length; r++) {
      if (group.roles && group.roles.indexOf(roles[r]) >= 0) {
        return true;
      }
    }
    return false;
  }
  var roleRules = secObj && secObj.couchq;
  var isAdmin = userCtx && ((userCtx.roles || []).indexOf('_admin') >= 0 || inGroup(secObj && secObj.admins));
  var docType = (newDoc._deleted === true && oldDoc) ? oldDoc.type : newDoc.type;
  // What a write replaces counts as much as what it writes: a job (or a
  // pause) written over with a document of no couchq type is destroyed.
  var oldType = (oldDoc && oldDoc._deleted !== true) ? oldDoc.type : undefined;
  // couchq's documents have ids of their own (protocol's documentIDPrefixes;
  // jobs enqueued through couchq start with "job:"): what stands at one is
  // read as that document, whatever a write there calls itself.
  var reservedIds = [['job:', 'WorkItem'], ['control:', 'TypeControl'], ['worker:', 'Worker'],
    ['request:', 'SiteRequest'], ['periodic:', 'PeriodicSchedule'], ['site:', 'SiteHeartbeat'],
    ['ratelimit:', 'RateSlot'], ['runslot:', 'RunSlot'], ['slot:', 'SlotReservation'], ['sequence:', 'Sequence']];
  var reserved = newDoc._id === 'sites' ? 'Sites' : undefined;
  for (var p = 0; p < reservedIds.length && !reserved; p++) {
    if (newDoc._id.indexOf(reservedIds[p][0]) === 0) {
      reserved = reservedIds[p][1];
    }
  }
  var touchesCouchq = couchqDocs.indexOf(docType) >= 0 || couchqDocs.indexOf(oldType) >= 0 || reserved !== undefined;
  var who = (userCtx && userCtx.name) ? 'user ' + userCtx.name : 'an anonymous user';
  if (roleRules && !isAdmin && !inGroup(roleRules.workers)) {
    // A replicated revision (a replication into the database, or
    // _bulk_docs with new_edits=false) is judged against the stored
    // revision it descends from, or none, not against the one that stands:
    // with a later generation or a branch of its own it can win over a job
    // or a pause it was never compared with. An edit names the revision it
    // replaces, which is oldDoc; a replicated revision names itself. Only
    // what cannot win over anything is let in: a producer's new job, made
    // elsewhere and never edited there.
    var revs = newDoc._revisions;
    var replicated = revs && !(oldDoc && oldDoc._rev === revs.start + '-' + revs.ids[0]);
    if (replicated && !(inGroup(roleRules.producers) && !oldDoc && revs.start === 1 &&
        newDoc.type === 'WorkItem' && newDoc._deleted !== true)) {
      throw ({forbidden: who + ' may not write replicated revisions into this database (a replication, or _bulk_docs with new_edits=false), ' +
        'but for a producer\'s new jobs never edited: replicate with a couchq worker\'s or an admin\'s credentials'});
    }
  }
  if (roleRules && !isAdmin && touchesCouchq && !inGroup(roleRules.workers)) {
    if (!inGroup(roleRules.producers)) {
      throw ({forbidden: who + ' is neither a couchq worker nor a producer of this database (couchq init --workers/--producers)'});
    }
    // A producer's job is fresh: not claimed, not started, not finished,
    // and its history tells of nothing but its enqueueing. A settled
    // conflict keeps the branch that shows work over a history that shows
    // none (a producer's revision planted beside a job that ran), so a
    // producer must not be able to write work into a history.
    var onlyEnqueued = function (h) {
      if (h == null) {
        return true;
      }
      if (!Array.isArray(h)) {
        return false;
      }
      for (var e = 0; e < h.length; e++) {
        if (!h[e] || h[e].event !== 'enqueued') {
          return false;
        }
      }
      return true;
    };
    var fresh = function (d, attempts) {
      return d.type === 'WorkItem' && d.claimed !== true && d.claimed_by == null && d.lease_until == null &&
        d.claimed_at == null && d.started_at == null && d.finished_at == null && d.last_error == null &&
        (d.status == null || d.status === 'queued' || d.status === 'waiting') && d.released_at == null &&
        (d.attempts || 0) === attempts && d.result == null && onlyEnqueued(d.history) &&
        d.child_of == null; // a child is its parent's handler's to enqueue
    };
    var finished = function (d) {
      return d.status === 'done' || d.status === 'failed' || d.status === 'cancelled';
    };
    var allowed;
    if (docType !== 'WorkItem' || newDoc._deleted === true) {
      allowed = false;
    } else if (!oldDoc || oldDoc._deleted === true) {
      // A new job; or the archived copy of a finished unique job, which an
      // enqueue of its key makes before writing the new one (couchq.ArchiveID).
      allowed = fresh(newDoc, 0) ||
        (newDoc._id.indexOf('job:unique:') === 0 && newDoc._id.indexOf('~') > 0 && finished(newDoc));
    } else if (finished(oldDoc) && oldDoc.claimed !== true) {
      allowed = fresh(newDoc, 0); // a finished job's id enqueued again
    } else {
      // Editing a job no one holds (its payload, its date) keeps its attempts.
      allowed = fresh(oldDoc, oldDoc.attempts || 0) && fresh(newDoc, oldDoc.attempts || 0);
    }
    if (allowed && newDoc._id.indexOf('job:periodic:') === 0) {
      // A periodic schedule's ticks are enqueued at ids known in advance
      // by the workers that run the schedule: a job written there first
      // would stand in for the tick, which then never runs.
      throw ({forbidden: who + ' may not write a job at ' + JSON.stringify(newDoc._id) + ': ids starting so are the ticks of periodic schedules, which couchq workers enqueue'});
    }
    if (allowed && reserved && reserved !== 'WorkItem') {
      throw ({forbidden: who + ' may not write a job at ' + JSON.stringify(newDoc._id) + ': ids starting so are couchq\'s ' + reserved + ' documents\''});
    }
    if (!allowed) {
      throw ({forbidden: who + ' is a couchq producer: producers may create jobs and edit ones that never ran (but not children, with child_of), ' +
        'but claiming, finishing, cancelling, deleting or editing a job that ran, and the queue\'s other documents, ' +
        'need the worker role (couchq init --workers)'});
    }
  }
  // Deletions otherwise always pass so that purging and conflict clean-up
  // never fail. The rules below match couchq's decoder (couchq/workitem.go):
  // what passes here, couchq can run; null counts as missing, as it does there.
  if (newDoc._deleted === true) {
    return;
  }
  if (newDoc.type === 'TypeControl') {
    // A job type's control document (couchq.TypeControl): workers follow it.
    if (typeof newDoc.worker !== 'string' || newDoc.worker === '') {
      throw ({forbidden: 'invalid TypeControl: worker must be the job type, a non-empty string'});
    }
    if (newDoc._id !== 'control:' + newDoc.worker) {
      throw ({forbidden: 'invalid TypeControl: the id must be control:' + newDoc.worker + ', got ' + JSON.stringify(newDoc._id)});
    }
    if (typeof newDoc.paused !== 'boolean') {
      throw ({forbidden: 'invalid TypeControl: paused must be a boolean'});
    }
    return;
  }
  if (newDoc.type === 'SlotReservation') {
    // A slot reservation (couchq.Reservation): its id is derived from the
    // sequence and the slot, which is what makes a slot taken once.
    if (typeof newDoc.sequence !== 'string' || newDoc.sequence === '' || newDoc.sequence.indexOf(':') >= 0 ||
        typeof newDoc.slot !== 'string' || newDoc.slot === '') {
      throw ({forbidden: 'invalid SlotReservation: sequence (without \':\') and slot must be non-empty strings'});
    }
    if (newDoc._id !== 'slot:' + newDoc.sequence + ':' + newDoc.slot) {
      throw ({forbidden: 'invalid SlotReservation: the id must be slot:' + newDoc.sequence + ':' + newDoc.slot + ', got ' + JSON.stringify(newDoc._id)});
    }
    if (['reserved', 'used', 'free'].indexOf(newDoc.state) < 0) {
      throw ({forbidden: 'invalid SlotReservation: state must be reserved, used or free, got ' + JSON.stringify(newDoc.state)});
    }
    if (typeof newDoc.expires_at !== 'number' || !isFinite(newDoc.expires_at) ||
        typeof newDoc.ordinal !== 'number' || Math.floor(newDoc.ordinal) !== newDoc.ordinal) {
      throw ({forbidden: 'invalid SlotReservation: expires_at must be a number of Unix seconds and ordinal a whole number'});
    }
    return;
  }
  if (newDoc.type !== 'WorkItem') {
    return;
  }
  function reject(field, why) {
    throw ({forbidden: 'invalid WorkItem: ' + field + ' ' + why});
  }
  function isNum(v) {
    return typeof v === 'number' && isFinite(v);
  }
  function given(v) {
    return v !== undefined && v !== null;
  }
  function describe(v) {
    if (v === null) {
      return 'null';
    }
    if (Array.isArray(v)) {
      return 'an array';
    }
    return 'a ' + typeof v;
  }
  if (!('worker' in newDoc)) {
    reject('worker', 'is required: the job type, a non-empty string');
  }
  if (typeof newDoc.worker !== 'string') {
    reject('worker', 'must be a string, got ' + describe(newDoc.worker));
  }
  if (newDoc.worker === '') {
    reject('worker', 'must not be empty');
  }
  // Control characters (a newline, a terminal's escape) in a job type
  // would break every table that lists it, or reach the terminal of the
  // operator who reads it.
  if (/[\u0000-\u001f\u007f]/.test(newDoc.worker)) {
    reject('worker', 'must not contain control characters, got ' + JSON.stringify(newDoc.worker));
  }
  if (/[\u0000-\u001f\u007f]/.test(newDoc._id)) {
    reject('_id', 'must not contain control characters, got ' + JSON.stringify(newDoc._id));
  }
  if (given(newDoc.date) && !isNum(newDoc.date)) {
    reject('date', 'must be a number of Unix seconds (or null for now), got ' + describe(newDoc.date));
  }
  var statuses = ['waiting', 'queued', 'running', 'done', 'failed', 'cancelled'];
  if (given(newDoc.status) && statuses.indexOf(newDoc.status) < 0) {
    reject('status', 'must be one of ' + statuses.join(', ') + ', got ' + JSON.stringify(newDoc.status));
  }
  if (given(newDoc.claimed) && typeof newDoc.claimed !== 'boolean') {
    reject('claimed', 'must be a boolean, got ' + describe(newDoc.claimed));
  }
  if (newDoc.status === 'running' && newDoc.claimed !== true) {
    reject('status', 'is "running" but the job is not claimed ("claimed" is not true): no worker holds it');
  }
  var strings = ['claimed_by', 'last_error', 'unique_key'];
  for (var s = 0; s < strings.length; s++) {
    if (given(newDoc[strings[s]]) && typeof newDoc[strings[s]] !== 'string') {
      reject(strings[s], 'must be a string, got ' + describe(newDoc[strings[s]]));
    }
  }
  // A unique job's id is derived from its type and key (couchq.UniqueID):
  // a key on any other id would promise a uniqueness nothing enforces.
  // (Archived copies, id + "~" + rev, and periods, id + "@" + start, keep
  // the prefix.)
  if (given(newDoc.unique_key) && newDoc._id.indexOf('job:unique:' + newDoc.worker + ':' + newDoc.unique_key) !== 0) {
    reject('unique_key', 'needs the id job:unique:' + newDoc.worker + ':' + newDoc.unique_key + ' (got ' + JSON.stringify(newDoc._id) + ')');
  }
  var counts = ['attempts', 'max_attempts'];
  for (var i = 0; i < counts.length; i++) {
    var v = newDoc[counts[i]];
    if (given(v) && !(isNum(v) && v >= 0 && v <= 2147483647 && Math.floor(v) === v)) {
      reject(counts[i], 'must be a whole number from 0 to 2147483647, got ' + JSON.stringify(v));
    }
  }
  if (given(newDoc.priority) && !(isNum(newDoc.priority) && Math.floor(newDoc.priority) === newDoc.priority &&
      newDoc.priority >= 1 && newDoc.priority <= 5)) {
    reject('priority', 'must be a whole number from 1 (runs first) to 5, got ' + JSON.stringify(newDoc.priority));
  }
  // A site name, as couchq's decoder takes it (protocol.ValidSiteName).
  if (given(newDoc.site) && !(typeof newDoc.site === 'string' && /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/.test(newDoc.site))) {
    reject('site', 'must be a site name (1 to 63 letters, digits, \'.\', \'_\' or \'-\', starting with a letter or digit), got ' + JSON.stringify(newDoc.site));
  }
  // The W3C trace context of the code that enqueued the job, which its run
  // continues: tracers read only these two keys, and a malformed traceparent
  // would silently start a new trace, so it is refused here where the
  // producer still hears why.
  if (given(newDoc.trace)) {
    var tr = newDoc.trace;
    if (typeof tr !== 'object' || Array.isArray(tr)) {
      reject('trace', 'must be an object {"traceparent": ..., "tracestate": ...}, got ' + describe(tr));
    }
    for (var key in tr) {
      if (key !== 'traceparent' && key !== 'tracestate') {
        reject('trace', 'may hold only traceparent and tracestate, got ' + JSON.stringify(key));
      }
    }
    var tp = tr.traceparent;
    if (!given(tp)) {
      reject('trace.traceparent', 'is required: the W3C traceparent of the enqueue');
    }
    if (typeof tp !== 'string' || !/^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/.test(tp) ||
        tp.indexOf('ff-') === 0 || tp.indexOf('00000000000000000000000000000000') === 3 || tp.indexOf('-0000000000000000-') === 35) {
      reject('trace.traceparent', 'must be a W3C traceparent: version-traceid-parentid-flags in lower-case hex ' +
        '(2, 32, 16 and 2 digits, ids not all zero, as in "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), got ' + JSON.stringify(tp));
    }
    if (given(tr.tracestate) && !(typeof tr.tracestate === 'string' && tr.tracestate.length <= 8192)) {
      reject('trace.tracestate', 'must be a string of at most 8192 characters, as in the W3C tracestate header');
    }
  }
  // Workflows (couchq's flow.go): after lists the jobs this one waits for.
  if (given(newDoc.after)) {
    if (!Array.isArray(newDoc.after)) {
      reject('after', 'must be an array of job ids (non-empty strings), got ' + describe(newDoc.after));
    }
    if (newDoc.after.length > 1000) {
      reject('after', 'may name at most 1000 jobs, got ' + newDoc.after.length);
    }
    for (var a = 0; a < newDoc.after.length; a++) {
      if (typeof newDoc.after[a] !== 'string' || newDoc.after[a] === '') {
        reject('after', 'must be an array of job ids (non-empty strings), got ' + JSON.stringify(newDoc.after[a]) + ' at ' + a);
      }
      if (newDoc.after[a] === newDoc._id) {
        reject('after', 'names the job itself: a job cannot wait for itself');
      }
    }
  }
  if (given(newDoc.on_dependency_failure) && newDoc.on_dependency_failure !== 'cancel' && newDoc.on_dependency_failure !== 'run') {
    reject('on_dependency_failure', 'must be "cancel" or "run", got ' + JSON.stringify(newDoc.on_dependency_failure));
  }
  var names = ['batch', 'callback_of'];
  for (var b = 0; b < names.length; b++) {
    if (given(newDoc[names[b]]) && (typeof newDoc[names[b]] !== 'string' || newDoc[names[b]] === '')) {
      reject(names[b], 'must be a batch id, a non-empty string, got ' + JSON.stringify(newDoc[names[b]]));
    }
  }
  if (given(newDoc.batch_size) && !(isNum(newDoc.batch_size) && newDoc.batch_size >= 0 && Math.floor(newDoc.batch_size) === newDoc.batch_size)) {
    reject('batch_size', 'must be a whole number, got ' + JSON.stringify(newDoc.batch_size));
  }
  if (given(newDoc.child_of) && (typeof newDoc.child_of !== 'string' || newDoc.child_of === '' ||
      newDoc._id.indexOf(newDoc.child_of + ':') !== 0)) {
    reject('child_of', 'must be the id of the job whose handler enqueued this one, which this job\'s id starts with (parent:key), got ' +
      JSON.stringify(newDoc.child_of));
  }
  if (given(newDoc.continuation) && typeof newDoc.continuation !== 'boolean') {
    reject('continuation', 'must be a boolean, got ' + describe(newDoc.continuation));
  }
  var times = ['claimed_at', 'released_at', 'lease_until', 'created_at', 'started_at', 'finished_at'];
  for (var j = 0; j < times.length; j++) {
    var t = newDoc[times[j]];
    // Bounded (about 3,000 years either way): CouchDB's _stats reduce
    // squares the durations the ops views emit, and a square past 1e308
    // fails every query of the view for the whole database.
    if (given(t) && !(isNum(t) && t > -1e11 && t < 1e11)) {
      reject(times[j], 'must be a number of Unix seconds, less than 1e11 either way, got ' + describe(t));
    }
  }
  // How far a running job got (protocol.Progress), as a handler or agent
  // reported it.
  if (given(newDoc.progress)) {
    var pr = newDoc.progress;
    var whole = function (v) {
      return isNum(v) && v >= 0 && v <= 2147483647 && Math.floor(v) === v;
    };
    if (typeof pr !== 'object' || Array.isArray(pr) ||
        (given(pr.done) && !whole(pr.done)) || (given(pr.total) && !whole(pr.total)) ||
        (given(pr.note) && typeof pr.note !== 'string') || (given(pr.at) && !isNum(pr.at)) ||
        (pr.total > 0 && pr.done > pr.total)) {
      reject('progress', 'must be an object {done, total, note, at}: whole numbers done and total (done at most total when total is above 0), a string note, Unix seconds at; got ' + JSON.stringify(pr));
    }
  }
  // Nesting (protocol.MaxNesting): JavaScript engines overflow their stack
  // on a deeply nested document, and then every view of the database fails
  // (QuickJS crashed at 20,000 levels) or the document is silently left out
  // of the views (PouchDB Server, from about 2,000): one document would
  // stop the queue or vanish from it. Walked without recursion, for the
  // same reason.
  var maxNesting = 1000;
  var open = [[newDoc, 1]];
  while (open.length > 0) {
    var top = open.pop();
    if (top[1] > maxNesting) {
      reject('document', 'nests objects and arrays more than ' + maxNesting + ' levels deep');
    }
    for (var f in top[0]) {
      var inner = top[0][f];
      if (inner !== null && typeof inner === 'object') {
        open.push([inner, top[1] + 1]);
      }
    }
  }
  if (given(newDoc.history)) {
    if (!Array.isArray(newDoc.history)) {
      reject('history', 'must be an array, got ' + describe(newDoc.history));
    }
    for (var k = 0; k < newDoc.history.length; k++) {
      var e = newDoc.history[k];
      if (e === null || typeof e !== 'object' || Array.isArray(e)) {
        reject('history', 'entries must be objects {at, event, by, attempt, error}, got ' + describe(e));
      }
      if ((given(e.at) && typeof e.at !== 'string') || (given(e.event) && typeof e.event !== 'string') ||
          (given(e.by) && typeof e.by !== 'string') || (given(e.error) && typeof e.error !== 'string') ||
          (given(e.attempt) && !(isNum(e.attempt) && Math.floor(e.attempt) === e.attempt))) {
        reject('history', 'entry ' + k + ' must have string at, event, by, error and a whole-number attempt');
      }
    }
  }
}
