package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is the release version, stamped at build time:
//
//	go build -ldflags "-X main.version=v1.2.0" -o spool ./cmd/spool
//
// Empty (a plain go build or go install) falls back to what the Go toolchain recorded.
var version string

// buildVersion returns the version the binary reports (spool --version, the startup log, the
// protocol's HelloOK).
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	return versionOf(version, bi, ok)
}

// versionOf returns stamped when set; else the module version of a go install
// module@version; else "devel" with the VCS revision (12 digits, "-dirty" for uncommitted
// changes) that go build records in a git work tree; else "dev".
func versionOf(stamped string, bi *debug.BuildInfo, ok bool) string {
	if stamped != "" {
		return stamped
	}
	if !ok || bi == nil {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "dev"
	}
	rev = rev[:min(len(rev), 12)]
	if modified == "true" {
		rev += "-dirty"
	}
	return "devel-" + rev
}

// versionLine is what spool --version prints.
func versionLine() string {
	return fmt.Sprintf("spool %s (%s, %s/%s)", buildVersion(), strings.TrimPrefix(runtime.Version(), "go"), runtime.GOOS, runtime.GOARCH)
}
