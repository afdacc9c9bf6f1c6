package localserver

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Partition cuts node i off from the other nodes of the cluster while it keeps answering HTTP:
// every packet from or to its own loopback address is dropped, except those of its HTTP port.
// While any node is cut off, the loopback device has an htb root qdisc (see addDropClass).
// Its cluster traffic (Erlang distribution, in and out, and epmd lookups of it) uses that
// address only, so it cannot reach the others nor they it; each side sees the other down
// after the net tick time (about 8 s). Clients still reach it: the minority side of a
// partition. It uses tc on the loopback device, which needs CAP_NET_ADMIN (root); Heal undoes
// it, and Stop heals every node it cut off.
func (c *CouchDB) Partition(ctx context.Context, i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opts.Nodes < 2 || i < 1 || i > len(c.nodes) {
		return fmt.Errorf("partition: no node %d in a cluster of %d", i, len(c.nodes))
	}
	n := c.nodes[i-1]
	if c.partitioned == nil {
		c.partitioned = map[int]bool{}
	}
	if c.partitioned[i] {
		return nil
	}
	if len(c.partitioned) == 0 {
		if err := addDropClass(ctx); err != nil {
			return err
		}
	}
	port := strconv.Itoa(n.httpPort)
	pass, drop := partitionPrios(i)
	rules := [][]string{
		{pass, "match", "ip", "dst", n.ip + "/32", "match", "ip", "dport", port, "0xffff", "classid", "1:1"},
		{pass, "match", "ip", "src", n.ip + "/32", "match", "ip", "sport", port, "0xffff", "classid", "1:1"},
		{drop, "match", "ip", "dst", n.ip + "/32", "classid", "1:2"},
		{drop, "match", "ip", "src", n.ip + "/32", "classid", "1:2"},
	}
	for _, r := range rules {
		args := append([]string{"filter", "add", "dev", "lo", "parent", "1:", "prio", r[0], "protocol", "ip", "u32"}, r[1:]...)
		if out, err := exec.CommandContext(ctx, "tc", args...).CombinedOutput(); err != nil {
			_ = healFilters(i)
			if len(c.partitioned) == 0 {
				_ = exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run()
			}
			return fmt.Errorf("partition: tc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	c.partitioned[i] = true
	c.logger.Debug().Int("node", i).Str("ip", n.ip).Msg("CouchDB node cut off from the cluster")
	return nil
}

// Heal ends node i's partition.
func (c *CouchDB) Heal(ctx context.Context, i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.healLocked(i)
}

func (c *CouchDB) healLocked(i int) error {
	if !c.partitioned[i] {
		return nil
	}
	delete(c.partitioned, i)
	if len(c.partitioned) == 0 {
		// Removing the root qdisc removes every filter with it.
		if out, err := exec.Command("tc", "qdisc", "del", "dev", "lo", "root").CombinedOutput(); err != nil {
			return fmt.Errorf("heal: tc qdisc del dev lo root: %v: %s", err, strings.TrimSpace(string(out)))
		}
	} else if err := healFilters(i); err != nil {
		return err
	}
	c.logger.Debug().Int("node", i).Msg("CouchDB node partition healed")
	return nil
}

// addDropClass installs on the loopback device what partitions use: an htb root whose default
// class passes everything, and a class whose queue holds nothing (pfifo limit 0), so that
// what is classified into it is dropped. (tc's drop action would be simpler, but its module
// is often missing where tc itself works.)
func addDropClass(ctx context.Context) error {
	for _, args := range [][]string{
		{"qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1"},
		{"class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate", "40gbit", "quantum", "200000"},
		{"class", "add", "dev", "lo", "parent", "1:", "classid", "1:2", "htb", "rate", "40gbit", "quantum", "200000"},
		{"qdisc", "add", "dev", "lo", "parent", "1:2", "handle", "2:", "pfifo", "limit", "0"},
	} {
		if out, err := exec.CommandContext(ctx, "tc", args...).CombinedOutput(); err != nil {
			if args[1] != "add" || args[0] != "qdisc" || args[4] != "root" {
				_ = exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run()
			}
			return fmt.Errorf("partition: tc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// healFilters removes node i's partition filters.
func healFilters(i int) error {
	pass, drop := partitionPrios(i)
	var errs []error
	for _, prio := range []string{pass, drop} {
		if out, err := exec.Command("tc", "filter", "del", "dev", "lo", "parent", "1:", "prio", prio).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("tc filter del prio %s: %v: %s", prio, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// partitionPrios are the tc filter priorities of node i's partition: the passes of its HTTP
// port first, then the drops. Chosen high, out of the way of anything else on the device.
func partitionPrios(i int) (pass, drop string) {
	return strconv.Itoa(49000 + 2*i), strconv.Itoa(49001 + 2*i)
}
