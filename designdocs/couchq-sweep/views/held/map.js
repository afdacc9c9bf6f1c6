function (doc) {
  // held: claimed WorkItems keyed [claimed_by, worker, lease_until]: what
  // one claimant (an agent such as "alice", a worker process) holds, so
  // that an agent that asks again gets its own work back first.
  if (doc.type !== 'WorkItem' || doc.claimed !== true || typeof doc.claimed_by !== 'string') {
    return;
  }
  emit([doc.claimed_by, doc.worker, typeof doc.lease_until === 'number' ? doc.lease_until : 0], null);
}
