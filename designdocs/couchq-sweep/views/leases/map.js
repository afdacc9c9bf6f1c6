function (doc) {
  // leases: claimed WorkItems keyed by lease_until (Unix seconds), the
  // sweeper's view: endkey=now lists every claim whose lease ran out.
  // A claim without a numeric lease_until is keyed 0 so it is swept at once
  // rather than held forever.
  if (doc.type !== 'WorkItem' || doc.claimed !== true) {
    return;
  }
  var until = doc.lease_until;
  if (typeof until !== 'number' || !isFinite(until)) {
    until = 0;
  }
  emit(until, {
    worker: doc.worker,
    claimed_by: doc.claimed_by || null,
    attempts: typeof doc.attempts === 'number' ? doc.attempts : 0
  });
}
