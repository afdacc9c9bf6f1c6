function (doc) {
  // workers: the worker registry keyed by last heartbeat (Unix seconds), so
  // the oldest heartbeats (dead or frozen processes) come first.
  if (doc.type !== 'Worker') {
    return;
  }
  emit(typeof doc.last_heartbeat === 'number' ? doc.last_heartbeat : 0, {
    claimant: doc.claimant,
    types: doc.types,
    running: doc.running ? doc.running.length : 0,
    concurrency: doc.concurrency
  });
}
