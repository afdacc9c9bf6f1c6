function (doc) {
  // waiting: every waiting WorkItem keyed by its id, with what it waits
  // for: the jobs of after, the batch it is the callback of, and its
  // policy when a dependency fails. The sweeper checks them a page at a
  // time (a worker that died between finishing a job and releasing its
  // dependents); in Fauxton it lists what each waiting job waits for.
  // include: lib/waiting.js
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || !waiting(doc)) {
    return;
  }
  emit(doc._id, {
    worker: doc.worker,
    after: Array.isArray(doc.after) ? doc.after : [],
    callback_of: typeof doc.callback_of === 'string' ? doc.callback_of : null,
    on_dependency_failure: doc.on_dependency_failure || 'cancel'
  });
}
