function (doc) {
  // due: unclaimed WorkItems that may still run, keyed [worker, date].
  // startkey=[T,0]&endkey=[T,now] lists what job type T may run now;
  // startkey=[T,now]&limit=1 finds the next scheduled one. Reduced with
  // _count for the queue-depth gauges (query with reduce=false for rows).
  // A missing or null date means "due now" (0), and so does a date that is
  // not a finite number (see lib/due.js). Jobs due now are keyed
  // [worker, 0, since] (null when there is no telling), so that the first
  // of them is the one waiting longest: how old the oldest due job is, is
  // the older of that one and the first with a date.
  //
  // since is when the job was created, or when it last went back to the
  // queue, whichever is later: a retry, a requeue, a lease that ran out, a
  // release at a worker's shutdown or of a job that waited for others. A
  // job has been due since then, not since it was first enqueued; a dated
  // job that went back to the queue after its date is keyed by that time
  // for the same reason.
  // include: lib/waiting.js
  // include: lib/due.js
  var date = dueDate(doc);
  if (date === null) {
    return;
  }
  var requeued = 0;
  if (typeof doc.released_at === 'number' && isFinite(doc.released_at)) {
    requeued = doc.released_at;
  }
  var history = doc.history;
  if (Array.isArray(history) && history.length > 0) {
    var last = history[history.length - 1];
    var back = {
      'requeued': true, 'lease-expired': true, 'released': true, 'dependencies-done': true,
      'claim-conceded': true, 'claim-withdrawn': true
    };
    if (last && back[last.event] === true && typeof last.at === 'string') {
      var at = Date.parse(last.at) / 1000;
      if (isFinite(at) && at > requeued) {
        requeued = at;
      }
    }
  }
  var value = {attempts: typeof doc.attempts === 'number' ? doc.attempts : 0};
  if (doc.last_error) {
    value.last_error = doc.last_error;
  }
  if (date === 0) {
    var since = typeof doc.created_at === 'number' && isFinite(doc.created_at) ? doc.created_at : 0;
    since = Math.max(since, requeued);
    emit([doc.worker, 0, since > 0 ? since : null], value);
    return;
  }
  emit([doc.worker, Math.max(date, requeued)], value);
}
