function (doc) {
  // timings: finished jobs keyed [worker, finished_at] with
  // [service, wait] in seconds: service is enqueued -> done or failed, wait
  // is enqueued -> first claim. _stats gives count, sum, min and max of
  // both over any time range; the rows themselves give percentiles.
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string') {
    return;
  }
  if (doc.status !== 'done' && doc.status !== 'failed') {
    return;
  }
  if (typeof doc.created_at !== 'number' || typeof doc.finished_at !== 'number') {
    return;
  }
  var started = typeof doc.started_at === 'number' ? doc.started_at : doc.finished_at;
  emit([doc.worker, doc.finished_at], [
    Math.max(doc.finished_at - doc.created_at, 0),
    Math.max(started - doc.created_at, 0)
  ]);
}
