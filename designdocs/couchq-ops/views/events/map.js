function (doc) {
  // events: every activity-log entry keyed [worker, event, at] (Unix
  // seconds), reduced with _count: one range query counts, say, the done
  // events of one job type in a time window.
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || !Array.isArray(doc.history)) {
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
