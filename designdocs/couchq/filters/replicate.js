function (doc, req) {
  // replicate: what a link carries into a producer site (PouchDB Server,
  // which drives its own links): the same documents as the links between
  // Apache CouchDB sites carry with a selector (protocol.linkSelector).
  // Jobs, the sites document, the sites' heartbeats and the operators'
  // requests replicate, and so do deletions and design documents; the
  // documents that coordinate one site's workers (registry, slots,
  // controls, schedules) stay where they are, and so does the Mango
  // validation's design document, which a server without such validation
  // would take and then fail every write with.
  if (doc._deleted === true) {
    return true;
  }
  if (doc._id.indexOf('_design/') === 0) {
    return doc._id !== '_design/couchq-validate';
  }
  var t = doc.type;
  return t === 'WorkItem' || t === 'Sites' || t === 'SiteHeartbeat' || t === 'SiteRequest';
}
