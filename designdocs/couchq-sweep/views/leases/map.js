function (doc) {
  // leases: claimed WorkItems keyed by lease_until (Unix seconds), the
  // sweeper's view: endkey=now lists every claim whose lease ran out.
  // A claim without a numeric lease_until is keyed 0 so it is swept at once
  // rather than held forever; so is a job that reads running with no claim
  // (written by hand: nobody holds it), which the sweeper quarantines.
  if (doc.type !== 'WorkItem') {
    return;
  }
  var until = doc.lease_until;
  if (doc.claimed !== true) {
    if (doc.status !== 'running') {
      return;
    }
    until = 0;
  }
  if (typeof until !== 'number' || !isFinite(until)) {
    until = 0;
  }
  emit(until, {
    worker: doc.worker,
    claimed_by: doc.claimed_by || null,
    attempts: typeof doc.attempts === 'number' ? doc.attempts : 0
  });
}
