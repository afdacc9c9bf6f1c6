function (doc) {
  // timings: per-job durations in seconds, keyed [worker, kind, at] with a
  // scalar value so that the _stats reduce gives count, sum, min and max
  // over any time range (and the rows themselves give percentiles):
  //   [T, 'wait', started_at]     enqueued -> first claim
  //   [T, 'service', finished_at] enqueued -> done or failed
  // Jobs written by hand without created_at have no timings.
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || typeof doc.created_at !== 'number') {
    return;
  }
  if (typeof doc.started_at === 'number') {
    emit([doc.worker, 'wait', doc.started_at], Math.max(doc.started_at - doc.created_at, 0));
  }
  if ((doc.status === 'done' || doc.status === 'failed') && typeof doc.finished_at === 'number') {
    emit([doc.worker, 'service', doc.finished_at], Math.max(doc.finished_at - doc.created_at, 0));
  }
}
