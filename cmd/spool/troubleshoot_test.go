package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/storage/wal"
)

// TestTroubleshootingTable checks the README's troubleshooting table (seed 004's four questions):
// every row names a spool command that exists, API routes the admin API serves and metrics
// internal/metrics defines, so the table cannot name what is not built.
func TestTroubleshootingTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "### Troubleshooting (seed 004)")
	if !ok {
		t.Fatal("README has no Troubleshooting (seed 004) section")
	}
	var rows []string
	for line := range strings.Lines(section) {
		if strings.HasPrefix(line, "| Why ") {
			rows = append(rows, line)
		}
		if strings.HasPrefix(line, "#") {
			break
		}
	}
	if len(rows) != 4 {
		t.Fatalf("want seed 004's 4 questions, got %d rows", len(rows))
	}

	eng, err := wal.Open(t.TempDir(), wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	br, err := broker.New(broker.Config{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	h, err := admin.New(admin.Config{Broker: br})
	if err != nil {
		t.Fatal(err)
	}
	routes := h.Routes()
	var metricSrc strings.Builder
	files, _ := filepath.Glob("../../internal/metrics/*.go")
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			metricSrc.Write(b)
		}
	}

	cmdRe := regexp.MustCompile("`spool ([a-z]+)[^`]*`")
	routeRe := regexp.MustCompile("`(GET|POST|PUT|DELETE) (/[^`]+)`")
	metricRe := regexp.MustCompile("`((?:spool_|consumer_)[a-z_]+)[{`]")
	for _, row := range rows {
		cols := strings.Split(row, "|")
		if len(cols) < 6 {
			t.Fatalf("row with %d columns: %s", len(cols), row)
		}
		cli, api, metric := cols[2], cols[3], cols[4]
		cmds := cmdRe.FindAllStringSubmatch(cli, -1)
		rs := routeRe.FindAllStringSubmatch(api, -1)
		ms := metricRe.FindAllStringSubmatch(metric, -1)
		if len(cmds) == 0 || len(rs) == 0 || len(ms) == 0 {
			t.Errorf("row without a command, a route or a metric: %s", row)
		}
		for _, c := range cmds {
			if !slices.ContainsFunc(commands, func(k command) bool { return k.name == c[1] }) {
				t.Errorf("no command spool %s (row %.40s)", c[1], cols[1])
			}
		}
		for _, r := range rs {
			if !slices.Contains(routes, r[1]+" "+r[2]) {
				t.Errorf("no route %s %s (row %.40s)", r[1], r[2], cols[1])
			}
		}
		for _, m := range ms {
			if !strings.Contains(metricSrc.String(), `"`+m[1]+`"`) {
				t.Errorf("no metric %s in internal/metrics (row %.40s)", m[1], cols[1])
			}
		}
	}
}
