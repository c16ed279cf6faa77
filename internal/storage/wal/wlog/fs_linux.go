//go:build linux

package wlog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// syscall runs call on f's descriptor, again as long as it fails with EINTR, and wraps its error
// in an fs.PathError naming op and the file. It goes through SyscallConn so that a concurrent
// Close cannot reuse the descriptor under it.
func (f osFile) syscall(op string, call func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = call(int(fd)); serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &fs.PathError{Op: op, Path: f.Name(), Err: serr}
	}
	return nil
}

// Datasync calls fdatasync(2).
func (f osFile) Datasync() error { return f.syscall("fdatasync", unix.Fdatasync) }

// SyncRange calls sync_file_range(2) with WAIT_BEFORE, WRITE and WAIT_AFTER.
func (f osFile) SyncRange(off, n int64) error {
	return f.syscall("sync_file_range", func(fd int) error {
		return unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	})
}

// StartWriteback calls sync_file_range(2) with WRITE only.
func (f osFile) StartWriteback(off, n int64) error {
	return f.syscall("sync_file_range", func(fd int) error {
		return unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}

// Allocate calls fallocate(2) mode 0, falling back to extending the file when the filesystem does
// not support it.
func (f osFile) Allocate(off, size int64) error {
	err := f.syscall("fallocate", func(fd int) error { return unix.Fallocate(fd, 0, off, size) })
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return allocateByTruncate(f.File, off, size)
	}
	return err
}

// ext4Magic is the statfs f_type of ext2/3/4, the one filesystem where files may share a cache
// flush (FlushSharer): it overwrites written blocks in place. xfs does too, except for blocks
// shared by reflink or dedupe (the mkfs default since 2019), where an overwrite is copy on write
// and needs a log force that a write-back does not do: it is left out.
const ext4Magic = 0xEF53

// fsJournalDataFlag is FS_JOURNAL_DATA_FL (chattr +j): the file's data goes through the journal.
const fsJournalDataFlag = 0x00004000

// FlushDomain implements FlushSharer: dir's files may share a cache flush when dir is on ext4,
// mounted without data=journal and not itself marked +j (its new files would inherit it: their
// data would go through the journal, and a write-back would leave it in a transaction the
// anchor's fdatasync need not commit), and the kernel is at least 5.2 (sync_file_range waits for
// the write-back as WB_SYNC_ALL since then). Every log calls it at Open: the kernel version and
// each device's mount options are read once per process (a remount is not seen).
func (osFS) FlushDomain(dir string) (uint64, bool) {
	if !kernelSharesFlush() {
		return 0, false
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil || sfs.Type != ext4Magic {
		return 0, false
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, false
	}
	if deviceJournalsData(uint64(st.Dev)) {
		return 0, false
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&fsJournalDataFlag != 0 {
		return 0, false
	}
	return uint64(st.Dev), true
}

// kernelSharesFlush reports whether the running kernel is at least 5.2 (FlushDomain).
var kernelSharesFlush = sync.OnceValue(func() bool {
	var uts unix.Utsname
	return unix.Uname(&uts) == nil && kernelAtLeast(unix.ByteSliceToString(uts.Release[:]), 5, 2)
})

// journaledDevices caches deviceJournalsData per device.
var journaledDevices sync.Map // uint64 -> bool

// deviceJournalsData reports whether a mount of dev has data=journal (journalsData over
// /proc/self/mountinfo, read once per device); true when it cannot be read.
func deviceJournalsData(dev uint64) bool {
	if v, ok := journaledDevices.Load(dev); ok {
		return v.(bool)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	j := err != nil || journalsData(mountinfo, unix.Major(dev), unix.Minor(dev))
	journaledDevices.Store(dev, j)
	return j
}

// kernelAtLeast reports whether a kernel release string ("6.1.0-18-amd64") is at least
// major.minor; false when it cannot be parsed.
func kernelAtLeast(release string, major, minor int) bool {
	var maj, mnr int
	if _, err := fmt.Sscanf(release, "%d.%d", &maj, &mnr); err != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// journalsData reports whether a mount of the device major:minor in mountinfo (the format of
// /proc/self/mountinfo) has data=journal among its superblock options; true when the device is
// not listed (nothing is known).
func journalsData(mountinfo []byte, major, minor uint32) bool {
	dev := fmt.Sprintf("%d:%d", major, minor)
	found := false
	for line := range strings.SplitSeq(string(mountinfo), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[2] != dev {
			continue
		}
		// Optional fields end at "-"; then fstype, source, superblock options.
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+3 >= len(fields) {
			return true
		}
		found = true
		if slices.Contains(strings.Split(fields[sep+3], ","), "data=journal") {
			return true
		}
	}
	return !found
}
