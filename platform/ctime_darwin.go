package platform

import (
	"io/fs"
	"syscall"
)

// changeTime is fi's status change time in nanoseconds, 0 where unknown
// (as ctime_linux.go's).
func changeTime(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ctimespec.Nano()
	}
	return 0
}
