//go:build linux || darwin || freebsd

package metrics

import "golang.org/x/sys/unix"

// diskSpace returns the bytes available to unprivileged users and the size of the file system
// holding dir.
func diskSpace(dir string) (avail, size uint64, ok bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, false
	}
	bs := uint64(st.Bsize)
	return uint64(st.Bavail) * bs, uint64(st.Blocks) * bs, true
}
