package runner

// What a node wrote just before its runner died. The embedded runtime
// turns the node's stdout and stderr into log events with a thread of its
// own (the log pump); a hard exit (a segfault, os._exit, the OOM killer)
// ends that thread with the process, and whatever the node wrote that the
// pump had not read yet (the last lines, a segfault's faulthandler stack)
// would go with it. So the worker makes those pipes itself and keeps a
// copy of their read ends: once the runner's output ended without an
// answer, it reads what is left in them and sends it as the call's log.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// outputFlag hands the runtime the node's pipes (worker_main.py's
// OUTPUT_FLAG): `RUNTIME --fluksio-output FD ...`, the stdout pipe's read
// and write ends at FD and FD+1, the stderr pipe's at FD+2 and FD+3.
const outputFlag = "--fluksio-output"

// remainsMax bounds what is read after a death: a grandchild that keeps
// writing must not keep the call from ending.
const remainsMax = 1 << 20

// remainsTail is how many of the last lines of each stream are sent (the
// runtime's LOG_TAIL): the end of what a node wrote is what explains its
// death.
const remainsTail = 100

// nodeLineMax is the runtime's LOG_LINE_MAX: a longer line is cut.
const nodeLineMax = 8192

// lineEnd ends a line as the runtime's LINE_END does: progress bars
// redraw with \r.
var lineEnd = regexp.MustCompile("\r\n|\n|\r")

// nodePipes is a runner's pipes for its node's stdout and stderr.
type nodePipes struct {
	stdout, stderr [2]*os.File // read end, write end
}

func newNodePipes() (*nodePipes, error) {
	np := &nodePipes{}
	for _, p := range []*[2]*os.File{&np.stdout, &np.stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			np.close()
			return nil, fmt.Errorf("creating the node's output pipes: %w", err)
		}
		*p = [2]*os.File{r, w}
	}
	return np, nil
}

// pass adds the pipes to cmd's extra files and the flag that names them
// to its arguments (right after the runtime's path).
func (np *nodePipes) pass(args []string, extra []*os.File) ([]string, []*os.File) {
	first := 3 + len(extra)
	args = append([]string{args[0], outputFlag, strconv.Itoa(first)}, args[1:]...)
	return args, append(extra, np.stdout[0], np.stdout[1], np.stderr[0], np.stderr[1])
}

// started closes the worker's copies of the write ends: only the node's
// processes write there.
func (np *nodePipes) started() {
	for _, p := range []*[2]*os.File{&np.stdout, &np.stderr} {
		if p[1] != nil {
			p[1].Close()
			p[1] = nil
		}
	}
}

func (np *nodePipes) close() {
	if np == nil {
		return
	}
	np.started()
	for _, p := range []*[2]*os.File{&np.stdout, &np.stderr} {
		if p[0] != nil {
			p[0].Close()
			p[0] = nil
		}
	}
}

// logEvent is a runtime's log event.
type logEvent struct {
	CallID string `json:"call_id"`
	Event  string `json:"event"`
	Stream string `json:"stream"`
	Line   string `json:"line"`
}

// sendRemains sends what is left in the pipes as the call's log events,
// stdout then stderr, the last remainsTail lines of each.
func (np *nodePipes) sendRemains(p *Process, callID string, send func([]byte)) {
	if np == nil {
		return
	}
	for _, s := range []struct {
		name string
		r    *os.File
	}{{"stdout", np.stdout[0]}, {"stderr", np.stderr[0]}} {
		lines, dropped := tailLines(readWaiting(s.r, remainsMax), remainsTail)
		if dropped > 0 {
			lines = append([]string{fmt.Sprintf("… %d lines dropped here (of what the node wrote just before its runner died, the last %d lines are sent)", dropped, remainsTail)}, lines...)
		}
		for _, line := range lines {
			p.log.Info("node output left when its runner died", "stream", s.name, "line", line)
			frame, err := json.Marshal(logEvent{CallID: callID, Event: "log", Stream: s.name, Line: line})
			if err == nil {
				send(frame)
			}
		}
	}
}

// readWaiting reads what r holds now, up to max bytes, without waiting
// for more: a grandchild may hold the pipe open for ever.
func readWaiting(r *os.File, max int) []byte {
	rc, err := r.SyscallConn()
	if err != nil {
		return nil
	}
	var out []byte
	buf := make([]byte, 64<<10)
	for len(out) < max {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), buf)
			return true // never wait for more
		})
		if errors.Is(rerr, syscall.EINTR) {
			continue
		}
		if err != nil || rerr != nil || n <= 0 {
			return out
		}
		out = append(out, buf[:n]...)
	}
	return out
}

// tailLines splits data into lines as the runtime does (blank ones left
// out, long ones cut) and keeps the last n; dropped counts the others.
func tailLines(data []byte, n int) (lines []string, dropped int) {
	for _, raw := range lineEnd.Split(string(data), -1) {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		if len(raw) > nodeLineMax {
			raw = raw[:nodeLineMax] + fmt.Sprintf(" … [line cut at %d bytes]", nodeLineMax)
		}
		lines = append(lines, raw)
	}
	if len(lines) > n {
		dropped = len(lines) - n
		lines = lines[dropped:]
	}
	return lines, dropped
}
