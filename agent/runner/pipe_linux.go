package runner

import (
	"os"
	"syscall"
)

// runnerPipe makes a pipe between the worker and a runner: the end at
// index polled (0 the read end, 1 the write end; -1 none) is the worker's
// and waits in its poller, the other is the runner's and is left blocking,
// as a process's standard descriptors are, and out of the poller.
// os.Pipe puts both ends in the poller and makes both non-blocking; the
// runner's end is then made blocking again when it is passed and taken out
// of the poller when the worker closes its copy: six system calls a pipe,
// five pipes a cold start, for nothing.
func runnerPipe(polled int) (r, w *os.File, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	if polled >= 0 {
		if err := syscall.SetNonblock(p[polled], true); err != nil {
			syscall.Close(p[0])
			syscall.Close(p[1])
			return nil, nil, os.NewSyscallError("fcntl", err)
		}
	}
	// os.NewFile puts a non-blocking descriptor in the poller, and leaves
	// a blocking one out.
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}
