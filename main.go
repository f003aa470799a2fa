// Command fluksio-worker runs Fluksio pipeline nodes on this machine for an
// engine that cannot reach it: it dials out over one WebSocket, says what the
// machine holds, and runs each call in a Python process.
//
// main wires the command line; each command lives with what it drives
// (run in agent, install in installer) and reads its own arguments through
// config.Command, which answers --help, a mistyped option and a stray
// argument alike for all of them. Those here drive only this binary or a
// few library calls: copy, version, completion, and keygen and sign, whose
// keys live in agent/policy, which cannot hold a command (config, which
// every command parses through, imports it).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/installer"
)

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
		{"restart", "restart the installed service (running calls are stopped)", installer.RestartCommand},
		{"reload", "reload the installed service once its running calls finish", installer.ReloadCommand},
		{"status", "show the service's state and what the worker is doing", installer.StatusCommand},
		{"check", "check Python, the runtime, the inventory and the engine, for a human", installer.CheckCommand},
		{"check-config", "check that run would start with these options and config, as a reload does first", agent.CheckConfigCommand},
		{"completion", "print the completion script for bash, zsh or fish", completionCommand},
		{"copy", "copy this binary into a directory (for a Kubernetes init container)", copyCommand},
		{"keygen", "make a key pair for signing node files (--allow-source signed)", keygenCommand},
		{"sign", "sign node files with a key, for workers that run only signed source", signCommand},
		{"version", "print the version, revision, build date, Go version and protocol (--json)", versionCommand},
	}
}

// commandNames are the commands' names, for a "did you mean".
func commandNames() []string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return names
}

// takesRunOptions are the commands that take every option of run's table
// besides the flags their help lists (check's help says so in one line);
// completions offer them all.
var takesRunOptions = map[string]bool{"check": true, "check-config": true}

func main() {
	agent.Version = version
	os.Exit(dispatch(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return config.ExitUsage
	}
	switch args[0] {
	case "help":
		// `help install` is `install --help`.
		if len(args) > 1 {
			for _, c := range commands() {
				if args[1] == c.name {
					return c.run(ctx, []string{"--help"}, stdout, stderr)
				}
			}
			fmt.Fprintf(stderr, "fluksio-worker: no command %q to show help for%s\n\n", args[1], config.DidYouMean(args[1], commandNames()))
			usage(stderr)
			return config.ExitUsage
		}
		usage(stdout)
		return config.ExitOK
	case "-h", "-help", "--help":
		usage(stdout)
		return config.ExitOK
	case "-version", "--version":
		// One line, as scripts written for it read it; `version` says more.
		fmt.Fprintf(stdout, "fluksio-worker %s\n", version)
		return config.ExitOK
	case "man":
		// Not in the list: the release build runs it to write the manual
		// page the packages carry (packaging/generate.sh).
		return manCommand(ctx, args[1:], stdout, stderr)
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
	fmt.Fprintf(stderr, "fluksio-worker: unknown command %q%s\n\n", args[0], config.DidYouMean(args[0], commandNames()))
	usage(stderr)
	return config.ExitUsage
}

// about opens --help and the manual's DESCRIPTION.
const about = `fluksio-worker runs Fluksio pipeline nodes on this machine for an engine that
cannot reach it. It connects out to the engine over one WebSocket, tells it
what this machine holds (CPUs, GPUs, memory, labels), and runs each call it is
sent in a fresh Python process, streaming the results back.`

// synopsis is the command line's forms, without the program name, and what
// each does.
var synopsis = [][2]string{
	{"[run] --url URL --token-file PATH [options]", "run in the foreground"},
	{"COMMAND [options]", ""},
}

// quickStart is the first steps on a new machine, for --help and the
// manual's EXAMPLES.
var quickStart = [][2]string{
	{"fluksio-worker selftest", "check this machine can run nodes"},
	{"sudo fluksio-worker install --url wss://ENGINE/api/v1/workers/attach --token - --labels gpu", "attach it to your engine as a service"},
	{"systemctl status fluksio-worker", "see the service"},
}

func usage(w io.Writer) {
	fmt.Fprint(w, about+"\n\nUsage:\n")
	for _, s := range synopsis {
		fmt.Fprintf(w, "  %s\n", strings.TrimRight(fmt.Sprintf("fluksio-worker %-45s %s", s[0], s[1]), " "))
	}
	fmt.Fprint(w, "\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run 'fluksio-worker help COMMAND' (or 'COMMAND --help') for a command's options.

Quick start:
`)
	for _, q := range quickStart {
		if len(q[0]) > 44 { // no room for what it does
			fmt.Fprintf(w, "  %s\n", q[0])
			continue
		}
		fmt.Fprintf(w, "  %-44s %s\n", q[0], q[1])
	}
}
