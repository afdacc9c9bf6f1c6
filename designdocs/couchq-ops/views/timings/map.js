function (doc) {
  // timings: per-job durations in seconds, keyed [worker, kind, at] with a
  // scalar value so that the _stats reduce gives count, sum, min and max
  // over any time range (and the rows themselves give percentiles):
  //   [T, 'wait', started_at]     enqueued -> first claim
  //   [T, 'service', finished_at] enqueued -> done or failed
  // Jobs written by hand without created_at have no timings, nor those
  // with times out of any sane range (written without validation): the
  // _stats reduce squares each value, and a square past 1e308 would fail
  // every query of the view.
  function time(t) {
    return typeof t === 'number' && t > -1e11 && t < 1e11;
  }
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || !time(doc.created_at)) {
    return;
  }
  if (time(doc.started_at)) {
    emit([doc.worker, 'wait', doc.started_at], Math.max(doc.started_at - doc.created_at, 0));
  }
  if ((doc.status === 'done' || doc.status === 'failed') && time(doc.finished_at)) {
    emit([doc.worker, 'service', doc.finished_at], Math.max(doc.finished_at - doc.created_at, 0));
  }
}
