function (doc) {
  // due: unclaimed WorkItems that may still run, keyed [worker, date].
  // startkey=[T,0]&endkey=[T,now] lists what job type T may run now;
  // startkey=[T,now]&limit=1 finds the next scheduled one. Reduced with
  // _count for the queue-depth gauges (query with reduce=false for rows).
  // A missing or null date means "due now" (0). A date that is not a finite
  // number is also emitted at 0, so that couchq sees the document at once and
  // quarantines it with a reason instead of leaving it invisible forever.
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
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || doc.worker === '') {
    return;
  }
  if (doc.claimed === true) {
    return;
  }
  var s = doc.status;
  if (s === 'running' || s === 'done' || s === 'failed' || s === 'cancelled' || waiting(doc)) {
    return;
  }
  var date = doc.date;
  if (typeof date !== 'number' || !isFinite(date)) {
    date = 0;
  }
  var value = {attempts: typeof doc.attempts === 'number' ? doc.attempts : 0};
  if (doc.last_error) {
    value.last_error = doc.last_error;
  }
  emit([doc.worker, date], value);
}
