function (doc) {
  // attempt_times: how long each attempt ran, keyed [worker, ended at]
  // (Unix seconds), from the activity log: a "claimed" entry to the entry
  // that ended the attempt. _stats gives count, sum, min and max.
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || !Array.isArray(doc.history)) {
    return;
  }
  var ends = {
    'done': true, 'failed': true, 'retry-scheduled': true, 'snoozed': true,
    'released': true, 'lease-expired': true, 'cancelled': true
  };
  var start = null;
  for (var i = 0; i < doc.history.length; i++) {
    var e = doc.history[i];
    if (!e || typeof e.at !== 'string') {
      continue;
    }
    var at = Date.parse(e.at) / 1000;
    if (isNaN(at)) {
      continue;
    }
    if (e.event === 'claimed') {
      start = at;
    } else if (start !== null && ends[e.event] === true) {
      emit([doc.worker, at], Math.max(at - start, 0));
      start = null;
    }
  }
}
