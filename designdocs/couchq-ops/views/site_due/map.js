function (doc) {
  // site_due: the due view's jobs keyed [worker, site, date], site "" for a
  // job that names none (the default site's, in a database of sites).
  // Reduced with _count: group_level=2 gives each type's jobs by owner
  // site, and startkey=[T,S]&endkey=[T,S,now] those of site S due now, the
  // backlog a site's own workers have to claim (the due view counts every
  // site's). A site that is not a non-empty string counts as none, as in
  // the claim view.
  // include: lib/waiting.js
  if (doc.type !== 'WorkItem' || typeof doc.worker !== 'string' || doc.worker === '') {
    return;
  }
  if (doc.claimed === true) {
    return;
  }
  var s = doc.status;
  if (s === 'running' || s === 'done' || s === 'failed' || s === 'cancelled' || waiting(doc)) {
    return;
  }
  var date = doc.date;
  if (typeof date !== 'number' || !isFinite(date)) {
    date = 0;
  }
  var site = typeof doc.site === 'string' ? doc.site : '';
  emit([doc.worker, site, date], null);
}
