function (doc) {
  // due: unclaimed WorkItems that may still run, keyed [worker, date].
  // startkey=[T,0]&endkey=[T,now] lists what job type T may run now;
  // startkey=[T,now]&limit=1 finds the next scheduled one. Reduced with
  // _count for the queue-depth gauges (query with reduce=false for rows).
  // A missing or null date means "due now" (0), and so does a date that is
  // not a finite number (see lib/due.js).
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
  emit([doc.worker, date], value);
}
