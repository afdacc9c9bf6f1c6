function (doc) {
  // by_status: every WorkItem keyed [status, worker, time], where time is
  // finished_at for finished jobs (purge ranges over it) and the due date
  // otherwise. Rows show the job's type, attempts and last error, for
  // browsing in Fauxton. The revision lets purge delete exactly what it
  // saw: a job retried in between has a new revision and is left alone.
  // A job waits (is not claimable) when its status says so, or when it
  // names jobs it waits for (a well-formed after: job ids) or a batch it is
  // the callback of and was never released (a document written by hand
  // with no status): couchq's decoder reads it the same way.
  function waiting(d) {
    if (d.status === 'waiting') {
      return true;
    }
    if ((d.status !== undefined && d.status !== null && d.status !== 'queued') || d.claimed === true ||
        (typeof d.released_at === 'number' && d.released_at !== 0)) {
      return false;
    }
    if (typeof d.callback_of === 'string' && d.callback_of !== '') {
      return true;
    }
    if (!Array.isArray(d.after) || d.after.length === 0) {
      return false;
    }
    for (var w = 0; w < d.after.length; w++) {
      if (typeof d.after[w] !== 'string' || d.after[w] === '' || d.after[w] === d._id) {
        return false;
      }
    }
    return true;
  }
  if (doc.type !== 'WorkItem') {
    return;
  }
  var status = waiting(doc) ? 'waiting' : (doc.status || 'queued');
  var finished = status === 'done' || status === 'failed' || status === 'cancelled';
  var time = finished ? doc.finished_at : doc.date;
  emit([status, doc.worker, typeof time === 'number' ? time : 0], {
    worker: doc.worker,
    attempts: typeof doc.attempts === 'number' ? doc.attempts : 0,
    last_error: doc.last_error || null,
    rev: doc._rev
  });
}
