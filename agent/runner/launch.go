package runner

// A launch: what starting one runner makes besides its box, owned in one
// place until the runner runs. A runner is started three ways: cold, for
// a call that finds no spare (Process.startCold); ahead of its call, as a
// spare or a zygote (spare.start, zygote.start); or forked from a zygote
// (zygote.fork). Each makes the pipes between the worker and the runner,
// a call directory and, for the embedded runtime, the node's output pipes
// (nodeout.go); each closes the runner's ends once it started, and
// releases all of it where the start fails. The launch does both, so that
// a start that fails anywhere leaves nothing behind: no pipe, no call
// directory.
//
// Its life: made empty (newLaunch); the pipes, the directory and the node's
// pipes added as the start needs them; the runner's ends closed once it
// runs (started; exec does it for a process the worker starts itself); and
// then either handed over (handOver: the call's Process or the spare owns
// what the worker keeps from then on, and closes it at its end) or closed
// (close, which its start defers: everything not handed over is released).
// The box (contain.go), the runner's cookie and cgroup, is not the
// launch's: its start paths keep it as they made it.

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
)

// launch owns what starting one runner made, until it is handed over.
type launch struct {
	cfg *Config
	log *slog.Logger

	// The ends of the runner's stdin, stdout and stderr (stdio): the
	// worker's (stdin's write end, the others' read ends) and the
	// runner's, in that order. The output's are nil where it goes nowhere
	// (a zygote's).
	stdin, stdout, stderr *os.File
	runner                [3]*os.File

	dir   *callDir   // the call directory; nil until made or given
	nodes *nodePipes // the node's output pipes; nil without them

	// mine are the ends the worker keeps, closed by close unless handed
	// over; theirs the ends the runner gets, closed once it started.
	mine   []io.Closer
	theirs []*os.File
	handed bool
}

func newLaunch(cfg *Config, log *slog.Logger) *launch {
	return &launch{cfg: cfg, log: log}
}

// stdio makes the runner's stdin and, with output, its stdout and stderr;
// without, its output goes nowhere.
func (l *launch) stdio(output bool) error {
	w, r, err := l.pipe(1)
	if err != nil {
		return err
	}
	l.stdin, l.runner[0] = w, r
	if !output {
		return nil
	}
	if l.stdout, l.runner[1], err = l.pipe(0); err != nil {
		return err
	}
	l.stderr, l.runner[2], err = l.pipe(0)
	return err
}

// fromRunner makes a pipe the runner writes to and the worker reads: the
// worker's end, then the runner's.
func (l *launch) fromRunner() (mine, theirs *os.File, err error) { return l.pipe(0) }

// pipe makes a pipe between the worker and the runner (runnerPipe); the
// end at index mineAt (0 the read end, 1 the write end) is the worker's.
func (l *launch) pipe(mineAt int) (mine, theirs *os.File, err error) {
	r, w, err := runnerPipe(mineAt)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the runner's pipes: %w", err)
	}
	ends := [2]*os.File{r, w}
	l.track(ends[mineAt], ends[1-mineAt])
	return ends[mineAt], ends[1-mineAt], nil
}

// track makes the launch own a pair made elsewhere (the zygote's control
// socket): the worker's end, then the runner's.
func (l *launch) track(mine io.Closer, theirs *os.File) {
	l.mine = append(l.mine, mine)
	l.theirs = append(l.theirs, theirs)
}

// makeDir makes the runner's call directory.
func (l *launch) makeDir() error {
	dir, err := l.cfg.newCallDir()
	if err != nil {
		return err
	}
	l.dir = dir
	return nil
}

// passNodePipes makes the node's output pipes and passes them to a runner
// the worker starts (nodePipes.pass): args and extra with them.
func (l *launch) passNodePipes(args []string, extra []*os.File) ([]string, []*os.File, error) {
	np, args, extra, err := passedNodePipes(args, extra)
	if err != nil {
		return nil, nil, err
	}
	l.nodes = np
	return args, extra, nil
}

// makeNodePipes makes the node's output pipes, for a runner they are
// handed to another way (a fork request).
func (l *launch) makeNodePipes() error {
	np, err := newNodePipes()
	if err != nil {
		return err
	}
	l.nodes = np
	return nil
}

// exec starts the runner's process in its box b: the interpreter with
// args, extra at its descriptors from firstExtraFD on, its stdio, env and
// what the call directory adds to it, in the call directory where that is
// its working directory, and in its sandbox where the worker has one
// (zygote: a zygote's, whose forks sandbox themselves), which shows it
// runtime, the runtime's source. The runner's ends are closed, whether it
// started or not.
func (l *launch) exec(b *box, args []string, extra []*os.File, env []string, zygote bool, runtime string) (*exec.Cmd, error) {
	cmd := exec.Command(l.cfg.Python, args...)
	b.prepare(cmd, l.dir.env(env, l.cfg.CancelGrace))
	cmd.Dir = l.dir.cwd
	cmd.Stdin = l.runner[0]
	if l.runner[1] != nil {
		cmd.Stdout, cmd.Stderr = l.runner[1], l.runner[2]
	}
	cmd.ExtraFiles = extra
	err := l.cfg.sandboxed(cmd, l.dir, zygote, args[0], runtime)
	if err == nil {
		err = b.start(cmd)
	}
	l.started()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", l.cfg.Python, err)
	}
	return cmd, nil
}

// started closes the worker's copies of the runner's ends, now that the
// runner has its own (or will never run): only the runner holds them.
func (l *launch) started() {
	for _, f := range l.theirs {
		f.Close()
	}
	l.theirs = nil
	l.runner = [3]*os.File{}
	l.nodes.started()
}

// handOver gives what the worker keeps to its owner (the call's Process,
// the spare or the zygote), which the caller took from the launch: close
// releases nothing after.
func (l *launch) handOver() { l.handed = true }

// close releases everything the launch still owns, for a start that
// failed: both ends of every pipe, the node's pipes and the call
// directory. Once handed over, it does nothing; a second close neither.
func (l *launch) close() {
	if l.handed {
		return
	}
	l.handed = true
	l.started()
	for _, c := range l.mine {
		c.Close()
	}
	l.mine = nil
	l.nodes.close()
	if l.dir != nil {
		if err := l.dir.remove(); err != nil {
			l.log.Warn("could not remove the call's directory", "dir", l.dir.path, "error", err)
		}
	}
}
