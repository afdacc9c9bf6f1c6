// A job waits (is not claimable) when its status says so, or when it
// names jobs it waits for (a well-formed after: job ids) or a batch it is
// the callback of and was never released (a document written by hand
// with no status): couchq's decoder reads it the same way.
function waiting(d) {
  if (d.status === 'waiting') {
    return true;
  }
  if ((d.status !== undefined && d.status !== null && d.status !== 'queued') || d.claimed === true ||
      (typeof d.released_at === 'number' && d.released_at !== 0)) {
    return false;
  }
  if (typeof d.callback_of === 'string' && d.callback_of !== '') {
    return true;
  }
  if (!Array.isArray(d.after) || d.after.length === 0) {
    return false;
  }
  for (var w = 0; w < d.after.length; w++) {
    if (typeof d.after[w] !== 'string' || d.after[w] === '' || d.after[w] === d._id) {
      return false;
    }
  }
  return true;
}
