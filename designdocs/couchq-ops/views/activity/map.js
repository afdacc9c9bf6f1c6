function (doc) {
  // activity: the activity-log entries the dashboard plots, counted per
  // minute: keyed [event, worker, hour, minute] (whole hours and minutes
  // since the Unix epoch) and reduced with _count, so that one grouped range
  // query gives a series: group_level=4 per minute, group_level=3 per hour.
  // Each entry is emitted twice, once under its job type and once under
  // null (every type), so that the all-types series is one query as well,
  // not one per type. Only the events plotted are emitted: the events view
  // has every entry, keyed for counting a window rather than bucketing it.
  // A job couchq did not enqueue counts an enqueued entry when it was
  // added (lib/added.js).
  // include: lib/added.js
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string') {
    return;
  }
  var added = addedAt(doc);
  if (added !== null) {
    emit(['enqueued', doc.worker, Math.floor(added / 3600), Math.floor(added / 60)], null);
    emit(['enqueued', null, Math.floor(added / 3600), Math.floor(added / 60)], null);
  }
  if (!Array.isArray(doc.history)) {
    return;
  }
  var plotted = {
    'enqueued': true, 'claimed': true, 'done': true, 'failed': true, 'retry-scheduled': true
  };
  for (var i = 0; i < doc.history.length; i++) {
    var e = doc.history[i];
    if (!e || plotted[e.event] !== true || typeof e.at !== 'string') {
      continue;
    }
    var at = Date.parse(e.at) / 1000;
    if (isNaN(at)) {
      continue;
    }
    var hour = Math.floor(at / 3600), minute = Math.floor(at / 60);
    emit([e.event, doc.worker, hour, minute], null);
    emit([e.event, null, hour, minute], null);
  }
}
