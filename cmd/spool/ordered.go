package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/cli"
)

// writeOrdered prints what group describe shows of an ordered group besides its mode: strategy,
// generation, the assignment (member to partitions, every broker instance's) and per partition
// its owner and lag. A shared group prints nothing.
func writeOrdered(e *cliEnv, g *admin.Group) error {
	if g.Mode != "ordered" {
		return nil
	}
	f := &cli.Fields{}
	f.Add("Strategy", g.Strategy)
	f.Add("Generation", i64(g.Generation))
	f.Add("Per partition", strconv.Itoa(g.MaxInFlightPerPartition)+" unsettled at most")
	fmt.Fprintln(e.stdout, "\nOrdered group:")
	if err := f.Write(e.stdout); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "\nAssignment (every broker instance):")
	tab := cli.NewTable("MEMBER", "PARTITIONS")
	owner := map[int32]string{}
	for _, m := range slices.Sorted(maps.Keys(g.Assignment)) {
		ps := make([]string, len(g.Assignment[m]))
		for i, p := range g.Assignment[m] {
			ps[i] = strconv.Itoa(int(p))
			owner[p] = m
		}
		tab.Row(m, cmpStr(strings.Join(ps, ","), "-"))
	}
	if err := tab.Write(e.stdout); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "\nPartition owners:")
	tab = cli.NewTable("PARTITION", "OWNER", "LAG")
	for _, p := range g.Partitions {
		tab.Row(strconv.Itoa(int(p.Partition)), cmpStr(owner[p.Partition], "-"), i64(p.HighWater-p.Cursor))
	}
	return tab.Write(e.stdout)
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
