function (doc) {
  // by_status: every WorkItem keyed [status, worker, due date], for browsing
  // in Fauxton: each row shows the job's type, attempts and last error.
  if (doc.type !== 'WorkItem') {
    return;
  }
  emit([doc.status || 'queued', doc.worker, typeof doc.date === 'number' ? doc.date : 0], {
    worker: doc.worker,
    attempts: typeof doc.attempts === 'number' ? doc.attempts : 0,
    last_error: doc.last_error || null
  });
}
