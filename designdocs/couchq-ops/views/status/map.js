function (doc) {
  // status: every WorkItem keyed [worker, status] (a missing status is
  // "queued"), reduced with _count: group=true gives counts by type and state.
  // include: lib/waiting.js
  if (doc.type !== 'WorkItem') {
    return;
  }
  emit([doc.worker, waiting(doc) ? 'waiting' : (doc.status || 'queued')], null);
}
