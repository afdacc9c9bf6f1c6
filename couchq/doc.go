// Package couchq is a job queue whose only moving part is CouchDB.
//
// Jobs are WorkItem documents in a CouchDB database: an application writes
// them through this package, through the couchq command, or straight into
// CouchDB (a document of {"type":"WorkItem","worker":"email"} is a valid
// job). Workers (package worker) claim them with CouchDB's own revision
// checks, renew a lease while a handler runs, retry failures with backoff
// and return the jobs of workers that died. The same protocol is safe on a
// CouchDB cluster, where two claims of one revision can both be accepted.
//
// An application connects to the server, prepares the database once with
// Server.Init, opens a Client on it and enqueues:
//
//	srv, err := couchq.Connect(ctx, "http://127.0.0.1:5984", "admin", "secret")
//	...
//	err = srv.Init(ctx, "couchq", couchq.InitOptions{})
//	q, err := srv.Open(ctx, "couchq", couchq.Config{})
//	job, err := q.Enqueue(ctx, couchq.NewJob{Worker: "email", Payload: email})
//
// A Client also inspects and acts on jobs (Get, List, Retry, Cancel, Purge,
// Stats), pauses and resumes job types, lets agents that are not Go workers
// claim and finish jobs (ClaimForAgent), and hands out named slots from a
// sequence (Reserve). Databases at several sites can form one queue,
// linked by CouchDB's replication (Config.Site, AddSite, LinkSites,
// TakeOver), each job running once, at its owner site. Workers are in
// package worker; the dashboard and
// metrics in package opshttp; a fleet of workers described by a config file
// in package fleet; test helpers (a handler run in-process, assertions on
// what was enqueued) in package couchqtest.
//
// The guides in the repository's docs directory explain scheduling,
// workers, operating, deploying, security, clusters and sites.
package couchq
