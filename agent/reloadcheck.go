package agent

// Before a reload replaces a working worker, the binary on disk is asked
// whether it would start with the configuration it will read: `fluksio-
// worker check-config` with the worker's own arguments and environment, as
// `sshd -t` and `nginx -t` check a configuration before a reload. A config
// file with a typo, a token file rotated away, a --listen address another
// program holds, a token that came from a pipe (`--token -`, `--token-file
// /dev/stdin`, which a re-executed worker cannot read again) or a binary
// that does not run here refuses the reload: the worker logs why, says so
// in its status, and keeps serving.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// reloadCheckTimeout bounds the check: it reads the config and the token
// and runs Python for its version, a second or two on a loaded machine.
const reloadCheckTimeout = 30 * time.Second

// CheckConfigCommand is `fluksio-worker check-config [run options]`: would
// `run` start with these options, config file, environment and token? It
// dials nothing and changes nothing (it takes no state directory lock).
// Exit 0 when it would, 2 with the reason when not.
func CheckConfigCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(args, os.Getenv)
	if err == nil {
		err = cfg.Resolve()
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, "Usage: fluksio-worker check-config [run's options]\n\nChecks that `run` with these options, environment, --config file and token\nwould start (nothing is dialed or changed). A reload runs it first and keeps\nthe running worker if it fails.\n\nExit status: 0 it would start, 2 it would not (saying why).")
		return config.ExitOK
	case err == nil:
		_, _, err = platform.FindPython(ctx, cfg.Python)
	}
	var stateDir string
	if err == nil {
		stateDir, err = config.ResolveStateDir(cfg, os.Getenv)
	}
	if err == nil && cfg.Listen != "" && cfg.Listen != os.Getenv(envReloadListen) {
		// The address the reloading worker serves now is its own to
		// the end: the new process binds it once the old one is gone.
		err = metrics.CheckListen(cfg.Listen)
		if errors.Is(err, syscall.EADDRINUSE) {
			if pid := servingWorker(stateDir, cfg.Listen); pid > 0 {
				fmt.Fprintf(stdout, "--listen %s: the port is held by the worker running from this state directory (pid %d); a reload of that worker frees it for the new process\n", cfg.Listen, pid)
				err = nil
			}
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker: %s\n", logging.NewRedactor(cfg.Token).Scrub(err.Error()))
		return config.ExitUsage
	}
	fmt.Fprintln(stdout, "the configuration is good")
	return config.ExitOK
}

// servingWorker is the pid of the live worker of stateDir when it serves
// --listen on the port of listen (which it then holds, whatever host
// either names), else 0: check-config run by hand beside the service it
// checks for a reload.
func servingWorker(stateDir, listen string) int {
	st, err := status.Read(stateDir)
	if err != nil || st.Listen == "" || st.PID <= 0 || st.PID != config.LockHolder(stateDir) || !platform.ProcessAlive(st.PID) {
		return 0
	}
	_, serving, err1 := net.SplitHostPort(st.Listen)
	_, asked, err2 := net.SplitHostPort(listen)
	if err1 != nil || err2 != nil || serving != asked {
		return 0
	}
	return st.PID
}

// envReloadListen tells a reload's check-config the --listen address the
// worker it would replace serves: that one is taken, by the worker itself,
// so it is not tried.
const envReloadListen = config.EnvPrefix + "RELOAD_LISTEN"

// checkReload runs exe's check-config with this worker's arguments and
// environment, and standard input empty: the re-executed worker could not
// read again what was piped in. listening is the worker's --listen ("" when
// off). It returns why the check failed.
func checkReload(ctx context.Context, exe, listening string) error {
	ctx, cancel := context.WithTimeout(ctx, reloadCheckTimeout)
	defer cancel()
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	cmd := exec.CommandContext(ctx, exe, append([]string{"check-config"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), envReloadListen+"="+listening)
	err := cmd.Run()
	if err == nil {
		return nil
	}
	if msg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out.String()), "fluksio-worker:")); msg != "" {
		return fmt.Errorf("%s (%w)", msg, err)
	}
	return fmt.Errorf("%s check-config: %w", exe, err)
}
