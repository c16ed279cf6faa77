//go:build !linux

package wlog_test

import "testing"

// dropCache is a no-op where posix_fadvise is not available: "cold" benchmarks are then warm.
func dropCache(testing.TB, string) {}
