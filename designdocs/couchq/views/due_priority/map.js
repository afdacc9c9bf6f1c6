function (doc) {
  // due_priority: the due view's jobs keyed [worker, priority, date], what
  // workers read to start the highest priority first (1 runs first, 5 last;
  // none is 3), and within a priority the oldest due: one range per
  // priority, startkey=[T,p]&endkey=[T,p,now]. A priority that is not a
  // whole number from 1 to 5 is emitted at 1, so that couchq sees the
  // document at once and quarantines it with a reason.
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || doc.worker === '') {
    return;
  }
  if (doc.claimed === true) {
    return;
  }
  var s = doc.status;
  if (s === 'running' || s === 'done' || s === 'failed' || s === 'cancelled') {
    return;
  }
  var date = doc.date;
  if (typeof date !== 'number' || !isFinite(date)) {
    date = 0;
  }
  var p = doc.priority;
  if (p === undefined || p === null) {
    p = 3;
  } else if (typeof p !== 'number' || Math.floor(p) !== p || p < 1 || p > 5) {
    p = 1;
  }
  emit([doc.worker, p, date], null);
}
