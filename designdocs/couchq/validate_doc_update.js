function (newDoc, oldDoc, userCtx, secObj) {
  // validate_doc_update: rejects WorkItems that no worker could run, with a
  // forbidden message naming the field and the reason. Other documents pass.
  // Deletions always pass so that purging and conflict clean-up never fail.
  if (newDoc._deleted === true || newDoc.type !== 'WorkItem') {
    return;
  }
  function reject(field, why) {
    throw ({forbidden: 'invalid WorkItem: ' + field + ' ' + why});
  }
  function isNum(v) {
    return typeof v === 'number' && isFinite(v);
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
  if (newDoc.date !== undefined && newDoc.date !== null && !isNum(newDoc.date)) {
    reject('date', 'must be a number of Unix seconds (or null for now), got ' + describe(newDoc.date));
  }
  var statuses = ['queued', 'running', 'done', 'failed', 'cancelled'];
  if (newDoc.status !== undefined && statuses.indexOf(newDoc.status) < 0) {
    reject('status', 'must be one of ' + statuses.join(', ') + ', got ' + JSON.stringify(newDoc.status));
  }
  if (newDoc.claimed !== undefined && typeof newDoc.claimed !== 'boolean') {
    reject('claimed', 'must be a boolean, got ' + describe(newDoc.claimed));
  }
  var counts = ['attempts', 'max_attempts'];
  for (var i = 0; i < counts.length; i++) {
    var v = newDoc[counts[i]];
    if (v !== undefined && v !== null && !(isNum(v) && v >= 0 && Math.floor(v) === v)) {
      reject(counts[i], 'must be a whole number >= 0, got ' + JSON.stringify(v));
    }
  }
  var times = ['claimed_at', 'lease_until', 'created_at', 'finished_at'];
  for (var j = 0; j < times.length; j++) {
    var t = newDoc[times[j]];
    if (t !== undefined && t !== null && !isNum(t)) {
      reject(times[j], 'must be a number of Unix seconds, got ' + describe(t));
    }
  }
  if (newDoc.history !== undefined && !Array.isArray(newDoc.history)) {
    reject('history', 'must be an array, got ' + describe(newDoc.history));
  }
}
