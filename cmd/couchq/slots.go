package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const slotsUsage = `Usage: couchq slots ls SEQ [--limit N] [flags]
       couchq slots reserve SEQ [--ttl D] [--format F] [--start N] [--as HOLDER] [flags]
       couchq slots release SEQ SLOT [--abandon] [--as HOLDER] [flags]

Slot reservations: the next free value of a sequence (a ticket serial, an
invoice number) for jobs and scripts running at once. A slot is taken by
creating the document slot:SEQ:SLOT, so two holders never get the same
one; a reservation holds for its TTL, then the slot can be taken again.

	ls        the sequence's slots: reserved (and until when), expired, used
	          or free, and its last used slot
	reserve   reserves the next free slot (an abandoned or expired one
	          first, else the one after the last used) and prints it
	release   marks a reserved slot used, moving the sequence's last used
	          slot forward (never back); with --abandon frees it instead

	--ttl D        how long the reservation holds (default 1m)
	--format F     how a slot is written, a printf format with one number:
	               "%d" (default), "AAAA-%04d", "seat-%03d"
	--start N      the first number of the sequence (default 1)
	--as HOLDER    who holds the reservation (default cli:$USER); release
	               refuses a slot someone else holds
	--limit N      at most N slots listed (default 1000)
`

func (m *Main) runSlots(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("slots", slotsUsage)
	conn := addConnFlags(fs)
	var (
		ttl     time.Duration
		format  string
		start   int
		holder  string
		limit   int
		abandon bool
	)
	fs.DurationVar(&ttl, "ttl", protocol.SlotTTLDefault, "reservation TTL")
	fs.StringVar(&format, "format", "%d", "slot format")
	fs.IntVar(&start, "start", 1, "first number")
	fs.StringVar(&holder, "as", "", "holder")
	fs.IntVar(&limit, "limit", 1000, "slots listed")
	fs.BoolVar(&abandon, "abandon", false, "free the slot instead of using it")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) < 2 {
		return cli.Usagef("want 'couchq slots ls|reserve|release SEQ ...'")
	}
	sub, seqName := rest[0], rest[1]
	if seqName == "" || strings.ContainsAny(seqName, ":") {
		return cli.Usagef("invalid sequence name %q: non-empty, without ':'", seqName)
	}
	if holder == "" {
		holder = "cli:" + m.Getenv("USER")
	}
	switch sub {
	case "ls", "reserve":
		if len(rest) > 2 {
			return cli.Usagef("unexpected argument %q", rest[2])
		}
	case "release":
		if len(rest) != 3 {
			return cli.Usagef("want 'couchq slots release SEQ SLOT'")
		}
	default:
		return cli.Usagef("unknown subcommand %q: want ls, reserve or release", sub)
	}
	if ttl <= 0 {
		return cli.Usagef("invalid --ttl %s: must be positive", ttl)
	}
	if limit < 1 {
		return cli.Usagef("invalid --limit %d: must be at least 1", limit)
	}
	if strings.Count(format, "%") != 1 || !strings.Contains(format, "d") {
		return cli.Usagef("invalid --format %q: want one number verb, e.g. %%d or AAAA-%%04d", format)
	}
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	switch sub {
	case "reserve":
		r, err := q.Reserve(ctx, protocol.NumberedSequence(seqName, format, start, ttl), holder)
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		if conn.json {
			return cli.WriteJSON(m.Stdout, r)
		}
		_, err = fmt.Fprintln(m.Stdout, r.Slot)
		return err
	case "release":
		r, err := q.GetReservation(ctx, seqName, rest[2])
		if err != nil {
			if errors.Is(err, protocol.ErrNotFound) {
				return fmt.Errorf("slot %s of %s was never reserved", rest[2], seqName)
			}
			return cli.ServerError(conn.URL, err)
		}
		if r.State != protocol.SlotReserved {
			return fmt.Errorf("slot %s of %s is %s, not reserved", r.Slot, seqName, r.State)
		}
		if r.Holder != holder {
			return fmt.Errorf("slot %s of %s is held by %s, not %s (--as)", r.Slot, seqName, r.Holder, holder)
		}
		if r.Expired(m.Now()) {
			log.Warn().Str("slot", r.Slot).Msg("the reservation's TTL ran out; releasing it as nobody took it")
		}
		what := "used"
		if abandon {
			what = "abandoned"
			err = q.AbandonSlot(ctx, r)
		} else {
			err = q.ReleaseSlot(ctx, r)
		}
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		if conn.json {
			return cli.WriteJSON(m.Stdout, r)
		}
		_, err = fmt.Fprintf(m.Stdout, "%s %s\n", what, r.Slot)
		return err
	}
	list, err := q.Reservations(ctx, seqName, limit)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	last, err := q.LastUsed(ctx, seqName)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if conn.json {
		if list == nil {
			list = []protocol.Reservation{}
		}
		return cli.WriteJSON(m.Stdout, map[string]any{"sequence": seqName, "last_used": last, "slots": list})
	}
	now := m.Now()
	if last == "" {
		last = "none"
	}
	fmt.Fprintf(m.Stdout, "sequence %s: last used %s, %d slots\n", seqName, last, len(list))
	if len(list) == 0 {
		return nil
	}
	tw := cli.NewTable(m.Stdout)
	fmt.Fprintln(tw, "SLOT\tSTATE\tHOLDER\tUNTIL")
	for _, r := range list {
		state, until := r.State, "-"
		if r.State == protocol.SlotReserved {
			until = cli.TimeAndAgo(protocol.FromUnix(r.ExpiresAt), now)
			if r.Expired(now) {
				state = "expired"
			}
		}
		holder := r.Holder
		if holder == "" {
			holder = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Slot, state, holder, until)
	}
	return tw.Flush()
}
