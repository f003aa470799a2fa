package installer

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// UninstallCommand is `fluksio-worker uninstall [--purge]`: stop, disable
// and remove the service; with --purge also its config (the token) and
// state. Uninstalling what is not installed succeeds, so scripts may run it
// blindly.
func UninstallCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return uninstall(ctx, thisHost(), args, stdout, stderr)
}

func uninstall(_ context.Context, h host, args []string, stdout, stderr io.Writer) int {
	cmd := config.NewCommand("uninstall", writeUninstallUsage)
	userService := cmd.Bool("user-service", false, "")
	purge := cmd.Bool("purge", false, "")
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "fluksio-worker uninstall: %v\n", err)
		return config.ExitFailed
	}
	l, err := installedLayout(h, cmd, *userService)
	if err != nil {
		return fail(err)
	}
	if err := h.needRoot(l, "removing"); err != nil {
		return fail(err)
	}
	// Read before the config goes: it may name another state directory.
	stateDir := stateDirOf(l)

	if exists(l.UnitPath) {
		m, err := newManager(l, "")
		if err != nil {
			return fail(err)
		}
		if state, _ := m.State(); state == Running {
			if err := m.Stop(); err != nil {
				return fail(err)
			}
			fmt.Fprintln(stdout, "Stopped the worker.")
		}
		if err := m.Uninstall(); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "Removed %s.\n", l.UnitPath)
	} else {
		fmt.Fprintf(stdout, "No service installed (no %s).\n", l.UnitPath)
	}

	if !*purge {
		if exists(l.ConfigPath) {
			fmt.Fprintf(stdout, "Kept %s and %s; 'fluksio-worker uninstall --purge%s' removes them.\n", l.ConfigPath, stateDir, userServiceArg(l))
		}
		return config.ExitOK
	}
	for _, dir := range purgeDirs(l, stateDir) {
		if !exists(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return fail(fmt.Errorf("removing %s: %w", dir, err))
		}
		fmt.Fprintf(stdout, "Removed %s.\n", dir)
	}
	if stateDir != l.StateDir && exists(stateDir) {
		fmt.Fprintf(stdout, "Left %s: the config chose it, and it may hold more than the worker's files; remove it yourself if it is the worker's alone.\n", stateDir)
	}
	return config.ExitOK
}

// purgeDirs are the directories --purge removes: the config directory
// (which holds the token), the state and the logs, where this installer
// chose them. A state-dir set by hand in the config is not removed, since
// it could be any directory.
func purgeDirs(l Layout, stateDir string) []string {
	dirs := []string{l.ConfigDir()}
	if stateDir == l.StateDir {
		dirs = append(dirs, l.StateDir)
	}
	if l.LogDir != "" {
		dirs = append(dirs, l.LogDir)
	}
	return dirs
}

func writeUninstallUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: sudo fluksio-worker uninstall [--purge] [--user-service]

Stops the worker service (its running calls are cancelled and reported to
the engine), disables it and removes its unit file or plist. The config and
the worker's state stay, so a later install picks them up, unless --purge.

Options:
`)
	config.WriteOption(w, "--purge", "also remove the config (with the token), the worker's state directory and, on macOS, its logs. The fluksio-worker system account stays, as files it owns may remain.")
	config.WriteOption(w, "--user-service", userServiceHelp)
	fmt.Fprint(w, `
Exit status: 0 removed (or nothing was installed), 1 failed.
`)
}
