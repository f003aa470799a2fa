// Command fluksio-worker runs Fluksio pipeline nodes on this machine for an
// engine that cannot reach it: it dials out over one WebSocket, says what the
// machine holds, and runs each call in a Python process.
//
// main only wires the command line; each command lives with what it drives.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/installer"
)

// version is stamped by the release build (-ldflags "-X main.version=…").
var version = "dev"

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"run", "attach to the engine and run calls in the foreground (the default)", agent.RunCommand},
		{"inventory", "print what this machine would advertise, as JSON", agent.InventoryCommand},
		{"selftest", "prove the whole path on this machine with a built-in engine", agent.SelftestCommand},
		{"install", "install (or update) and start the worker as an OS service", installer.InstallCommand},
		{"uninstall", "stop and remove the service (--purge: also config and state)", installer.UninstallCommand},
		{"start", "start the installed service", installer.StartCommand},
		{"stop", "stop the installed service", installer.StopCommand},
		{"restart", "restart the installed service", installer.RestartCommand},
		{"status", "show the service's state and what the worker is doing", installer.StatusCommand},
		{"check", "check Python, the runtime, the inventory and the engine, for a human", installer.CheckCommand},
		{"copy", "copy this binary into a directory (for a Kubernetes init container)", copyCommand},
	}
}

func main() {
	agent.Version = version
	os.Exit(dispatch(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	case "-version", "--version", "version":
		fmt.Fprintf(stdout, "fluksio-worker %s\n", version)
		return 0
	}
	for _, c := range commands() {
		if args[0] == c.name {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	if strings.HasPrefix(args[0], "-") {
		// Bare flags mean `run`, so scripts written for the Python agent
		// (`fluksio-worker --url … --token …`) keep working.
		return agent.RunCommand(ctx, args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "fluksio-worker: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, `fluksio-worker runs Fluksio pipeline nodes on this machine for an engine that
cannot reach it. It connects out to the engine over one WebSocket, tells it
what this machine holds (CPUs, GPUs, memory, labels), and runs each call it is
sent in a fresh Python process, streaming the results back.

Usage:
  fluksio-worker [run] --url URL --token-file PATH [options]   run in the foreground
  fluksio-worker COMMAND [options]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `  version    print the version

Run 'fluksio-worker COMMAND --help' for a command's options.

Quick start:
  fluksio-worker selftest                      check this machine can run nodes
  sudo fluksio-worker install --url wss://ENGINE/api/v1/workers/attach --token - --labels gpu
  systemctl status fluksio-worker
`)
}
