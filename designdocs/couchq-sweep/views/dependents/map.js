function (doc) {
  // dependents: waiting WorkItems keyed by each job they wait for (after),
  // so that the worker that finishes a job finds the jobs that wait for it
  // with one query (keys=[its id]) and releases those whose dependencies
  // have all finished. Only waiting jobs emit: a released job leaves it.
  // include: lib/waiting.js
  if (doc.type !== 'WorkItem' || !waiting(doc) || !Array.isArray(doc.after)) {
    return;
  }
  for (var i = 0; i < doc.after.length; i++) {
    emit(doc.after[i], null);
  }
}
