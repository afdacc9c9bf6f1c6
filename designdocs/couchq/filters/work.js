function (doc, req) {
  // work: the _changes filter workers follow when the server has no
  // _selector filter (PouchDB Server) or when asked to. It passes WorkItems,
  // narrowed to the job types named in ?types=a,b when given.
  if (doc.type !== 'WorkItem') {
    return false;
  }
  var types = req.query && req.query.types;
  if (!types) {
    return true;
  }
  var list = String(types).split(',');
  for (var i = 0; i < list.length; i++) {
    if (list[i] === doc.worker) {
      return true;
    }
  }
  return false;
}
