//go:build linux

package wlog

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestJournalsData(t *testing.T) {
	const info = `22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard,errors=remount-ro
28 27 254:16 / /data rw,relatime - ext4 /dev/vdb rw,data=journal
29 27 254:0 /srv /mnt/srv rw,relatime - ext4 /dev/vda rw,discard
30 27 254:32 / /odd rw
`
	for _, tc := range []struct {
		major, minor uint32
		want         bool
	}{
		{254, 0, false}, // two mounts of the device, neither journals data
		{254, 16, true}, // data=journal
		{254, 32, true}, // malformed line: nothing is known
		{254, 48, true}, // not listed
		{0, 21, false},  // proc
	} {
		if got := journalsData([]byte(info), tc.major, tc.minor); got != tc.want {
			t.Errorf("journalsData(%d:%d) = %v, want %v", tc.major, tc.minor, got, tc.want)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"6.18.44-fc-v669", true},
		{"5.2.0", true},
		{"5.10.0-28-amd64", true},
		{"5.1.21", false},
		{"4.19.0", false},
		{"garbage", false},
	} {
		if got := kernelAtLeast(tc.release, 5, 2); got != tc.want {
			t.Errorf("kernelAtLeast(%q) = %v, want %v", tc.release, got, tc.want)
		}
	}
}

// TestFlushDomainOfThisMachine: the answer for a temporary directory matches its filesystem
// (shared only on ext4) and names its device.
func TestFlushDomainOfThisMachine(t *testing.T) {
	dir := t.TempDir()
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	dev, ok := OSFS().(FlushSharer).FlushDomain(dir)
	if sfs.Type != ext4Magic && ok {
		t.Fatalf("filesystem type %#x: FlushDomain says the files may share a flush", sfs.Type)
	}
	if ok && dev != uint64(st.Dev) {
		t.Fatalf("device %d, want %d", dev, st.Dev)
	}
	t.Logf("filesystem %#x: share %v", sfs.Type, ok)
}
