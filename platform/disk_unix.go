//go:build unix

package platform

import "golang.org/x/sys/unix"

// FreeBytes is how much of the file system holding path an unprivileged
// process may still write (statfs's available blocks, not the free ones
// the kernel keeps for root).
func FreeBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// DiskBytes is the size of the file system holding path.
func DiskBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks) * int64(st.Bsize), nil
}
