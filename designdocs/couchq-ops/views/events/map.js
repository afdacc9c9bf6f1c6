function (doc) {
  // events: every activity-log entry keyed [worker, event, at] (Unix
  // seconds), reduced with _count: one range query counts, say, the done
  // events of one job type in a time window. A job couchq did not enqueue
  // counts an enqueued entry when it was added (lib/added.js).
  // include: lib/added.js
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string') {
    return;
  }
  var added = addedAt(doc);
  if (added !== null) {
    emit([doc.worker, 'enqueued', added], null);
  }
  if (!Array.isArray(doc.history)) {
    return;
  }
  for (var i = 0; i < doc.history.length; i++) {
    var e = doc.history[i];
    if (!e || typeof e.event !== 'string' || typeof e.at !== 'string') {
      continue;
    }
    var at = Date.parse(e.at);
    if (isNaN(at)) {
      continue;
    }
    emit([doc.worker, e.event, at / 1000], null);
  }
}
