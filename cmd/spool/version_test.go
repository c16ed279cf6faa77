package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionOf: a stamped version wins, then the module version of go install module@version,
// then the VCS revision go build records, then "dev".
func TestVersionOf(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}
	}
	for _, c := range []struct {
		stamped string
		bi      *debug.BuildInfo
		ok      bool
		want    string
	}{
		{"v1.2.0", vcs("0123456789abcdef", "false"), true, "v1.2.0"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "v1.3.0"}}, true, "v1.3.0"},
		{"", vcs("0123456789abcdef0123", "false"), true, "devel-0123456789ab"},
		{"", vcs("0123456789abcdef0123", "true"), true, "devel-0123456789ab-dirty"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true, "dev"},
		{"", nil, false, "dev"},
	} {
		if got := versionOf(c.stamped, c.bi, c.ok); got != c.want {
			t.Errorf("versionOf(%q, %+v) = %q, want %q", c.stamped, c.bi, got, c.want)
		}
	}
}

// TestComplete: candidates come from the commands and from the usage texts of -h.
func TestComplete(t *testing.T) {
	help := func(args []string) string {
		switch args[0] {
		case "topic":
			if len(args) == 2 {
				return "Usage: spool topic <command>\n\nCommands:\n  create     create a topic\n  list       list\n\nRun ...\n"
			}
			return "Usage: spool topic create\n\nFlags:\n  -partitions int\n    \tpartitions\n  -json\n    \tprint JSON\n"
		}
		return ""
	}
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{"to"}, "token topic"},
		{[]string{"topic", ""}, "create list"},
		{[]string{"topic", "create", "x", "--p"}, "--partitions"},
		{[]string{"topic", "create", "-"}, "--json --partitions"},
		{[]string{"completion", "f"}, "fish"},
		{[]string{"completion", "bash", ""}, ""},
	} {
		if got := strings.Join(complete(c.words, help), " "); got != c.want {
			t.Errorf("complete(%q) = %q, want %q", c.words, got, c.want)
		}
	}
}
