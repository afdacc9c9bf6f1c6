function (doc, req) {
  // replicate: what a link carries into and out of a producer site
  // (PouchDB Server, which drives its own links): the same documents as
  // the links between Apache CouchDB sites carry with a selector
  // (protocol.linkSelector).
  // Jobs, the sites document, the sites' heartbeats and the operators'
  // requests replicate, and so do deletions and design documents; the
  // documents that coordinate one site's workers (registry, slots,
  // controls, schedules) stay where they are, and so do couchq's own
  // design documents, which each site installs for its server (their
  // language and validation follow what it runs): two sites' of different
  // content would conflict, and CouchDB's pick would become every site's.
  if (doc._deleted === true) {
    return true;
  }
  if (doc._id.indexOf('_design/') === 0) {
    return doc._id !== '_design/couchq' && doc._id.indexOf('_design/couchq-') !== 0;
  }
  var t = doc.type;
  return t === 'WorkItem' || t === 'Sites' || t === 'SiteHeartbeat' || t === 'SiteRequest';
}
