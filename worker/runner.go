package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/jobrun"
	"github.com/couchq/couchq/internal/protocol"
)

// maxDueLimit bounds one due-view query's page, and maxUnrepairable the
// malformed documents a runner remembers (and reads past).
const (
	maxDueLimit     = 1000
	maxUnrepairable = 900
)

// finishTimeout bounds the writes that follow a job's outcome (and the
// release of a job at shutdown). They run on a context detached from
// shutdown so a stopping worker still records results.
const finishTimeout = 30 * time.Second

// outcomeTimeout bounds how long a running worker tries to write a job's
// outcome while CouchDB does not answer (Stop ends the tries sooner). The
// worker still holds the job meanwhile (its own sweeps leave it alone), so
// an outage shorter than this costs no second run of a job that ran; past
// it the job's lease decides.
const outcomeTimeout = 10 * time.Minute

// runner claims and runs jobs of one type.
type runner struct {
	w       *Worker
	typ     string
	handler Handler
	slots   chan struct{} // one token per job whose handler runs
	// finishing holds one token per job whose handler returned and whose
	// outcome is being written: the run slot is free for the next job
	// meanwhile (a claim round need not wait for a server's write), and
	// a server slow to take outcomes holds run slots once this is full.
	finishing chan struct{}
	wake      chan struct{} // capacity 1: "look for due work"
	// behind records that the last fetch left due work behind, so that a
	// finished job's freed slot should look for more.
	behind atomic.Bool
	// slotWanted records that the loop waits with every slot taken, so
	// set no timer (the next scheduled job, a job left to a peer): the
	// next freed slot wakes it to set them.
	slotWanted atomic.Bool
	// news records that the feed (or a sweep) reported claimable work
	// since the last due query: the next one must see every change, not
	// read the view as it stands (see fetch).
	news atomic.Bool
	// paused mirrors the type's control document: a paused runner claims
	// nothing and waits for the feed to say it was resumed.
	paused atomic.Bool
	// With a rate limit: start slots taken for tokenWindow (the current
	// window, or the next when taken ahead) and not used yet, and when to
	// look again (the next window's start when its slots ran out).
	// Touched only by the runner's own loop.
	tokens       int
	tokenWindow  time.Time
	blockedUntil time.Time
	// acquireTook and dueTook are how long the last round of taking rate
	// limit slots and the last due query took (see takeStarts).
	acquireTook, dueTook time.Duration
	// pick is K for the next round (see widenPick); touched only by the
	// runner's own loop.
	pick int
	// unrepairable holds malformed documents quarantine could not fix;
	// touched only by the runner's own loop.
	unrepairable map[string]struct{}
	// claimedAt holds the jobs this runner claimed in the last
	// claimedRevisions (see noteClaim): a view read as it stands may still
	// list them as due for a moment (recentClaims), and a lagging copy (on
	// a cluster) or the feed may still show them due at the revision
	// claimed over. claimsMu guards it:
	// claimReleased writes it from a finishing job's goroutine.
	claimsMu  sync.Mutex
	claimedAt map[string]recentClaim
	// leftSince holds the jobs of peers this runner leaves to them (those
	// its last round found among what a peer takes next, see ownFirst) and
	// since when: a job left for StealAfter is its thief's too, for twice
	// that its third choice's, for three times that anyone's, since its
	// owner is busy or gone. stealAt is when the
	// next of them may be taken. Touched only by the runner's own loop.
	leftSince map[string]time.Time
	stealAt   time.Time
	// fedMu guards fedDue: claimable jobs of the runner's type that the
	// changes feed brought with their documents since the last round
	// (offer, takeFed).
	fedMu  sync.Mutex
	fedDue []protocol.DueCandidate
	// roundTook is how long a claim round takes (see noteRound); touched
	// only by the runner's own loop.
	roundTook time.Duration
	// viewUpTo is the time the runner's last due-view query listed due
	// jobs up to: every job due before it was listed then or has been
	// brought by the feed since. A round that claims only what the feed
	// brought lists nothing, so the next scheduled job is looked for from
	// here (see fetch). Touched only by the runner's own loop.
	viewUpTo time.Time
	// longList records that the last due query listed as many jobs as it
	// asked for: the next fresh one lists them without their documents,
	// which only a short list (an idle runner's) saves a request with.
	// Touched only by the runner's own loop.
	longList bool
	// queries counts next-scheduled queries a wake-up cancelled that may
	// still be ending (nextScheduled); the loop waits for them before it
	// ends.
	queries sync.WaitGroup
	// looking is set while the loop looks for and claims due work: a
	// round's claims take their slots only as they start (see drainedAll).
	looking atomic.Bool
}

// recentClaims is how long a runner skips its claims in a due view read as
// it stands, whatever revision the view lists: longer than such a view
// lags behind a busy runner's claims (about one claim round, as each stale
// read has the server index what it missed). Longer would hide a job that
// came back to the queue from this runner (a retry) for as long.
const recentClaims = 2 * time.Second

// claimedRevisions is how long a runner remembers the revision each of its
// claims was written over. A job read at that revision is a stale copy's
// report of it, however late it comes: the revision has a child (the
// claim), so it is never the job's current one again, and a claim over it
// could only lose. On a cluster a copy that lags (a node under load, or
// one that was cut off) can report it again well after recentClaims, so
// the memory is longer; it is bounded by the jobs a runner claims in this
// time, about 100 bytes each.
const claimedRevisions = 30 * time.Second

// recentClaim is one of a runner's claims of the last claimedRevisions.
type recentClaim struct {
	at   time.Time
	from string // the revision the claim was written over
}

// noteClaim records that the runner claimed id over revision from: a
// round's claims once won, and the jobs claimReleased claims before they
// are sent, since the feed reports those as due meanwhile and a round
// that claimed them too lost a certain race (409), which also marked the
// runner behind and so left its next releases to a claim round.
func (r *runner) noteClaim(id, from string, at time.Time) {
	r.claimsMu.Lock()
	defer r.claimsMu.Unlock()
	r.claimedAt[id] = recentClaim{at: at, from: from}
}

// forgetClaim forgets the runner's claim of id.
func (r *runner) forgetClaim(id string) {
	r.claimsMu.Lock()
	defer r.claimsMu.Unlock()
	delete(r.claimedAt, id)
}

// claimedOver reports whether the runner claimed id over revision rev in
// the last claimedRevisions, or over any revision in the last recentClaims
// when rev is "".
func (r *runner) claimedOver(id, rev string, now time.Time) bool {
	r.claimsMu.Lock()
	defer r.claimsMu.Unlock()
	c, ok := r.claimedAt[id]
	if !ok {
		return false
	}
	if rev == "" {
		return now.Sub(c.at) <= recentClaims
	}
	return c.from == rev
}

// forgetOldClaims forgets the claims older than claimedRevisions and
// returns how many were made in the last recentClaims.
func (r *runner) forgetOldClaims(now time.Time) int {
	r.claimsMu.Lock()
	defer r.claimsMu.Unlock()
	maps.DeleteFunc(r.claimedAt, func(_ string, c recentClaim) bool { return now.Sub(c.at) > claimedRevisions })
	recent := 0
	for _, c := range r.claimedAt {
		if now.Sub(c.at) <= recentClaims {
			recent++
		}
	}
	return recent
}

func (r *runner) nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *runner) free() int { return cap(r.slots) - len(r.slots) }

// idleSlots reports that no job of the runner runs or is being finished.
func (r *runner) idleSlots() bool { return len(r.slots) == 0 && len(r.finishing) == 0 }

// loop finds and claims due work until claiming stops. In drain mode it
// returns (calling drained) once nothing is due and nothing runs; otherwise
// drained is called when the loop ends.
func (r *runner) loop(ctx context.Context, drained func()) {
	defer drained()
	defer r.queries.Wait() // a query left behind ends before the loop does
	log := r.w.log.With().Str("type", r.typ).Logger()
	backoff, nextBackoff := 100*time.Millisecond, 100*time.Millisecond
	for !r.w.stopping() && ctx.Err() == nil {
		if !r.w.untilClaimable(ctx) {
			return // held after an outage (await.go) until ctx ended
		}
		if r.paused.Load() {
			if r.w.cfg.Drain && r.idleSlots() {
				return // a paused type has nothing to drain
			}
			if !r.idle(ctx, r.w.cfg.FallbackPoll) {
				return
			}
			continue
		}
		ended := r.w.jobsEnded.Load()
		r.looking.Store(true)
		more, listedUpTo, err := r.fetch(ctx)
		r.looking.Store(false)
		if err != nil {
			if ctx.Err() != nil || r.w.stopping() {
				return
			}
			log.Warn().Err(err).Dur("retry_in", backoff).Msg("looking for due work failed")
			if !r.w.sleep(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, 10*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if until := time.Until(r.blockedUntil); until > 0 {
			// The window's start slots are gone: wait for the next one.
			if !r.w.sleep(ctx, until) {
				return
			}
			continue
		}
		if more && r.free() > 0 {
			continue
		}
		if r.w.cfg.Drain && !more && r.idleSlots() && r.stealAt.IsZero() && r.w.drainedAll(ended) {
			return
		}
		wait := r.w.cfg.FallbackPoll
		// Raised only with every slot taken: the loop then sets no timer
		// (below) and the next freed slot wakes it to set them. Raised
		// with a slot free, it had a job that ended meanwhile wake an idle
		// runner for a round that read the due view for nothing. Raised
		// before the slots are counted again, so that a slot freed in
		// between still wakes the loop (at worst once for nothing).
		if r.free() == 0 {
			r.slotWanted.Store(true)
			if r.free() > 0 {
				r.slotWanted.Store(false)
			}
		}
		if r.w.cfg.Drain {
			wait = 100 * time.Millisecond // drain: wait only for running jobs
		} else if r.free() > 0 {
			at, ok, woken, err := r.nextScheduled(ctx, listedUpTo)
			if woken {
				continue // work arrived: look for it now, not after the query
			}
			switch {
			case err != nil && ctx.Err() == nil:
				// Not knowing when the next scheduled job is due must not
				// make it wait a whole fallback poll.
				log.Warn().Err(err).Dur("retry_in", nextBackoff).Msg("looking for the next scheduled job failed")
				wait = min(wait, nextBackoff)
				nextBackoff = min(nextBackoff*2, 10*time.Second)
			case err == nil:
				nextBackoff = 100 * time.Millisecond
				if until := time.Until(at); ok && until < wait {
					wait = max(until, time.Millisecond)
				}
			}
		}
		if !r.stealAt.IsZero() && r.free() > 0 {
			// Jobs left to their owners: take them if still due then.
			wait = min(wait, max(time.Until(r.stealAt), time.Millisecond))
		}
		if !r.idle(ctx, wait) {
			return
		}
	}
}

// nextScheduled asks when the type's next scheduled job is due, unless a
// wake-up (the feed reporting work, a slot freed) comes first: then woken
// is true, the query is cancelled and the round the wake-up calls for goes
// ahead at once. On a cluster the query takes about a third of an idle
// round, and a job enqueued while it ran waited for it to end. An answer
// that came after the wake-up could not be trusted anyway: it may predate
// a job scheduled since.
func (r *runner) nextScheduled(ctx context.Context, after time.Time) (at time.Time, ok, woken bool, err error) {
	select {
	case <-r.wake:
		return time.Time{}, false, true, nil
	default:
	}
	qctx, cancel := context.WithTimeout(ctx, r.w.cfg.QueryTimeout)
	defer cancel()
	type answer struct {
		at  time.Time
		ok  bool
		err error
	}
	done := make(chan answer, 1)
	r.queries.Add(1)
	go func() {
		defer r.queries.Done()
		at, ok, err := r.w.client.Next(qctx, r.typ, after)
		done <- answer{at, ok, err}
	}()
	select {
	case a := <-done:
		return a.at, a.ok, false, a.err
	case <-r.wake:
		return time.Time{}, false, true, nil
	}
}

// idle waits for a wake-up, a timer, or the end.
func (r *runner) idle(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.wake:
	case <-t.C:
	case <-ctx.Done():
		return false
	case <-r.w.stopClaiming:
		return false
	}
	return true
}

// fetch claims as many due jobs as there are free slots (at most one
// batch) and starts them. more reports that due work may remain; upTo is
// the time the due list ran up to (where "next scheduled" starts).
func (r *runner) fetch(ctx context.Context) (more bool, upTo time.Time, err error) {
	defer func() { r.behind.Store(more) }()
	r.stealAt = time.Time{} // set again below if this round leaves jobs to peers
	free := r.free()
	if free == 0 {
		return true, r.w.cfg.Now(), nil
	}
	// Documents that cannot be quarantined stay at the front of the due
	// view; read past them so they never starve the jobs behind.
	// With n workers claiming the type, about one row in n is this
	// worker's own (ownFirst): read enough rows to find its share.
	slot := r.w.peers.slot(r.typ)
	slot.spread = r.pick > r.w.cfg.PickAmong
	want := max(r.pick, r.w.cfg.PickAmong, free)
	if slot.size() > 1 {
		want = max(want, ownShareRows*slot.size()*min(free, r.w.cfg.ClaimBatch))
	}
	began := time.Now()
	// Working through a backlog, the runner reads the view as it stands
	// (the server indexes the changes after answering), so that a round
	// does not wait for the index to take the last round's claims and
	// outcomes: those rows are its own recent claims, skipped here, and
	// jobs others claimed, which FetchDue leaves out. It reads the view
	// brought up to date when idle, when the feed reported new work (a
	// new job of a higher priority must not wait a round), or when the
	// view as it stood did not list enough.
	news := r.news.Swap(false)
	stale := r.behind.Load() && !news
	now := time.Now()
	recent := r.forgetOldClaims(now)
	var cands []protocol.DueCandidate
	var listed, k int
	fromFeed := false
	fed := r.takeFed()
	defer func() {
		// Jobs the feed brought that this round did not claim are looked
		// for in the view, which on a cluster may not list them yet: look
		// again a little later, as for a feed without documents.
		if len(fed) > 0 && (!fromFeed || more) && r.w.client.Replicas() > 1 {
			r.w.relook(ctx)
		}
	}()
	if len(fed) > 0 && news && !r.behind.Load() {
		// Idle, woken by the feed with the new jobs' documents: claim
		// them without reading the due view, which on a cluster may not
		// list them yet (its rows come from one copy of each shard). The
		// view is read again only if they were not all claimed; a job
		// scheduled for later, which the feed does not bring, is found
		// when the loop asks when the next one is due.
		slices.SortStableFunc(fed, func(a, b protocol.DueCandidate) int { return a.Priority - b.Priority })
		cands = slices.DeleteFunc(fed, func(c protocol.DueCandidate) bool {
			_, unrepairable := r.unrepairable[c.ID]
			return unrepairable
		})
		// Not a full page: more only if some were not claimed. The round
		// lists nothing up to now: a job the feed brought before it was
		// due, or one the runner was waiting for, may have fallen due since
		// the last view query, and the next scheduled job is looked for
		// from that query's time, so that the runner does not sleep past
		// it to the fallback poll.
		listed, k, upTo = len(fed), len(fed)+1, r.viewUpTo
		fromFeed = true
	}
	for !fromFeed {
		k = want + len(r.unrepairable)
		if stale {
			// Its last round's claims may still be listed first.
			k += min(recent, 2*free)
		}
		k = min(k, maxDueLimit)
		r.w.stats.queries.Add(1)
		qctx, cancel := context.WithTimeout(ctx, r.w.cfg.QueryTimeout)
		if stale || r.longList {
			cands, upTo, err = r.w.client.DueCandidates(qctx, r.typ, k, stale)
		} else {
			cands, upTo, err = r.w.client.DueCandidatesWithDocs(qctx, r.typ, k)
		}
		cancel()
		if err != nil {
			return false, time.Time{}, err
		}
		r.viewUpTo = upTo
		listed = len(cands)
		r.longList = listed == k
		cands = slices.DeleteFunc(cands, func(c protocol.DueCandidate) bool {
			_, unrepairable := r.unrepairable[c.ID]
			return unrepairable || (stale && r.claimedOver(c.ID, "", now))
		})
		if !stale || len(cands) >= r.free() {
			break
		}
		stale = false
	}
	if !fromFeed {
		r.dueTook = time.Since(began)
	}
	if len(cands) == 0 {
		return false, upTo, nil
	}
	// The worker's own jobs first, then others' it may take, at random
	// among the first K without peers, so that workers polling the same
	// view spread over the candidates instead of all racing for row one —
	// within each priority: a higher one always goes first. Only the
	// picked jobs' documents are read. Slots freed while the query ran
	// count (jobs finish meanwhile).
	left := make(map[string]time.Time, len(r.leftSince))
	stealAfter := r.stealAfter()
	claimable := ownFirst(cands, slot, func(id string) time.Duration {
		since, ok := r.leftSince[id]
		if !ok {
			since = now
		}
		left[id] = since
		return now.Sub(since)
	}, stealAfter)
	// Look again when a job left to its owner may be taken (by this
	// worker as its thief, or by anyone).
	r.leftSince = left
	for _, since := range left {
		for _, at := range []time.Time{since.Add(stealAfter), since.Add(2 * stealAfter), since.Add(anyoneAfter * stealAfter)} {
			if at.After(now) && (r.stealAt.IsZero() || at.Before(r.stealAt)) {
				r.stealAt = at
			}
		}
	}
	n := min(r.free(), r.w.cfg.ClaimBatch, claimable)
	if n == 0 {
		return false, upTo, nil // every job listed is another's, for now
	}
	qctx, cancel := context.WithTimeout(ctx, r.w.cfg.QueryTimeout)
	batch, err := r.w.client.FetchCandidates(qctx, cands[:n])
	cancel()
	if err != nil {
		return false, time.Time{}, err
	}
	r.w.refreshPeersIfNew(ctx, batch.ClaimedBy)
	repaired := 0
	if len(batch.Malformed) > 0 {
		repaired = r.quarantine(ctx, batch.Malformed)
	}
	// A job this runner claimed, read from a copy that does not hold the
	// claim yet (the feed's, on a cluster, reported it again as due), or
	// one it released and claims on another goroutine (claimReleased):
	// claiming it again could only lose, and would count as a race lost
	// to a peer.
	read := len(batch.Items)
	items := slices.DeleteFunc(batch.Items, func(it *protocol.WorkItem) bool { return r.claimedOver(it.ID, it.Rev, now) })
	// Claimed by others, finished or malformed since the query: the next
	// round looks again.
	more = listed == k || n < claimable || read < n
	if len(items) == 0 {
		// Look again only if something changed; an unrepairable document
		// must not make the runner spin.
		return repaired > 0 || (more && len(batch.Malformed) == 0), upTo, nil
	}
	n = len(items)
	rl, limited := r.w.cfg.RateLimits[r.typ]
	if limited {
		if n = r.takeStarts(ctx, rl, n); n == 0 {
			return true, upTo, nil
		}
	}
	var runSlots []*protocol.RunSlot
	if k, ok := r.w.cfg.FleetConcurrency[r.typ]; ok {
		if runSlots = r.takeRunSlots(ctx, k, n); len(runSlots) < n {
			if limited {
				r.tokens += n - len(runSlots) // start slots not used serve the next claim
			}
			n = len(runSlots)
		}
		if n == 0 {
			return true, upTo, nil
		}
	}
	if limited && !r.inWindow(rl) {
		// Taking the slots took us too near the window's end (or past it):
		// the claims would be stamped in the next window.
		r.releaseRunSlots(runSlots)
		return true, upTo, nil
	}
	// A claim already on its way is not cut off by Stop: the server may
	// apply it anyway, leaving the job claimed (and an attempt charged)
	// until its lease ran out. Claimed jobs start and Stop handles them.
	var deadline time.Time // claims with start slots are stamped in their window
	if limited {
		deadline = r.tokenWindow.Add(rl.Per)
	}
	from := make(map[string]string, n)
	for _, it := range items[:n] {
		from[it.ID] = it.Rev
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	results, ok := r.w.client.ClaimManyBefore(cctx, items[:n], r.w.by, r.w.cfg.LeaseDuration, deadline)
	cancel()
	if !ok {
		// The window ended since inWindow looked (a stall): its slots are gone.
		r.tokens, r.blockedUntil = 0, deadline
		r.releaseRunSlots(runSlots)
		return true, upTo, nil
	}
	conflicts := r.tallyClaims(results, func(item *protocol.WorkItem) {
		r.noteClaim(item.ID, from[item.ID], now)
		var slot *protocol.RunSlot
		if len(runSlots) > 0 {
			slot, runSlots = runSlots[0], runSlots[1:]
		}
		r.start(item, slot)
	})
	r.widenPick(conflicts)
	r.noteRound(time.Since(began))
	if conflicts > 0 {
		r.w.refreshPeersAfterLoss(ctx)
	}
	r.releaseRunSlots(runSlots) // the lost claims' run slots
	if limited && r.tokenWindow.Equal(rl.Window(r.w.cfg.Now())) {
		r.tokens += conflicts // a lost claim started nothing: its slot serves the next
	}
	return more || conflicts > 0, upTo, nil
}

// concedeLater gives up claims that were stored but will not run (a
// cluster's claims that reached a minority of the copies, or found the job
// on another branch) after the wait they ask for, or at once when the
// worker stops, so that their jobs do not wait for the claims' leases
// (protocol.Client.Concede).
func (w *Worker) concedeLater(claims []*protocol.UnrunClaim) {
	if len(claims) == 0 {
		return
	}
	var wait time.Duration
	for _, u := range claims {
		wait = max(wait, u.Wait)
	}
	concede := func() {
		ctx, cancel := context.WithTimeout(context.Background(), concedeTimeout)
		defer cancel()
		w.stats.conceded.Add(int64(w.client.Concede(ctx, w.by, claims)))
	}
	// Called from a runner's loop and from a job's goroutine alike (a
	// released job claimed at once), so the goroutine is counted in a group
	// of its own that Stop closes before it waits: a WaitGroup's Add must
	// not race a Wait that may find it at zero. Once the group is closed,
	// the claims are conceded at once, on the caller's goroutine.
	w.concedeMu.Lock()
	if w.concedesClosed {
		w.concedeMu.Unlock()
		concede()
		return
	}
	w.concedes.Add(1)
	w.concedeMu.Unlock()
	go func() {
		defer w.concedes.Done()
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-w.stopClaiming:
		}
		concede()
	}()
}

// concedeTimeout bounds conceding a round's unrun claims, which Stop waits
// for: one that fails leaves them to their leases, as before.
const concedeTimeout = 5 * time.Second

// maxFed bounds the jobs the feed brought that a runner keeps for its next
// round: more than a round claims, fewer than a view page.
const maxFed = 200

// offer keeps claimable jobs the feed brought with their documents for the
// next round (see fetch); the newest replace the oldest past maxFed.
func (r *runner) offer(due []protocol.DueCandidate) {
	if len(due) == 0 {
		return
	}
	r.fedMu.Lock()
	defer r.fedMu.Unlock()
	r.fedDue = append(r.fedDue, due...)
	if extra := len(r.fedDue) - maxFed; extra > 0 {
		r.fedDue = slices.Delete(r.fedDue, 0, extra)
	}
}

// takeFed returns the jobs offered since the last round and forgets them.
func (r *runner) takeFed() []protocol.DueCandidate {
	r.fedMu.Lock()
	defer r.fedMu.Unlock()
	fed := r.fedDue
	r.fedDue = nil
	return fed
}

// stealRounds is how many of its claim rounds a worker leaves a job to the
// owner that would take it next, at the least (see stealAfter).
const stealRounds = 3

// maxStealRoundsWait bounds how far slow rounds stretch stealAfter, in
// Config.StealAfter: one stalled round must not leave a busy owner's jobs
// waiting for long.
const maxStealRoundsWait = 8

// stealAfter is how long this runner leaves a job to its owner before its
// thief may take it: Config.StealAfter, or stealRounds of its own claim
// rounds when those take longer (up to maxStealRoundsWait times
// StealAfter). An owner takes the job in its next round, which on a
// loaded server comes later than StealAfter: a thief that took it sooner
// raced the owner for it. With 16 workers of 4 slots on one busy node a
// round took about 320 ms, and such races were about a third of the
// claims lost.
func (r *runner) stealAfter() time.Duration {
	base := r.w.cfg.StealAfter
	if base < 0 {
		return base
	}
	return max(base, min(stealRounds*r.roundTook, maxStealRoundsWait*base))
}

// noteRound folds a claim round's duration into roundTook, a moving
// average over about eight rounds.
func (r *runner) noteRound(d time.Duration) {
	if r.roundTook == 0 {
		r.roundTook = d
		return
	}
	r.roundTook += (d - r.roundTook) / 8
}

// ownShareRows is how many rows per claim a runner that shares its type
// with n-1 other workers reads, times n: the jobs that hash to it are about
// one in n, and twice what it claims leaves room for chance.
const ownShareRows = 2

// maxPickWidening bounds how far widenPick takes K: PickAmong times this.
const maxPickWidening = 8

// widenPick sets K for the next round from this round's lost claims. Many
// workers reading the same first K rows at once pick the same jobs: 16
// claimants taking 4 each among 32 lose about one claim per job won (a
// 409 each, or a lost confirmation on a cluster). A round that lost claims
// doubles K, up to maxPickWidening times PickAmong, so that contending
// workers spread over more of the queue; each round that lost none takes
// an eighth back off, so a quiet queue returns to PickAmong and to near
// oldest-first order. Priorities are unaffected: a higher one still goes
// first (shuffleWithinPriority).
func (r *runner) widenPick(lost int) {
	base := r.w.cfg.PickAmong
	switch {
	case lost > 0:
		r.pick = min(2*max(r.pick, base), maxPickWidening*base, maxDueLimit)
	case r.pick > base:
		r.pick = max(base, r.pick-max(1, r.pick/8))
	}
}

// runningJob is a job in flight. mu serialises the writes that carry its
// revision: lease renewals and the final outcome.
type runningJob struct {
	mu       sync.Mutex
	item     *protocol.WorkItem
	cancel   context.CancelCauseFunc
	finished bool // the outcome was written (or given up): no more writes
	// outcome is set once the handler has returned: mu is then held for
	// the outcome's write, which tries for up to outcomeTimeout.
	outcome atomic.Bool
	started time.Time
	// slot is the fleet-wide run slot the job holds (FleetConcurrency),
	// renewed with its lease and released when it ends.
	slot *protocol.RunSlot

	// pmu guards the handler's latest progress report, which the heartbeat
	// writes; a report never waits for mu (a write in flight).
	pmu      sync.Mutex
	progress *protocol.Progress // the latest report; nil before the first
	unsaved  bool               // progress is not stored yet
	// reported wakes the heartbeat for a report (capacity 1).
	reported chan struct{}
}

// Report keeps p as the job's latest progress for the heartbeat to write
// (jobrun.Reporter).
func (rj *runningJob) Report(p *protocol.Progress) {
	rj.pmu.Lock()
	rj.progress, rj.unsaved = p, true
	rj.pmu.Unlock()
	select {
	case rj.reported <- struct{}{}:
	default:
	}
}

// latestProgress is the latest report and whether it is unsaved.
func (rj *runningJob) latestProgress() (*protocol.Progress, bool) {
	rj.pmu.Lock()
	defer rj.pmu.Unlock()
	return rj.progress, rj.unsaved
}

// savedProgress records that p was stored, unless a newer report came in
// meanwhile.
func (rj *runningJob) savedProgress(p *protocol.Progress) {
	rj.pmu.Lock()
	if rj.progress == p {
		rj.unsaved = false
	}
	rj.pmu.Unlock()
}

// start takes a slot and runs the claimed job in its own goroutine.
func (r *runner) start(item *protocol.WorkItem, slot *protocol.RunSlot) {
	r.slots <- struct{}{}
	r.launch(item, slot)
}

// launch runs the claimed job in its own goroutine, in a slot already
// taken.
func (r *runner) launch(item *protocol.WorkItem, slot *protocol.RunSlot) {
	w := r.w
	ctx, cancel := context.WithCancelCause(w.jobsCtx)
	rj := &runningJob{item: item, cancel: cancel, started: w.cfg.Now(), slot: slot, reported: make(chan struct{}, 1)}
	w.mu.Lock()
	w.running[item.ID] = rj
	w.mu.Unlock()
	w.cfg.Metrics.jobStarted(r.typ)
	w.jobs.Add(1)
	go func() {
		defer w.jobs.Done()
		handlerDone := func() {
			r.finishing <- struct{}{}
			w.mu.Lock()
			w.busy += w.cfg.Now().Sub(rj.started)
			w.mu.Unlock()
			w.cfg.Metrics.jobEnded(r.typ)
			<-r.slots
			// A freed slot matters only if work was left behind, or if
			// the loop waits for one to set its timers (a job scheduled
			// or left to a peer may be due by now); otherwise the changes
			// feed says when new work arrives.
			wanted := r.slotWanted.Swap(false)
			if r.behind.Load() || r.w.cfg.Drain || wanted {
				r.nudge()
			}
		}
		defer func() {
			w.mu.Lock()
			delete(w.running, item.ID)
			w.mu.Unlock()
			<-r.finishing
			if r.w.cfg.Drain {
				// A job's handler may have enqueued work of any of the
				// worker's types: every type looks again, at the view
				// brought up to date, before it ends.
				w.jobsEnded.Add(1)
				w.wakeAll() // drain ends once the last outcome is written
			}
		}()
		defer cancel(nil)
		r.run(ctx, rj, handlerDone)
		if rj.slot != nil {
			r.releaseRunSlots([]*protocol.RunSlot{rj.slot})
		}
	}()
}

// run executes one attempt: handler plus heartbeat, then records the
// outcome, calling handlerDone (which frees the job's run slot) between.
func (r *runner) run(ctx context.Context, rj *runningJob, handlerDone func()) {
	w := r.w
	item := rj.item
	log := w.log.With().Str("job", item.ID).Str("type", r.typ).Int("attempt", item.Attempts).Logger()
	most := w.client.MaxAttempts(item)
	// Read before the heartbeat starts: its renewals write the item.
	attempt := item.Attempts
	job := jobrun.New(item, most, rj, w.cfg.Now)
	jobrun.Attach(job, w.client)

	hbDone := make(chan struct{})
	hbStopped := make(chan struct{})
	go func() {
		defer close(hbStopped)
		r.heartbeat(ctx, rj, hbDone)
	}()
	log.Debug().Msg("job started")
	began := time.Now()
	var err error
	var usedSlot *protocol.Reservation
	if attempt > most {
		// Written with its attempts used up (by hand, or max_attempts
		// lowered while it waited): no attempt is left to run.
		err = JobFail(fmt.Errorf("no attempts left: this would be attempt %d of %d", attempt, most))
		log.Warn().Int("max_attempts", most).Msg("job claimed with no attempts left: failed without running")
	} else {
		usedSlot, err = r.invokeBounded(ctx, job, log)
	}
	w.cfg.Metrics.handlerRan(r.typ, time.Since(began))
	close(hbDone)
	<-hbStopped
	handlerDone()

	rj.outcome.Store(true) // before mu: releaseStuck must not wait for the write
	if usedSlot != nil {
		// Whatever becomes of the outcome: the handler used the slot.
		r.recordUsedSlot(ctx, usedSlot, log)
	}
	rj.mu.Lock()
	defer rj.mu.Unlock()
	if rj.finished {
		return // released by a stuck shutdown: the outcome is not ours to write
	}
	rj.finished = true
	if p, _ := rj.latestProgress(); p != nil {
		item.Progress = p // the last report is written with the outcome
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, errLeaseLost) {
		w.stats.lost.Add(1)
		w.cfg.Metrics.claimsLostBy(r.typ, LostLease, 1)
		log.Warn().AnErr("handler_err", err).Msg("claim was lost while running; result discarded")
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	if (errors.Is(cause, errShutdown) || errors.Is(cause, errRunSlotLost)) && err != nil {
		// Cancelled by shutdown, or to keep the fleet's limit: the attempt
		// did not really fail.
		why := "worker shut down before the job finished"
		if errors.Is(cause, errRunSlotLost) {
			why = "its fleet-wide run slot was taken by another worker while this one could not renew it"
		}
		if rerr := r.persist(fctx, item, false, func(ctx context.Context) error {
			return w.client.Release(ctx, item, why)
		}); rerr != nil {
			log.Warn().Err(rerr).Str("why", why).Msg("could not release the job; the sweeper will return it")
			return
		}
		log.Info().Str("why", why).Msg("job released")
		return
	}
	var look *protocol.DependentsLook
	if err == nil {
		// The job will be done: look for the jobs waiting for it while its
		// outcome is written.
		look = w.client.LookForDependents(fctx, item.ID)
	}
	octx, cancelOutcome := context.WithTimeout(context.WithoutCancel(ctx), outcomeTimeout)
	defer cancelOutcome()
	defer context.AfterFunc(w.stopped, cancelOutcome)() // a stopped worker writes nothing more
	if ferr := r.finish(octx, item, job, err); ferr != nil {
		if errors.Is(ferr, protocol.ErrClaimLost) {
			w.stats.lost.Add(1)
			w.cfg.Metrics.claimsLostBy(r.typ, LostLease, 1)
			log.Warn().Err(ferr).Msg("result refused: the claim was lost (swept or cancelled) before it was written")
			return
		}
		log.Error().Err(ferr).Msg("could not record the job's outcome: once its lease has run out a sweep returns it to the queue, and it runs again")
		return
	}
	if item.Status.Terminal() {
		// Jobs waiting for this one (and its batch's callback) are
		// released by the worker that finished it; if this fails, or the
		// process dies first, the sweeper does it.
		released, rerr := w.client.FinishedReleasing(fctx, item, w.by, look)
		if rerr != nil {
			log.Warn().Err(rerr).Msg("could not release the jobs waiting for this one; the sweeper will")
		}
		w.claimReleased(fctx, released)
	}
}

// invokeBounded calls the handler (invokeWithSlot) within the worker's
// JobTimeout, if it has one. The job's own context (heartbeat, shutdown,
// a lost lease) is not bounded: the lease is renewed until the handler
// returns.
func (r *runner) invokeBounded(ctx context.Context, job *Job, log zerolog.Logger) (*protocol.Reservation, error) {
	limit := r.w.cfg.JobTimeout
	if limit <= 0 {
		return r.invokeWithSlot(ctx, job, log)
	}
	hctx, cancel := context.WithTimeoutCause(ctx, limit, errJobTimeout)
	defer cancel()
	stop := context.AfterFunc(hctx, func() {
		if errors.Is(context.Cause(hctx), errJobTimeout) {
			log.Warn().Dur("job_timeout", limit).Msg("job ran past its timeout: its context is cancelled, and it keeps its slot and lease until its handler returns")
		}
	})
	defer stop()
	used, err := r.invokeWithSlot(hctx, job, log)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(hctx), errJobTimeout) {
		return used, fmt.Errorf("job timed out after %s: %w", limit, err)
	}
	return used, err
}

// invokeWithSlot calls the handler, with a slot of the type's sequence
// reserved for it when it has one: returned when the handler succeeds,
// to be recorded used (recordUsedSlot), abandoned (free for the next job)
// otherwise.
func (r *runner) invokeWithSlot(ctx context.Context, job *Job, log zerolog.Logger) (*protocol.Reservation, error) {
	seq, ok := r.w.cfg.Sequences[r.typ]
	if !ok {
		return nil, r.invoke(ctx, job)
	}
	c := r.w.client
	res, err := c.Reserve(ctx, seq, r.w.ClaimantID()+"/"+job.ID)
	if err != nil {
		return nil, fmt.Errorf("reserving a slot of sequence %s: %w", seq.Name, err)
	}
	job.Slot = res.Slot
	if herr := r.invoke(ctx, job); herr != nil {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
		defer cancel()
		if aerr := c.AbandonSlot(fctx, res); aerr != nil {
			log.Warn().Err(aerr).Str("slot", res.Slot).Msg("could not abandon the slot; it is free again when its TTL runs out")
		}
		return nil, herr
	}
	return res, nil
}

// recordUsedSlot records the slot a job's handler used, before the job's
// outcome is written (and after the worker has said that it is writing
// it, so that a stopping worker does not release the job meanwhile).
func (r *runner) recordUsedSlot(ctx context.Context, res *protocol.Reservation, log zerolog.Logger) {
	err := r.releaseUsedSlot(ctx, res)
	ttl := r.w.cfg.Sequences[r.typ].TTL
	switch {
	case errors.Is(err, protocol.ErrReservationLost):
		log.Error().Err(err).Str("slot", res.Slot).Dur("ttl", ttl).
			Msg("the job used its slot, which another holder took when its TTL ran out: make the sequence's TTL longer than the handler runs")
	case err != nil:
		log.Error().Err(err).Str("slot", res.Slot).Dur("ttl", ttl).
			Msg("the job used its slot but could not record it: once its TTL has run out, another job may take the same slot")
	}
}

// releaseUsedSlot marks the slot a job's handler used, trying again while
// CouchDB is out of reach or failing, as the job's outcome is (and before
// it): a slot left reserved becomes free when its TTL runs out, and the
// next job takes the value this one used.
func (r *runner) releaseUsedSlot(ctx context.Context, res *protocol.Reservation) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), outcomeTimeout)
	defer cancel()
	defer context.AfterFunc(r.w.stopped, cancel)() // a stopped worker writes nothing more
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := r.w.client.ReleaseSlot(rctx, res)
		if err == nil || errors.Is(err, protocol.ErrReservationLost) || permanent(err) {
			return err
		}
		if attempt%30 == 0 {
			r.w.log.Warn().Err(err).Str("slot", res.Slot).Dur("retry_in", backoff).Int("tries", attempt+1).Msg("recording the job's slot as used failed; retrying")
		}
		if !waitToRetry(rctx, &backoff) {
			return err
		}
	}
}

// waitToRetry waits backoff before a write is tried again, and doubles it
// up to 2 s; false when ctx ended first.
func waitToRetry(ctx context.Context, backoff *time.Duration) bool {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	*backoff = min(*backoff*2, 2*time.Second)
	return true
}

// finish records the handler's outcome, steered by its error.
func (r *runner) finish(ctx context.Context, item *protocol.WorkItem, job *Job, herr error) error {
	w := r.w
	c := w.client
	out := jobrun.Decide(herr, job.Attempt, job.MaxAttempts)
	if out.Kind == jobrun.Done {
		w.stats.completed.Add(1)
		var err error
		if w.cfg.DeleteDone[r.typ] && item.Batch == "" && !protocol.HoldsPeriod(item) {
			// A batch's jobs stay: its callback counts them. So do
			// unique jobs with a period, which hold their key.
			err = r.persist(ctx, item, true, func(ctx context.Context) error { return c.DeleteFinished(ctx, item) })
		} else {
			err = r.persist(ctx, item, false, func(ctx context.Context) error { return c.Complete(ctx, item, job.Result()) })
		}
		if err == nil {
			w.cfg.Metrics.succeededJob(r.typ)
		}
		return err
	}
	switch out.Kind {
	case jobrun.AwaitingChildren:
		return r.persist(ctx, item, false, func(ctx context.Context) error { return c.AwaitChildren(ctx, item, jobrun.ChildrenOf(job)) })
	case jobrun.Snoozed:
		return r.persist(ctx, item, false, func(ctx context.Context) error { return c.Snooze(ctx, item, out.Delay) })
	case jobrun.Cancelled:
		return r.persist(ctx, item, false, func(ctx context.Context) error { return c.Cancel(ctx, item, out.Err.Error()) })
	}
	w.stats.failed.Add(1)
	opts := protocol.FailOptions{Final: out.Kind == jobrun.Failed, RetryAfter: retryDelay(w.cfg.Retry(item.Attempts), herr)}
	if err := r.persist(ctx, item, false, func(ctx context.Context) error {
		return c.Fail(ctx, item, herr.Error(), opts)
	}); err != nil {
		return err
	}
	w.cfg.Metrics.failedAttempt(r.typ, item.Status == protocol.StatusFailed)
	ev := w.log.Info()
	if item.Status == protocol.StatusFailed {
		ev = w.log.Warn()
	}
	ev.Str("job", item.ID).Str("type", r.typ).Int("attempt", item.Attempts).Str("status", string(item.Status)).
		Str("error", herr.Error()).Msg("attempt failed")
	return nil
}

// retryDelay is the delay before the next attempt: the worker's backoff,
// or longer when the handler's error asks for it with a RetryAfter method
// (a receiver's Retry-After, as the webhook handler reports it), capped at
// RetryCapDefault. A server that says when to come back is not asked
// sooner; one that says "soon" still gets the backoff that protects it.
func retryDelay(backoff time.Duration, herr error) time.Duration {
	var asks interface{ RetryAfter() time.Duration }
	if errors.As(herr, &asks) {
		return max(backoff, min(asks.RetryAfter(), RetryCapDefault))
	}
	return backoff
}

// persist makes a write of a held job's outcome, retrying while the server
// is unreachable or failing (a restart, a network blip) until ctx ends: an
// outcome given up on would run the job again once its lease ran out. A
// retried write may have been applied by the server although its answer was
// lost; the 409 the retry then gets is checked against the stored document
// before it is reported as a lost claim.
func (r *runner) persist(ctx context.Context, item *protocol.WorkItem, deletes bool, write func(context.Context) error) error {
	held := *item
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := write(ctx)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, protocol.ErrClaimLost), errors.Is(err, protocol.ErrNotFound):
			if attempt > 0 && r.appliedEarlier(ctx, &held, item, deletes) {
				return nil
			}
			return err
		case permanent(err):
			return err
		}
		if attempt%30 == 0 { // the first, then about every minute of a long outage
			r.w.log.Warn().Err(err).Str("job", item.ID).Dur("retry_in", backoff).Int("tries", attempt+1).Msg("recording the job's outcome failed; retrying")
		}
		if !waitToRetry(ctx, &backoff) {
			return err
		}
	}
}

// permanent reports errors a retry cannot fix: the server understood the
// request and refused it (4xx), or the write itself was invalid. A refusal
// of the worker's user rather than of the write (its password changed, its
// role or membership taken away) is an operator's to put right, which
// tries for the outcome's while can outlast: given up at once, the job
// went back to the queue and ran again as soon as the worker was let in.
func permanent(err error) bool {
	status := kivik.HTTPStatus(err)
	switch {
	case status == http.StatusUnauthorized:
		return false
	case status == http.StatusForbidden && userRefused(err.Error()):
		return false
	}
	// kivik reports a connection that failed as 502; 408 and 429 pass.
	return status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// outage reports whether err is CouchDB out of reach or failing (no
// answer, which kivik reports as 502, or a 5xx), rather than a refusal of
// the request.
func outage(err error) bool {
	return err != nil && kivik.HTTPStatus(err) >= http.StatusInternalServerError
}

// userRefused reports whether a 403's message refuses the user, not the
// document: CouchDB's member check, or the roles of couchq's validation.
func userRefused(msg string) bool {
	for _, who := range []string{"not allowed to access this db", "is neither a couchq worker nor a producer", "is a couchq producer"} {
		if strings.Contains(msg, who) {
			return true
		}
	}
	return false
}

// appliedEarlier reports whether an earlier try of a write that now gets
// 409 was in fact applied: the stored revision is the next one after the
// held revision and its last history entry is ours. On true, item takes
// the stored document.
func (r *runner) appliedEarlier(ctx context.Context, held, item *protocol.WorkItem, deletes bool) bool {
	cur, err := r.w.client.Get(ctx, held.ID)
	if deletes {
		return errors.Is(err, protocol.ErrNotFound)
	}
	if err != nil || len(cur.History) == 0 || revGeneration(cur.Rev) != revGeneration(held.Rev)+1 {
		return false
	}
	last := cur.History[len(cur.History)-1]
	if last.By != held.ClaimedBy || last.Event == protocol.EventClaimed {
		return false
	}
	*item = *cur
	return true
}

// revGeneration is the number before the dash of a revision id.
func revGeneration(rev string) int {
	n := 0
	for _, c := range rev {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// heartbeat renews the job's lease every HeartbeatInterval until done
// closes, and stores the handler's progress reports: each write renews the
// lease and carries the latest report, and a report unsaved is written on
// its own no sooner than ProgressInterval after the job's last write. So a
// chatty handler costs at most one write per ProgressInterval, and one that
// reports less often than the lease is renewed costs nothing. A write
// refused with 409 means the claim is gone: the handler's context is
// cancelled and its result will not be written.
func (r *runner) heartbeat(ctx context.Context, rj *runningJob, done <-chan struct{}) {
	w := r.w
	lastWrite := time.Now()
	slotDue := lastWrite.Add(w.cfg.HeartbeatInterval)
	// answerLost records that the last write failed without an answer
	// (a timeout, a connection cut): the server may have applied it.
	answerLost := false
	t := time.NewTimer(w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		case <-rj.reported:
		}
		now := time.Now()
		renewDue := lastWrite.Add(w.cfg.HeartbeatInterval)
		p, unsaved := rj.latestProgress()
		progressDue := lastWrite.Add(w.cfg.ProgressInterval)
		if now.Before(renewDue) && (!unsaved || now.Before(progressDue)) {
			// Nothing to write yet: wake for the renewal, or the report.
			next := renewDue
			if unsaved && progressDue.Before(next) {
				next = progressDue
			}
			resetTimer(t, next.Sub(now))
			continue
		}
		if !unsaved {
			p = nil // stored already: the renewal need not rewrite it
		}
		rj.mu.Lock()
		if rj.finished {
			rj.mu.Unlock()
			return
		}
		// Not cut off by the job's cancellation (shutdown): the server may
		// apply an aborted renewal anyway, and the outcome written next
		// (Release) would then carry a stale _rev and be refused.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
		began := time.Now()
		err := w.client.ExtendWithProgress(rctx, rj.item, w.cfg.LeaseDuration, p)
		took := time.Since(began)
		cancel()
		if err == nil && rj.slot != nil && !now.Before(slotDue) {
			// The run slot's lease runs on the heartbeat's schedule, however
			// often progress renews the job's.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
			switch serr := w.client.RenewRunSlot(sctx, rj.slot, rj.item.ID, w.cfg.LeaseDuration); {
			case errors.Is(serr, protocol.ErrRunSlotLost):
				r.replaceRunSlot(sctx, rj, serr)
			case serr != nil:
				w.log.Warn().Str("job", rj.item.ID).Err(serr).Msg("renewing the job's run slot failed; will retry")
			}
			cancel()
			slotDue = now.Add(w.cfg.HeartbeatInterval)
		}
		rj.mu.Unlock()
		// A failed write is tried again a beat later, like a renewal.
		lastWrite = now
		w.checkRenewalLatency(rj.item.ID, took)
		switch {
		case err == nil:
			if p != nil {
				rj.savedProgress(p)
			}
			w.cfg.Metrics.renewal(r.typ, RenewalOK, took)
		case errors.Is(err, protocol.ErrClaimLost) && answerLost && r.appliedUnanswered(ctx, rj):
			// Our own earlier write, applied although its answer was lost,
			// made this one stale: the claim is still ours. Write again now
			// on the stored revision.
			answerLost = false
			lastWrite = time.Time{} // the lease was not renewed: write at once
			w.log.Info().Str("job", rj.item.ID).Msg("a lease renewal whose answer was lost had been applied; the claim holds")
			resetTimer(t, 0)
			continue
		case errors.Is(err, protocol.ErrClaimLost), errors.Is(err, protocol.ErrNotFound):
			// claims_lost counts it once the handler returned (run).
			w.cfg.Metrics.renewal(r.typ, RenewalRefused, took)
			w.log.Warn().Str("job", rj.item.ID).Err(err).Msg("lease renewal refused: cancelling the handler")
			rj.cancel(errLeaseLost)
			return
		case ctx.Err() != nil:
			return
		default:
			w.cfg.Metrics.renewal(r.typ, RenewalError, took)
			// The lease still has time: try again at the next beat.
			w.log.Warn().Str("job", rj.item.ID).Err(err).Msg("lease renewal failed; will retry")
		}
		answerLost = err != nil && !permanent(err)
		next := w.cfg.HeartbeatInterval
		if _, unsaved := rj.latestProgress(); unsaved {
			next = min(next, w.cfg.ProgressInterval)
		}
		resetTimer(t, next)
	}
}

// appliedUnanswered reports whether the job's stored document is a later
// revision of the same claim (held by this worker since the same claim, the
// same attempt): what a renewal or progress write leaves when the server
// applied it but its answer was lost. On true the running job takes that
// revision, so that its next write does not find its own write in the way.
func (r *runner) appliedUnanswered(ctx context.Context, rj *runningJob) bool {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.w.cfg.QueryTimeout)
	defer cancel()
	rj.mu.Lock()
	defer rj.mu.Unlock()
	held := rj.item
	cur, err := r.w.client.Get(gctx, held.ID)
	if err != nil || rj.finished || !cur.Claimed || cur.Status != protocol.StatusRunning || cur.ClaimedBy != held.ClaimedBy ||
		cur.ClaimedAt != held.ClaimedAt || cur.Attempts != held.Attempts || revGeneration(cur.Rev) <= revGeneration(held.Rev) {
		return false
	}
	*rj.item = *cur
	return true
}

// resetTimer sets t, which has fired or been drained, to fire after d.
func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(max(d, time.Millisecond))
}

// slowRenewalWarnEvery bounds how often a worker warns about slow lease
// renewals: once a minute, however many jobs see them.
const slowRenewalWarnEvery = time.Minute

// checkRenewalLatency warns when a lease renewal took over a third of the
// lease: a server that slow (a loaded cluster, a node down) lets leases
// lapse while their jobs run, and the sweeper then gives the jobs to
// another worker. The warning has the figures and a lease that would fit.
func (w *Worker) checkRenewalLatency(job string, took time.Duration) {
	if took <= w.cfg.LeaseDuration/3 {
		return
	}
	w.stats.slowRenewals.Add(1)
	now := time.Now().UnixNano()
	last := w.slowWarned.Load()
	if last != 0 && time.Duration(now-last) < slowRenewalWarnEvery {
		return
	}
	if !w.slowWarned.CompareAndSwap(last, now) {
		return
	}
	suggest := (10 * took).Round(time.Second)
	w.log.Warn().Str("job", job).Dur("took", took).Dur("lease", w.cfg.LeaseDuration).
		Dur("heartbeat", w.cfg.HeartbeatInterval).Dur("suggested_lease", max(suggest, w.cfg.LeaseDuration)).
		Msg("lease renewal slow: at this latency leases may lapse while jobs run; raise LeaseDuration (--lease) (warned at most once a minute)")
}

// releaseStuck releases the claims of jobs whose handlers ignored
// cancellation at shutdown, so they run again elsewhere at once.
func (w *Worker) releaseStuck(ctx context.Context) {
	w.mu.Lock()
	stuck := make([]*runningJob, 0, len(w.running))
	for _, rj := range w.running {
		stuck = append(stuck, rj)
	}
	w.mu.Unlock()
	for _, rj := range stuck {
		if !lockUnlessWritingOutcome(rj) {
			// Its handler returned: the job's goroutine writes the outcome
			// (while CouchDB does not answer, for up to outcomeTimeout), or
			// gives the job up to the sweeper. Stop does not wait for it.
			continue
		}
		if !rj.finished {
			rj.finished = true
			if err := w.client.Release(ctx, rj.item, "handler did not stop at shutdown"); err != nil {
				w.log.Warn().Err(err).Str("job", rj.item.ID).Msg("could not release stuck job; the sweeper will")
			}
		}
		rj.mu.Unlock()
	}
}

// lockUnlessWritingOutcome locks rj.mu, unless the job's outcome is being
// written (or is about to be): then it reports false, having locked
// nothing. A renewal in flight holds mu a moment only, and is waited for.
func lockUnlessWritingOutcome(rj *runningJob) bool {
	for !rj.mu.TryLock() {
		if rj.outcome.Load() {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rj.outcome.Load() {
		rj.mu.Unlock() // its goroutine writes the outcome next
		return false
	}
	return true
}

// quarantine marks malformed documents failed so they stop occupying the
// front of the due view (the offending values are kept in the document) and
// returns how many it repaired. Documents that cannot be repaired are
// remembered, logged once, and not tried again by this worker.
func (r *runner) quarantine(ctx context.Context, bad []protocol.Malformed) int {
	todo := make([]protocol.Malformed, 0, len(bad))
	for _, m := range bad {
		if _, known := r.unrepairable[m.ID]; !known {
			todo = append(todo, m)
		}
	}
	if len(todo) == 0 {
		return 0
	}
	repaired := 0
	for i, err := range r.w.client.QuarantineMany(ctx, todo, r.w.by) {
		switch {
		case err == nil:
			repaired++
		case errors.Is(err, protocol.ErrUnrepairable):
			if len(r.unrepairable) < maxUnrepairable {
				r.unrepairable[todo[i].ID] = struct{}{}
			}
			r.w.log.Warn().Err(err).Str("job", todo[i].ID).Msg("skipping a malformed WorkItem that cannot be quarantined")
		default:
			r.w.log.Warn().Err(err).Str("job", todo[i].ID).Msg("could not quarantine malformed WorkItem; will retry")
		}
	}
	return repaired
}

// rateMargin is how close to a window's end a runner stops claiming with
// that window's start slots: a claim's claimed_at must fall in the window
// its slot was taken for.
const rateMargin = 20 * time.Millisecond

// takeStarts returns how many of want jobs the type's rate limit lets start
// now, taking start slots as needed (see protocol.RateLimit). Slots a lost
// claim did not use are kept for the next claim in the same window. When
// none is left it sets blockedUntil.
//
// A round of taking slots costs two requests, which on a busy cluster can
// last longer than what is left of the window, or than a whole window:
// slots taken for a window that ended meanwhile would be wasted. So a
// round takes the slots of the window it will end in, judged by how long
// the last round took, and the runner waits for that window to begin.
func (r *runner) takeStarts(ctx context.Context, rl protocol.RateLimit, want int) int {
	now := r.w.cfg.Now()
	win := rl.Window(now)
	if r.tokenWindow.Before(win) {
		r.tokens, r.tokenWindow = 0, win // a past window's slots are no use
	}
	// Take more only in time for this window, or ahead when none is held
	// (slots held for this window are used first).
	target := rl.Window(now.Add(r.acquireTook + rateMargin))
	if r.tokenWindow.Equal(win) && r.tokens < want && (r.tokens == 0 || target.Equal(win)) {
		began := time.Now()
		qctx, cancel := context.WithTimeout(ctx, r.w.cfg.QueryTimeout)
		got, acquired, next, err := r.w.client.AcquireStartsFor(qctx, r.typ, rl, target, want-r.tokens, r.w.by)
		cancel()
		r.acquireTook = time.Since(began)
		switch {
		case err != nil:
			r.w.log.Warn().Err(err).Str("type", r.typ).Msg("taking rate limit slots failed")
			if r.tokens == 0 {
				r.blockedUntil = now.Add(100 * time.Millisecond)
			}
		case acquired.After(win):
			r.tokens, r.tokenWindow = got, acquired
		default:
			r.tokens += got
		}
		now = r.w.cfg.Now()
		win = rl.Window(now)
		if err == nil && r.tokens == 0 {
			// Look again in time to take the next window's slots ahead: a
			// due query and a round before it begins.
			r.blockedUntil = next.Add(-min(r.dueTook+r.acquireTook, rl.Per))
			if !r.blockedUntil.After(now) {
				r.blockedUntil = next
			}
		}
	}
	if r.tokenWindow.After(win) && r.tokens > 0 {
		// Taken ahead: wait here, due jobs in hand, so that the claims go
		// out as the window begins rather than a due query later.
		if !r.w.sleep(ctx, r.tokenWindow.Sub(now)) {
			return 0
		}
		now = r.w.cfg.Now()
		win = rl.Window(now)
	}
	switch {
	case r.tokenWindow.After(win):
		return 0
	case r.tokenWindow.Before(win): // the window ended during the round
		r.tokens = 0
		return 0
	case r.tokens == 0:
		return 0
	}
	// A claim's claimed_at must fall in its slot's window.
	if end := win.Add(rl.Per); end.Sub(now) < rateMargin {
		r.tokens, r.blockedUntil = 0, end
		return 0
	}
	n := min(want, r.tokens)
	r.tokens -= n
	return n
}

// inWindow reports whether the start slots held are for the current window
// and it has more than rateMargin left; otherwise it drops them and waits
// for the next window.
func (r *runner) inWindow(rl protocol.RateLimit) bool {
	now := r.w.cfg.Now()
	end := r.tokenWindow.Add(rl.Per)
	if rl.Window(now).Equal(r.tokenWindow) && end.Sub(now) >= rateMargin {
		return true
	}
	r.tokens = 0
	if rl.Window(now).Equal(r.tokenWindow) {
		r.blockedUntil = end
	}
	return false
}

// runSlotPoll is how often a runner whose type's fleet-wide run slots are
// all held looks again: nothing announces a freed slot.
const runSlotPoll = 250 * time.Millisecond

// takeRunSlots takes up to want of the type's k fleet-wide run slots.
// When it gets none it sets blockedUntil for a short wait.
func (r *runner) takeRunSlots(ctx context.Context, k, want int) []*protocol.RunSlot {
	qctx, cancel := context.WithTimeout(ctx, r.w.cfg.QueryTimeout)
	slots, err := r.w.client.AcquireRunSlots(qctx, r.typ, k, want, r.w.by, r.w.cfg.LeaseDuration)
	cancel()
	if err != nil {
		r.w.log.Warn().Err(err).Str("type", r.typ).Msg("taking run slots failed")
	}
	if len(slots) == 0 {
		r.blockedUntil = time.Now().Add(runSlotPoll)
	}
	return slots
}

// replaceRunSlot takes another run slot for a running job whose slot
// another worker took (its lease ran out while this worker could not
// renew it): the fleet's limit holds as long as it gets one. Without a
// free one the handler is cancelled and the job goes back to the queue.
// Called with rj.mu held.
func (r *runner) replaceRunSlot(ctx context.Context, rj *runningJob, lost error) {
	log := r.w.log.With().Str("job", rj.item.ID).Str("type", r.typ).Logger()
	k := r.w.cfg.FleetConcurrency[r.typ]
	slots, err := r.w.client.AcquireRunSlots(ctx, r.typ, k, 1, r.w.by, r.w.cfg.LeaseDuration)
	if err != nil {
		// Not known that none is free: the next beat finds the loss again.
		log.Warn().AnErr("lost", lost).Err(err).Msg("the job's run slot was taken by another worker, and taking another failed; trying again at the next beat")
		return
	}
	if len(slots) == 1 {
		rj.slot = slots[0]
		log.Warn().AnErr("lost", lost).Str("slot", rj.slot.ID).Msg("the job's run slot was taken by another worker; it runs on in another that was free")
		return
	}
	log.Warn().AnErr("lost", lost).Msg("the job's run slot was taken by another worker and none is free: cancelling the handler and returning the job to the queue")
	rj.slot = nil // another's now: neither renewed nor released
	rj.cancel(errRunSlotLost)
}

// releaseRunSlots gives back run slots no job uses (any left are logged:
// their leases run out).
func (r *runner) releaseRunSlots(slots []*protocol.RunSlot) {
	if len(slots) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	if err := r.w.client.ReleaseRunSlots(ctx, slots); err != nil {
		r.w.log.Warn().Err(err).Str("type", r.typ).Msg("releasing run slots failed; their leases will run out")
	}
}

// claimReleased claims at once the jobs this worker just released (their
// dependencies finished) that a runner of its has free slots for, with
// the documents the release stored: the changes feed, a due-view query
// and a read of the picked documents would otherwise stand between a
// dependency ending and its dependent starting (about half of that time
// on a single node, the bench's workflows section). Only a runner that
// left no due work behind takes them, so that they never go before due
// jobs of a higher priority; the others, and jobs not due yet, are left
// to the feed.
func (w *Worker) claimReleased(ctx context.Context, items []*protocol.WorkItem) {
	if len(items) == 0 {
		return
	}
	now := w.cfg.Now()
	for _, r := range w.runners {
		var mine []*protocol.WorkItem
		for _, it := range items {
			if it.Worker == r.typ && !it.DueAt().After(now) {
				mine = append(mine, it)
			}
		}
		if len(mine) > 0 {
			r.claimReleased(ctx, mine)
		}
	}
}

func (r *runner) claimReleased(ctx context.Context, items []*protocol.WorkItem) {
	_, limited := r.w.cfg.RateLimits[r.typ]
	_, counted := r.w.cfg.FleetConcurrency[r.typ]
	if limited || counted || r.paused.Load() || r.behind.Load() || r.w.stopping() {
		return // claims that take slots or windows go through a round
	}
	// The slots are taken before the claims, never waited for: this runs
	// on a finishing job's goroutine, which holds a finishing token that
	// the jobs in those slots may need to free them.
	n := 0
take:
	for n < min(len(items), r.w.cfg.ClaimBatch) {
		select {
		case r.slots <- struct{}{}:
			n++
		default:
			break take
		}
	}
	if n == 0 {
		return
	}
	now := time.Now()
	for _, it := range items[:n] {
		r.noteClaim(it.ID, it.Rev, now)
	}
	results, _ := r.w.client.ClaimManyBefore(ctx, items[:n], r.w.by, r.w.cfg.LeaseDuration, time.Time{})
	for i, res := range results {
		if res.Err != nil && !errors.Is(res.Err, protocol.ErrClaimConflict) {
			// Perhaps never stored: the job may still be due at the
			// revision read, and the runner must not skip it there.
			r.forgetClaim(items[i].ID)
		}
	}
	unused := n
	r.tallyClaims(results, func(item *protocol.WorkItem) {
		unused--
		r.launch(item, nil)
	})
	for range unused {
		<-r.slots
	}
	if unused > 0 {
		r.nudge() // slots free again: a round may fill them
	}
}

// tallyClaims counts a claim request's results: won calls won for each
// claim won; the claims lost to others are counted (returned) and those
// that were stored but will not run conceded.
func (r *runner) tallyClaims(results []protocol.ClaimResult, won func(*protocol.WorkItem)) (conflicts int) {
	var unrun []*protocol.UnrunClaim
	for _, res := range results {
		switch {
		case res.Err == nil:
			r.w.stats.claimed.Add(1)
			won(res.Item)
		case errors.Is(res.Err, protocol.ErrClaimConflict):
			conflicts++
			if res.Unrun != nil {
				unrun = append(unrun, res.Unrun)
			}
		default:
			r.w.log.Warn().Err(res.Err).Str("type", r.typ).Msg("claim failed")
		}
	}
	r.w.concedeLater(unrun)
	r.w.stats.conflicts.Add(int64(conflicts))
	r.w.cfg.Metrics.claimsLostBy(r.typ, LostConflict, conflicts)
	return conflicts
}
