function (doc) {
  // due: unclaimed WorkItems that may still run, keyed [worker, date].
  // startkey=[T,0]&endkey=[T,now] lists what job type T may run now;
  // startkey=[T,now]&limit=1 finds the next scheduled one. Reduced with
  // _count for the queue-depth gauges (query with reduce=false for rows).
  // A missing or null date means "due now" (0). A date that is not a finite
  // number is also emitted at 0, so that couchq sees the document at once and
  // quarantines it with a reason instead of leaving it invisible forever.
  // include: lib/waiting.js
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
