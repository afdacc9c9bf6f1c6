// addedAt is when a job that couchq did not enqueue was added, in Unix
// seconds: one written by hand or by an application straight into
// CouchDB, whose history does not begin with an enqueued entry. It is its
// created_at, else the time of its first history entry (couchq's first
// write to it, its claim, say). Null for a job couchq enqueued, whose
// enqueued entry says when (the first one is kept however long the
// history grows), and for one there is no telling of. The views that
// count added jobs count such a job then, as if it had that entry.
function addedAt(d) {
  var h = Array.isArray(d.history) ? d.history : [];
  if (h.length > 0 && h[0] && h[0].event === 'enqueued') {
    return null;
  }
  if (typeof d.created_at === 'number' && isFinite(d.created_at) && d.created_at > 0) {
    return d.created_at;
  }
  if (h.length > 0 && h[0] && typeof h[0].at === 'string') {
    var at = Date.parse(h[0].at) / 1000;
    if (isFinite(at)) {
      return at;
    }
  }
  return null;
}
