function (doc) {
  // due: unclaimed WorkItems that may still run, keyed [worker, date].
  // startkey=[T,0]&endkey=[T,now] lists what job type T may run now;
  // startkey=[T,now]&limit=1 finds the next scheduled one. Reduced with
  // _count for the queue-depth gauges (query with reduce=false for rows).
  // A missing or null date means "due now" (0), and so does a date that is
  // not a finite number (see lib/due.js). Jobs due now are keyed
  // [worker, 0, created_at] (null when it has none), so that the first of
  // them is the one waiting longest: how old the oldest due job is, is the
  // older of that one and the first with a date.
  // include: lib/waiting.js
  // include: lib/due.js
  var date = dueDate(doc);
  if (date === null) {
    return;
  }
  var value = {attempts: typeof doc.attempts === 'number' ? doc.attempts : 0};
  if (doc.last_error) {
    value.last_error = doc.last_error;
  }
  if (date === 0) {
    var created = doc.created_at;
    emit([doc.worker, 0, typeof created === 'number' && isFinite(created) ? created : null], value);
    return;
  }
  emit([doc.worker, date], value);
}
