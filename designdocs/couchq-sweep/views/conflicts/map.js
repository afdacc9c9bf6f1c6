function (doc) {
  // conflicts: WorkItems with stored conflicts, keyed by worker type. On a
  // cluster two copies can each accept a write of the same revision (a
  // partition, a node that came back); the sweeper reads this view and
  // settles each job once no lease on it is live. Rows that stay here are
  // jobs a live lease still holds, or that a sweeper could not settle.
  if (doc.type !== 'WorkItem' || !doc._conflicts || doc._conflicts.length === 0) {
    return;
  }
  emit(doc.worker, {
    status: doc.status || null,
    claimed_by: doc.claimed === true ? (doc.claimed_by || null) : null,
    conflicts: doc._conflicts
  });
}
