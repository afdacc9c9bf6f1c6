function (doc) {
  // site_due: the due view's jobs keyed [worker, site, date], site "" for a
  // job that names none (the default site's, in a database of sites).
  // Reduced with _count: group_level=2 gives each type's jobs by owner
  // site, and startkey=[T,S]&endkey=[T,S,now] those of site S due now, the
  // backlog a site's own workers have to claim (the due view counts every
  // site's). A site that is not a non-empty string counts as none, as in
  // the claim view.
  // include: lib/waiting.js
  // include: lib/due.js
  var date = dueDate(doc);
  if (date === null) {
    return;
  }
  emit([doc.worker, typeof doc.site === 'string' ? doc.site : '', date], null);
}
