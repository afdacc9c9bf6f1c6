// Package pouchdbserver holds the pinned npm project of PouchDB Server,
// the CouchDB-compatible server couchq's demo and tests start when there
// is no Apache CouchDB: a couchq binary run outside its repository writes
// these files to a directory of its own and installs them there.
package pouchdbserver

import "embed"

// Files are package.json and package-lock.json.
//
//go:embed package.json package-lock.json
var Files embed.FS
