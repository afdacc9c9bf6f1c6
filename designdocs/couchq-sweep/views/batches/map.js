function (doc) {
  // batches: the jobs of each batch keyed [batch, state], reduced with
  // _count: state is done, failed or cancelled for a finished job and
  // pending for any other (waiting, queued — a failed attempt that will be
  // retried too —, running). One grouped query (group_level=2,
  // startkey=[B], endkey=[B,{}]) gives a batch's progress, so that the
  // worker finishing a batch's job learns whether it was the last without
  // reading the others.
  if (doc.type !== 'WorkItem' || typeof doc.batch !== 'string' || doc.batch === '') {
    return;
  }
  var s = doc.status;
  var finished = s === 'done' || s === 'failed' || s === 'cancelled';
  emit([doc.batch, finished ? s : 'pending'], null);
}
