package installer

import (
	"fmt"
	"io"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// control runs start, stop or restart: one service-manager verb on the
// installed service, with the same flags, checks and messages.
func control(h host, name string, args []string, stdout, stderr io.Writer, help func(io.Writer), act func(*manager) error, done string) int {
	cmd := config.NewCommand(name, help)
	userService := cmd.Bool("user-service", false, "")
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "fluksio-worker %s: %v\n", name, err)
		return config.ExitFailed
	}
	l, err := installedLayout(h, cmd, *userService)
	if err != nil {
		return fail(err)
	}
	if !exists(l.UnitPath) {
		fmt.Fprintf(stderr, "fluksio-worker %s: the worker is not installed as a service here (no %s); see 'fluksio-worker install --help'\n", name, l.UnitPath)
		return config.ExitNotInstalled
	}
	if err := h.needRoot(l, name+"ing"); err != nil {
		return fail(err)
	}
	m, err := newManager(l, "")
	if err != nil {
		return fail(err)
	}
	if err := act(m); err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "%s the %s. See: fluksio-worker status%s\n", done, l.Kind(), userServiceArg(l))
	return config.ExitOK
}

// writeControlUsage is the help of start, stop and restart.
func writeControlUsage(name, what string) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintf(w, "Usage: sudo fluksio-worker %s [--user-service]\n\n%s\n\nOptions:\n", name, what)
		config.WriteOption(w, "--user-service", userServiceHelp)
		fmt.Fprint(w, "\nExit status: 0 done, 1 the service manager failed, 4 not installed.\n")
	}
}
