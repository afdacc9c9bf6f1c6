function (doc) {
  // status: every WorkItem keyed [worker, status] (a missing status is
  // "queued"), reduced with _count: group=true gives counts by type and state.
  if (doc.type !== 'WorkItem') {
    return;
  }
  emit([doc.worker, doc.status || 'queued'], null);
}
