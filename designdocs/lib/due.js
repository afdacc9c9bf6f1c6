// dueDate is a job's due date as the due views list it: null for what no
// worker may claim now or later (not a job, claimed, running, finished or
// waiting for other jobs); 0 for a missing or null date, and for a date
// that is not a finite number, so that couchq sees the document at once
// and quarantines it with a reason instead of leaving it invisible.
// Needs lib/waiting.js.
function dueDate(d) {
  if (d.type !== 'WorkItem' || typeof d.worker !== 'string' || d.worker === '' || d.claimed === true) {
    return null;
  }
  var s = d.status;
  if (s === 'running' || s === 'done' || s === 'failed' || s === 'cancelled' || waiting(d)) {
    return null;
  }
  if (typeof d.date !== 'number' || !isFinite(d.date)) {
    return 0;
  }
  return d.date;
}
