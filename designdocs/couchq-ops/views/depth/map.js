function (doc) {
  // depth: the queue's depth over time, as changes. A job joins the queue
  // (+1) when it is enqueued or put back (a retry scheduled, a snooze, a
  // release, a lease that ran out, an operator's requeue) and leaves it
  // (-1) when it is claimed or ends without running (cancelled). Keyed
  // [worker, hour, minute] (whole hours and minutes since the Unix epoch)
  // and reduced with _sum: the sum of every key before a time is the depth
  // at that time, and a grouped range (group_level=3 per minute, 2 per
  // hour) gives the changes after it. Emitted under the job type and under
  // null (every type). "Queued" here counts due and scheduled jobs alike:
  // what is in the queue, not what is late. A job that waits for others
  // (after, or a batch's callback) joins when they are done, not when it
  // is enqueued. A job couchq did not enqueue joins when it was added
  // (lib/added.js).
  // include: lib/added.js
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string') {
    return;
  }
  var dependent = (Array.isArray(doc.after) && doc.after.length > 0) ||
    (typeof doc.callback_of === 'string' && doc.callback_of !== '');
  var joins = {
    'enqueued': !dependent, 'retry-scheduled': true, 'snoozed': true, 'released': true,
    'lease-expired': true, 'requeued': true, 'claim-withdrawn': true, 'dependencies-done': true
  };
  var leaves = {
    'claimed': true, 'cancelled': true, 'done': true, 'failed': true, 'archived': true
  };
  // Track whether the job is in the queue, so that a log missing entries
  // (it is bounded, and people write documents by hand) never counts a job
  // twice.
  var queued = false;
  var added = addedAt(doc);
  if (added !== null && !dependent) {
    queued = true;
    emit([doc.worker, Math.floor(added / 3600), Math.floor(added / 60)], 1);
    emit([null, Math.floor(added / 3600), Math.floor(added / 60)], 1);
  }
  if (!Array.isArray(doc.history)) {
    return;
  }
  for (var i = 0; i < doc.history.length; i++) {
    var e = doc.history[i];
    if (!e || typeof e.event !== 'string' || typeof e.at !== 'string') {
      continue;
    }
    var change = 0;
    if (joins[e.event] === true && !queued) {
      change = 1;
    } else if (leaves[e.event] === true && queued) {
      change = -1;
    } else {
      continue;
    }
    var at = Date.parse(e.at) / 1000;
    if (isNaN(at)) {
      continue;
    }
    queued = change > 0;
    var hour = Math.floor(at / 3600), minute = Math.floor(at / 60);
    emit([doc.worker, hour, minute], change);
    emit([null, hour, minute], change);
  }
}
