package platform

import (
	"io/fs"
	"syscall"
)

// changeTime is fi's status change time in nanoseconds, 0 where unknown:
// the kernel sets it at every write and chmod, and no process can set it
// back as one can the modification time.
func changeTime(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ctim.Nano()
	}
	return 0
}
