function (doc) {
  // by_status: every WorkItem keyed [status, worker, time], where time is
  // finished_at for finished jobs (purge ranges over it) and the due date
  // otherwise. Rows show the job's type, attempts and last error, for
  // browsing in Fauxton. The revision lets purge delete exactly what it
  // saw: a job retried in between has a new revision and is left alone.
  // include: lib/waiting.js
  if (doc.type !== 'WorkItem') {
    return;
  }
  var status = waiting(doc) ? 'waiting' : (doc.status || 'queued');
  var finished = status === 'done' || status === 'failed' || status === 'cancelled';
  var time = finished ? doc.finished_at : doc.date;
  emit([status, doc.worker, typeof time === 'number' ? time : 0], {
    worker: doc.worker,
    attempts: typeof doc.attempts === 'number' ? doc.attempts : 0,
    last_error: doc.last_error || null,
    rev: doc._rev
  });
}
