package protocol

import (
	"context"
	"encoding/json"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// The slot documents of rate limits (ratelimit:TYPE:k) and fleet-wide
// concurrency limits (runslot:TYPE:k) are taken over and over by writing
// over the revision read. On a cluster such a document can hold several
// leaves: two first creations through different nodes, or a write answered
// 202, leave a stored conflict. Each copy takes one child of a revision,
// but writes over two different leaves are both taken by every copy, and
// both committed: two holders each counted the same slot (the cluster tier
// saw 10 starts in a window of a 7/s limit). So on a cluster a committed
// slot write is confirmed, as a claim is, by reading the slot's leaves from
// a majority: it stands only when no other leaf holds the slot too.
//
// Of two holders who took a slot over different leaves, the one who
// confirms second reads the other's leaf (each write reached a majority
// before its writer's read, and two majorities share a copy) and gives way;
// when both read both, neither counts: a slot lost, never one taken twice.

// committedSlots returns the slot writes of a _bulk_docs answer that a
// majority of the copies took (id -> the revision written). A write that
// reached fewer is dropped at once: left alone it becomes a second leaf of
// the slot once the copies sync, and then two holders can take the slot
// over different leaves — of whom confirmSlots lets at most one, maybe
// neither, keep it.
func (c *Client) committedSlots(ctx context.Context, res []kivik.BulkResult, trace *commitTrace) map[string]string {
	committed := map[string]string{}
	for _, r := range res {
		switch {
		case r.Error != nil:
		case trace.uncommitted(r.ID, r.Rev):
			c.dropLeaf(ctx, r.ID, Leaf{Rev: r.Rev})
		default:
			committed[r.ID] = r.Rev
		}
	}
	return committed
}

// confirmSlots keeps the slot writes in taken (id -> the revision written)
// that stand, reading every slot's leaves in one request. held reports
// whether another leaf's document holds the slot. A holder that gives way
// withdraws its own leaf (there is another), and one that stands withdraws
// the other, stale leaves, so that the conflict does not outlive it; both
// best effort. Off a cluster every committed write stands.
//
// A slot blocked by another holder's leaf is read once more before giving
// way: most such leaves are writes a minority of the copies took (two
// takers of one revision through different nodes: one is answered 201,
// the other 202), which their writers withdraw at once (committedSlots),
// and giving way to one loses the slot for both. The second read is as
// safe as the first: a holder whose leaf is still there may stand, so we
// give way; one that withdrew its leaf no longer counts the slot.
func (c *Client) confirmSlots(ctx context.Context, taken map[string]string, held func(doc json.RawMessage) bool) map[string]bool {
	stands := make(map[string]bool, len(taken))
	if !c.confirming() {
		for id := range taken {
			stands[id] = true
		}
		return stands
	}
	pending := taken
	for read := 1; len(pending) > 0; read++ {
		ids := make([]string, 0, len(pending))
		for id := range pending {
			ids = append(ids, id)
		}
		began := time.Now()
		leaves, err := c.leavesMany(ctx, ids)
		if err != nil {
			c.log.Warn().Err(err).Int("slots", len(ids)).Msg("could not confirm the slots taken; counting none of them")
			c.withdrawSlots(ctx, pending)
			return stands
		}
		blocked := map[string]string{}
		for id, rev := range pending {
			mine, others, other := judgeSlot(leaves[id], rev, held)
			switch {
			case mine == nil:
				// Overwritten already (another holder, a window later): not ours.
			case other && read < slotReads:
				blocked[id] = rev
			case other:
				c.log.Debug().Str("slot", id).Str("rev", rev).Msg("slot taken over another leaf that holds it too; giving way")
				c.dropLeaf(ctx, id, *mine)
			default:
				stands[id] = true
				for _, l := range others {
					c.dropLeaf(ctx, id, l)
				}
			}
		}
		if len(blocked) > 0 && !sleepCtx(ctx, min(max(time.Since(began), slotRereadMin), slotRereadMax)) {
			c.withdrawSlots(ctx, blocked)
			return stands
		}
		pending = blocked
	}
	return stands
}

// slotReads is how many times confirmSlots reads a blocked slot's leaves;
// between reads it waits as long as the last read took (a round trip, as
// long as another taker's withdrawal takes), within slotRereadMin and
// slotRereadMax.
const (
	slotReads     = 2
	slotRereadMin = 10 * time.Millisecond
	slotRereadMax = 250 * time.Millisecond
)

// judgeSlot finds, among a slot's leaves, the one our write made (nil when
// it is gone) and the other live leaves, and reports whether one of those
// holds the slot too.
func judgeSlot(leaves []Leaf, rev string, held func(doc json.RawMessage) bool) (mine *Leaf, others []Leaf, other bool) {
	for _, l := range leaves {
		switch {
		case l.Rev == rev:
			mine = &l
		case l.Deleted:
		default:
			others = append(others, l)
			other = other || held(l.Doc)
		}
	}
	return mine, others, other
}

// sleepCtx waits d, or less when ctx ends first (then it returns false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// withdrawTimeout bounds withdrawSlots: the slots' leases or windows end
// anyway, and a server that does not answer must not hold up the round.
const withdrawTimeout = 5 * time.Second

// withdrawSlots drops our leaves of slots we count none of (id -> the revision
// we wrote), best effort, even when ctx has ended: left alone each would
// stay held by us, unused, until its lease or window ran out, and the limit
// would run that many short meanwhile. A tombstone rather than a release:
// written over a leaf that lost to another holder's, a release would make
// a live leaf again, which could win and show the slot free while the
// other holds it.
func (c *Client) withdrawSlots(ctx context.Context, revs map[string]string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	for id, rev := range revs {
		c.dropLeaf(ctx, id, Leaf{Rev: rev})
	}
}

// dropLeaf deletes one leaf of a slot document (w = a majority), best
// effort: a leaf that moved on meanwhile is left alone.
func (c *Client) dropLeaf(ctx context.Context, id string, l Leaf) {
	tomb := map[string]any{"_id": id, "_rev": l.Rev, "_deleted": true}
	if _, err := c.db.Put(ctx, id, tomb, c.claimOpts(false)...); err != nil {
		c.log.Debug().Err(err).Str("slot", id).Str("rev", l.Rev).Msg("could not drop a slot's leaf")
	}
}
