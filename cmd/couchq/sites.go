package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	kivik "github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

const sitesUsage = `Usage: couchq sites [ls] [flags]
       couchq sites add NAME [flags]
       couchq sites link --site NAME --peer-url URL --peer-site NAME [--peer-db DB]
                         [--peer-user U] [--peer-password-file F] [flags]
       couchq sites unlink [flags]
       couchq sites takeover FROM --to SITE [flags]
       couchq sites requests [JOB] [flags]

Sites: databases at several places, each with its own workers, linked by
CouchDB's replication into one queue. Every job has one owner site, the
only one that runs it: the site it names (enqueue --site, or the site
field), else the default site (the first added).

	ls         the sites, which is the default, each one's last heartbeat as
	           this database has it (how far behind its copy is, plus up to
	           a heartbeat interval), and the links this server holds with
	           their state and pending changes
	add        adds a site to the sites document
	link       links this database (--site) and the peer's both ways: each
	           Apache CouchDB server pulls from the other through its
	           _replicator database; a peer without a replicator (PouchDB
	           Server, a producer) drives both links itself. The links keep
	           both sides' credentials, readable by server admins only
	unlink     removes the links this server holds for the database
	requests   the cancels and retries asked of other sites' jobs here, or
	           of this site's jobs elsewhere, and the pauses and resumes
	           asked of other sites (pause --at), and whether they were
	           applied (couchq cancel and retry of another site's job
	           write such a request; its owner's workers apply it)
	takeover   moves every unfinished job of site FROM (gone: down, or cut
	           off for longer than its jobs can wait) to site --to, which
	           becomes the default if FROM was

	--peer-url URL             the other site's server
	--peer-site NAME           the other site's name
	--peer-db DB               its database (default the same as --db)
	--peer-user U              its user (default the URL's, else --user's)
	--peer-password-file F     its password (default the URL's, else this
	                           server's)
	--to SITE                  the site that takes over
`

func (m *Main) runSites(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("sites", sitesUsage)
	conn := addConnFlags(fs)
	var peer cli.Conn
	var peerSite, to string
	fs.StringVar(&peer.URL, "peer-url", "", "the other site's server")
	fs.StringVar(&peerSite, "peer-site", "", "the other site's name")
	fs.StringVar(&peer.DB, "peer-db", "", "the other site's database")
	fs.StringVar(&peer.User, "peer-user", "", "the other site's user")
	fs.StringVar(&peer.PasswordFile, "peer-password-file", "", "the other site's password file")
	fs.StringVar(&to, "to", "", "the site that takes over")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	sub := "ls"
	if len(rest) > 0 {
		sub, rest = rest[0], rest[1:]
	}
	want := map[string]int{"ls": 0, "add": 1, "link": 0, "unlink": 0, "takeover": 1, "requests": min(len(rest), 1)}
	n, ok := want[sub]
	switch {
	case !ok:
		return cli.Usagef("unknown subcommand %q: want ls, add, link, unlink, takeover or requests", sub)
	case len(rest) != n:
		return cli.Usagef("couchq sites %s takes %d argument(s), got %d", sub, n, len(rest))
	case sub == "takeover" && to == "":
		return cli.Usagef("couchq sites takeover FROM needs --to SITE")
	case sub == "link" && (peer.URL == "" || peerSite == ""):
		return cli.Usagef("couchq sites link needs --peer-url and --peer-site")
	}
	names := []string{peerSite, to}
	if sub != "requests" { // its argument is a job's id
		names = append(names, rest...)
	}
	for _, name := range names {
		if name != "" && !protocol.ValidSiteName(name) {
			return cli.Usagef("invalid site name %q: want %s", name, protocol.SiteNameRule)
		}
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	site := conn.Site
	if sub == "link" && site == "" {
		return cli.Usagef("couchq sites link needs this database's --site (or $COUCHQ_SITE)")
	}
	// The sites commands work on the sites document itself: the client
	// works for no site (this one may not be in it yet).
	conn.Site = ""
	q, closeQueue, err := conn.OpenQueue(ctx, log, m.Now)
	if err != nil {
		return err
	}
	defer closeQueue()
	line := func(format string, args ...any) error {
		_, err := fmt.Fprintf(m.Stdout, format+"\n", args...)
		return err
	}
	switch sub {
	case "add":
		d, err := q.AddSite(ctx, rest[0])
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		return line("sites %s; default %s", strings.Join(d.Names(), ", "), d.Default)
	case "takeover":
		moved, err := q.TakeOver(ctx, rest[0], to)
		if errors.Is(err, protocol.ErrInvalidJob) || errors.Is(err, protocol.ErrNotFound) {
			return &cli.UsageError{Err: err}
		}
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		return line("moved %d unfinished %s of site %s to site %s", moved, cli.Plural(moved, "job", "jobs"), rest[0], to)
	case "unlink":
		srv, err := conn.Connect(ctx, log)
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		if err := srv.CanUnlink(conn.DB); err != nil {
			return err
		}
		removed, err := srv.Unlink(ctx, conn.DB)
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		return line("removed %d %s this server held for %s", removed, cli.Plural(removed, "link", "links"), conn.DB)
	case "link":
		return m.linkSites(ctx, log, conn, site, &peer, peerSite)
	case "requests":
		job := ""
		if len(rest) == 1 {
			job = rest[0]
		}
		reqs, err := q.Requests(ctx, job)
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		if conn.json {
			if reqs == nil {
				reqs = []protocol.SiteRequest{} // none is [], as in every other list
			}
			return cli.WriteJSON(m.Stdout, reqs)
		}
		tw := cli.NewTable(m.Stdout)
		fmt.Fprintln(tw, "REQUEST\tJOB\tACTION\tFROM\tFOR\tSTATE\tRESULT")
		for _, r := range reqs {
			what := r.Job
			if what == "" {
				what = "type " + r.Worker // a pause or resume
			}
			from := r.From
			if from == "" {
				from = "-" // asked by a client of no site
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, what, r.Action, from, r.Site, r.State, cli.OneLine(r.Result, 60))
		}
		return tw.Flush()
	}
	return m.listSites(ctx, log, conn, q)
}

// linkSites links this database, site's, with the peer's both ways.
func (m *Main) linkSites(ctx context.Context, log zerolog.Logger, conn *connFlags, site string, peer *cli.Conn, peerSite string) error {
	if peer.DB == "" {
		peer.DB = conn.DB
	}
	noEnv := func(string) string { return "" }
	peer.URLFlag = "--peer-url"
	if err := peer.ResolveURL(noEnv); err != nil {
		return err
	}
	if peer.User == "" && !strings.Contains(peer.RawURL, "@") {
		peer.User = conn.User
	}
	if err := peer.ResolveCredentials(noEnv, m.addSecret); err != nil {
		return err
	}
	if peer.Password == "" && peer.User == conn.User {
		peer.Password = conn.Password
	}
	local, err := conn.Connect(ctx, log)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	remote, err := peer.Connect(ctx, log)
	if err != nil {
		return cli.ServerError(peer.URL, err)
	}
	a := siteEndpoint(site, conn.RawURL, conn.DB, conn.User, conn.Password, local)
	b := siteEndpoint(peerSite, peer.RawURL, peer.DB, peer.User, peer.Password, remote)
	if err := protocol.LinkSites(ctx, a, b, map[string]*protocol.Server{site: local, peerSite: remote}); err != nil {
		return cli.ServerError(conn.URL, err)
	}
	_, err = fmt.Fprintf(m.Stdout, "linked site %s (%s) and site %s (%s) both ways\n", site, conn.URL, peerSite, peer.URL)
	for _, end := range []struct {
		raw   string
		at    protocol.SiteEndpoint
		other string
	}{{conn.RawURL, a, peerSite}, {peer.RawURL, b, site}} {
		if strings.Contains(end.raw, ",") {
			// CouchDB's replicator takes one URL for each end.
			fmt.Fprintf(m.Stderr, "note: the links reach site %s through its first node, %s, alone: while that node is down the site is cut off from site %s. Link a cluster through an address that reaches any of its nodes (a load balancer)\n",
				end.at.Site, end.at.URL, end.other)
		}
	}
	return err
}

// siteEndpoint describes a site's database for the links: the first node
// of rawURL, its credentials taken out of the URL.
func siteEndpoint(site, rawURL, db, user, password string, srv *protocol.Server) protocol.SiteEndpoint {
	first, _, _ := strings.Cut(rawURL, ",")
	u, err := url.Parse(first)
	if err == nil && u.User != nil {
		if user == "" {
			user = u.User.Username()
		}
		if pw, ok := u.User.Password(); ok && password == "" {
			password = pw
		}
		u.User = nil
		first = u.String()
	}
	return protocol.SiteEndpoint{Site: site, URL: first, DB: db, User: user, Password: password, Replicator: srv.Caps.Vendor == "couchdb"}
}

// listSites prints the sites and this server's links.
func (m *Main) listSites(ctx context.Context, log zerolog.Logger, conn *connFlags, q *protocol.Client) error {
	rows, err := forms.Sites(ctx, q, m.Now())
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if len(rows) == 0 {
		if conn.json {
			return cli.WriteJSON(m.Stdout, forms.SitesReport{Sites: []forms.Site{}})
		}
		_, err := fmt.Fprintln(m.Stdout, "the database has no sites: it is a single site (couchq sites add NAME)")
		return err
	}
	srv, err := conn.Connect(ctx, log)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	// The replicator's state is a server admin's to read: a member who may
	// read the sites still gets them, and is told why the links are missing.
	links, err := srv.Links(ctx, conn.DB)
	linksHidden := ""
	if srv.Caps.Vendor != "couchdb" {
		// A producer's links run in its server's process, which lists none.
		links, err = nil, nil
		linksHidden = "links not shown: this server has no replicator of its own (PouchDB Server): its links run in its process until it stops; link again after it restarts"
	}
	if status := kivik.HTTPStatus(err); err != nil && (status == http.StatusUnauthorized || status == http.StatusForbidden) {
		linksHidden = fmt.Sprintf("links not shown: reading the replicator's state (_scheduler/docs) needs a server admin (%v)", err)
		err = nil
	}
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if conn.json {
		report := forms.SitesReport{Sites: rows}
		if linksHidden == "" {
			report.Links = forms.Links(links)
		}
		return cli.WriteJSON(m.Stdout, report)
	}
	tw := cli.NewTable(m.Stdout)
	fmt.Fprintln(tw, "SITE\tDEFAULT\tHEARTBEAT\tTAKEN OVER BY")
	for _, r := range rows {
		beat := "never"
		if r.HeartbeatAge != nil {
			beat = time.Duration(*r.HeartbeatAge*float64(time.Second)).Round(time.Second).String() + " ago"
			if r.CatchingUp {
				beat += " (catching up: not claiming yet)"
			}
		}
		takenOver := r.TakenOverBy
		if r.Returned {
			takenOver += " (came back since: runs its new jobs)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Site, map[bool]string{true: "yes"}[r.Default], beat, takenOver)
	}
	fmt.Fprintln(tw)
	if linksHidden != "" {
		fmt.Fprintln(tw, linksHidden)
		return tw.Flush()
	}
	fmt.Fprintln(tw, "LINK\tSTATE\tPENDING\tCOPIED\tERROR")
	for _, l := range links {
		pending := "?"
		if l.ChangesPending >= 0 {
			pending = fmt.Sprint(l.ChangesPending)
		}
		fmt.Fprintf(tw, "%s -> %s\t%s\t%s\t%d\t%s\n", l.From, l.To, l.State, pending, l.DocsWritten, l.Error)
	}
	return tw.Flush()
}

// printForwarded says that an action went to the job's owner site as a
// request; with --json, the request document.
func printForwarded(w io.Writer, fwd *protocol.ForwardedError, asJSON bool) error {
	if asJSON {
		return cli.WriteJSON(w, fwd.Request)
	}
	r := fwd.Request
	_, err := fmt.Fprintf(w, "%s of %s requested from site %s, its owner, which applies it when the request reaches it (request %s; couchq sites requests %s)\n",
		r.Action, r.Job, r.Site, r.ID, r.Job)
	return err
}
