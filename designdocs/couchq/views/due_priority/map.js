function (doc) {
  // due_priority: the due view's jobs keyed [worker, priority, date], what
  // workers read to start the highest priority first (1 runs first, 5 last;
  // none is 3), and within a priority the oldest due: one range per
  // priority, startkey=[T,p]&endkey=[T,p,now]. A priority that is not a
  // whole number from 1 to 5 is emitted at 1, so that couchq sees the
  // document at once and quarantines it with a reason. A site that is not
  // a non-empty string counts as none, so that the default site's workers
  // quarantine it.
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
  var p = doc.priority;
  if (p === undefined || p === null) {
    p = 3;
  } else if (typeof p !== 'number' || Math.floor(p) !== p || p < 1 || p > 5) {
    p = 1;
  }
  // A job owned by a site (a database of several sites linked by
  // replication) is keyed [[site, worker], p, date], so that each site's
  // workers read the ranges of their own jobs alone; a job that names no
  // site keeps the key it always had.
  var queue = doc.worker;
  if (typeof doc.site === 'string' && doc.site !== '') {
    queue = [doc.site, doc.worker];
  }
  emit([queue, p, date], null);
}
