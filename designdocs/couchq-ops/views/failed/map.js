function (doc) {
  // failed: jobs that stay failed, keyed [worker, finished_at], newest last,
  // with the error that failed them: what an operator looks for first.
  if (doc.type !== 'WorkItem' || doc.status !== 'failed') {
    return;
  }
  emit([doc.worker, typeof doc.finished_at === 'number' ? doc.finished_at : 0], {
    last_error: doc.last_error || null,
    attempts: typeof doc.attempts === 'number' ? doc.attempts : 0
  });
}
