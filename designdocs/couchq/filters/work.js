function (doc, req) {
  // work: the _changes filter workers follow when the server has no
  // _selector filter (PouchDB Server). It passes only changes that can give
  // a worker something to claim — WorkItems that are unclaimed and not
  // running or finished, as in the due view — so that claims, renewals and
  // completions do not wake every worker, the control documents of job
  // types (a pause or a resume), and the registration of a worker process
  // (its registry document's first write, marked joined), so that the
  // others count it among their peers at once. ?types=a,b narrows it to
  // job types, ?site= to a site's own jobs.
  // include: lib/waiting.js
  var types = req.query && req.query.types;
  function wanted(worker) {
    if (!types) {
      return true;
    }
    var list = String(types).split(',');
    for (var i = 0; i < list.length; i++) {
      if (list[i] === worker) {
        return true;
      }
    }
    return false;
  }
  if (doc.type === 'TypeControl') {
    return wanted(doc.worker);
  }
  if (doc.type === 'Worker') {
    if (doc.joined !== true || !doc.types || !doc.types.length) {
      return false;
    }
    for (var j = 0; j < doc.types.length; j++) {
      if (wanted(doc.types[j])) {
        return true;
      }
    }
    return false;
  }
  if (doc.type !== 'WorkItem' || doc.claimed === true) {
    return false;
  }
  // ?site=S passes only the jobs site S owns: those naming it, and with
  // unsited=mine (S is the default site) those naming none.
  var site = req.query && req.query.site;
  if (site) {
    var named = typeof doc.site === 'string' && doc.site !== '';
    if (named ? doc.site !== site : req.query.unsited !== 'mine') {
      return false;
    }
  }
  var s = doc.status;
  if (s === 'running' || s === 'done' || s === 'failed' || s === 'cancelled' || waiting(doc)) {
    return false;
  }
  return wanted(doc.worker);
}
