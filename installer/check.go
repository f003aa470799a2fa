package installer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/runner"
	"github.com/fluksio/fluksio-worker/agent/runtime"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// CheckCommand is `fluksio-worker check`: a checklist for a person whose
// worker does not attach. Each item says ok or FAIL and what to do; it
// changes nothing on the machine. Exit 1 if any item fails.
func CheckCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return check(ctx, thisHost(), args, stdout, stderr)
}

// checklist prints items as they are checked, keeps them for --json, and
// remembers a failure.
type checklist struct {
	w      io.Writer // the human's view; io.Discard with --json
	failed bool
	items  []checkItem
}

// checkItem is one line of the checklist; `check --json` prints them.
type checkItem struct {
	Item   string `json:"item"`
	Result string `json:"result"` // ok, fail, skip or note
	Detail string `json:"detail"`
}

func (c *checklist) add(item, result, mark, detail string) {
	c.items = append(c.items, checkItem{Item: item, Result: result, Detail: detail})
	fmt.Fprintf(c.w, "  %-5s %-10s %s\n", mark, item, detail)
}

func (c *checklist) ok(item, format string, args ...any) {
	c.add(item, "ok", "ok", fmt.Sprintf(format, args...))
}

func (c *checklist) fail(item string, err error) {
	c.failed = true
	c.add(item, "fail", "FAIL", err.Error())
}

func (c *checklist) skip(item, why string) { c.add(item, "skip", "-", why) }

func (c *checklist) note(item, text string) { c.add(item, "note", "note", text) }

// report is `check --json`: what was checked, each item, and whether all
// passed, for scripts and fleet tools.
func (c *checklist) report(w io.Writer, checking string) {
	writeJSON(w, struct {
		OK       bool        `json:"ok"`
		Checking string      `json:"checking"`
		Items    []checkItem `json:"items"`
	}{!c.failed, checking, c.items})
}

func check(ctx context.Context, h host, args []string, stdout, stderr io.Writer) int {
	cmd := config.NewCommand("check", writeCheckUsage)
	configPath := cmd.String("config", "", "")
	userService := cmd.Bool("user-service", false, "")
	asJSON := cmd.Bool("json", false, "")
	var runArgs []string
	for _, o := range config.Options {
		name := o.Name
		cmd.Func(name, "", func(v string) error {
			runArgs = append(runArgs, "--"+name+"="+v)
			return nil
		})
	}
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}

	// Which worker: --config, else the installed service's, else the
	// options and environment, as `run` would take them.
	getenv := h.Getenv
	var l *Layout
	if *configPath == "" {
		installed, err := installedLayout(h, cmd, *userService)
		if err == nil && exists(installed.UnitPath) {
			l = &installed
			*configPath = installed.ConfigPath
			// The service does not see this shell's environment.
			getenv = func(string) string { return "" }
		}
	}
	c := &checklist{w: stdout}
	var checking string
	switch {
	case l != nil:
		checking = fmt.Sprintf("the installed worker (%s, %s)", l.Kind(), *configPath)
	case *configPath != "":
		checking = "the worker configured in " + *configPath
	default:
		checking = "the worker these options describe (no service is installed)"
	}
	if *asJSON {
		c.w = io.Discard
		defer func() { c.report(stdout, checking) }()
	}
	fmt.Fprintf(c.w, "Checking %s:\n", checking)
	if *configPath != "" {
		runArgs = append([]string{"--config", *configPath}, runArgs...)
	}
	cfg, err := config.Load(runArgs, getenv)
	if err == nil {
		err = cfg.Resolve()
	}
	if err != nil {
		if errors.Is(err, os.ErrPermission) && !h.root() {
			err = fmt.Errorf("%w (the config holds the token, so only its owner and root may read it: run it with sudo)", err)
		}
		c.fail("config", errors.New(logging.NewRedactor(cfg.Token).Scrub(err.Error())))
		fmt.Fprintln(c.w, "Fix the config first; the other checks need it.")
		return config.ExitFailed
	}
	c.ok("config", "engine %s, labels [%s], %d at a time", logging.ShownURL(cfg.URL), strings.Join(cfg.Labels, ","), cfg.Parallel)
	for _, w := range cfg.Warnings {
		c.note("config", w)
	}

	python, version, err := platform.FindPython(ctx, cfg.Python)
	if err != nil {
		c.fail("python", err)
	} else {
		c.ok("python", "%s (Python %s)", python, version)
		if l != nil && !l.UserService && h.root() {
			checkServiceAccount(ctx, c, *l, python, cfg)
		}
	}

	checkRuntime(ctx, c, cfg)

	inv := platform.DetectInventory(platform.Overrides{CPUs: cfg.CPUs, GPUs: cfg.GPUs, RAMMB: cfg.RAMMB})
	ram := "unknown memory"
	if inv.RAMMB != nil {
		ram = fmt.Sprintf("%d MiB memory", *inv.RAMMB)
	}
	c.ok("inventory", "%d CPUs, %d GPUs, %s", inv.CPUs, inv.GPUs, ram)
	checkContainment(c, l, cfg)
	checkSandbox(c, l, cfg)
	checkLimits(c, cfg, runner.ProbeContainment(cfg.Containment))
	checkDisk(c, cfg, getenv)
	c.ok("policy", "%s", cfg.PolicyText())

	pctx, cancel := context.WithTimeout(ctx, engineCheckTimeout)
	err = agent.CheckAttach(pctx, cfg)
	cancel()
	var refused *protocol.RefusedError
	switch {
	case errors.As(err, &refused):
		c.ok("engine", "%s answers", logging.ShownURL(cfg.URL))
		c.fail("token", fmt.Errorf("%w: ask the engine's admin for a worker token, then: sudo fluksio-worker install --token -", refused))
	case err != nil:
		c.fail("engine", fmt.Errorf("cannot reach %s: %w (check the URL, DNS, and that a firewall or proxy lets WebSockets out)", logging.ShownURL(cfg.URL), err))
		c.skip("token", "not checked: the engine did not answer")
	default:
		c.ok("engine", "%s answers", logging.ShownURL(cfg.URL))
		c.ok("token", "accepted: the engine welcomed this worker")
	}

	if c.failed {
		return config.ExitFailed
	}
	fmt.Fprintln(c.w, "All good.")
	return config.ExitOK
}

// checkContainment says how calls' processes are kept together. What this
// command finds is its own cgroup's answer, the shell's it runs in (a
// login session's, as root); the service decides in its own cgroup, as its
// account, with or without Delegate=yes in its unit, and may get another.
// So for an installed worker that runs, the answer is the one its status
// file says it uses, and this shell's is said beside it when it differs;
// one that does not run is told to look at status once it does.
func checkContainment(c *checklist, l *Layout, cfg config.Config) {
	here := runner.ProbeContainment(cfg.Containment)
	mode, whose := here, ""
	if l != nil {
		st, err := status.Read(stateDirOf(*l))
		if err == nil && st.Containment != "" && st.State != status.StateStopped && platform.ProcessAlive(st.PID) {
			mode, whose = st.Containment, " (the running service's)"
		}
	}
	if mode == platform.ContainProcessGroup {
		c.skip("contain", mode+whose+" only: a process that leaves its call's process group may outlive the call")
	} else {
		c.ok("contain", "%s%s: what a node starts is stopped with its call", mode, whose)
	}
	switch {
	case whose != "" && here != mode:
		c.note("contain", fmt.Sprintf("a worker started from this shell would get %s: the service decides in its own cgroup, as its own account", here))
	case l != nil && whose == "":
		c.note("contain", "that is this shell's; the service decides in its own cgroup when it starts (fluksio-worker status then shows what it uses)")
	}
}

// checkSandbox says whether calls run in a sandbox: the running service's
// answer where there is one (it decides under its unit's settings), else
// this shell's.
func checkSandbox(c *checklist, l *Layout, cfg config.Config) {
	state, whose := "", ""
	if l != nil {
		st, err := status.Read(stateDirOf(*l))
		if err == nil && st.Sandbox != "" && st.State != status.StateStopped && platform.ProcessAlive(st.PID) {
			state, whose = st.Sandbox, " (the running service's)"
		}
	}
	if state == "" {
		exe, err := os.Executable()
		if err != nil {
			c.skip("sandbox", "cannot be tried: "+err.Error())
			return
		}
		stateDir, err := config.ResolveStateDir(cfg, os.Getenv)
		if err != nil {
			c.skip("sandbox", "cannot be tried without a state directory: "+err.Error())
			return
		}
		state = runner.ProbeSandbox(cfg.Sandbox, exe, stateDir)
	}
	if strings.HasPrefix(state, runner.SandboxOff) {
		c.skip("sandbox", state+whose+": node code reaches what the worker's account can")
		return
	}
	c.ok("sandbox", "%s%s: each call sees its own directory and a private /tmp, not the worker's state, token or other calls", state, whose)
}

// checkServiceAccount checks that the account the service runs as can run
// the Python and the hooks and read the keys, which a check as root alone
// would not show.
func checkServiceAccount(ctx context.Context, c *checklist, l Layout, python string, cfg config.Config) {
	text, err := os.ReadFile(l.UnitPath)
	if err != nil {
		return
	}
	name := unitAccount(string(text))
	if name == "" {
		return
	}
	acct, err := lookupAccount(ctx, name)
	if err != nil {
		c.fail("account", fmt.Errorf("the service runs as %s: %w", name, err))
		return
	}
	if err := runAs(ctx, acct, python, "-c", "import sys"); err != nil {
		c.fail("account", fmt.Errorf("%s, the service account, cannot run %s: %v", name, python, err))
		return
	}
	if err := accountCanUse(ctx, acct, cfg); err != nil {
		c.fail("account", err)
		return
	}
	c.ok("account", "%s, the service account, can run that Python", name)
}

// checkRuntime fetches or extracts the runner script the way `run` would,
// into a scratch directory, so the check leaves the service's state alone.
func checkRuntime(ctx context.Context, c *checklist, cfg config.Config) {
	scratch, err := os.MkdirTemp("", "fluksio-worker-check-")
	if err != nil {
		c.fail("runtime", err)
		return
	}
	defer os.RemoveAll(scratch)
	var warnings strings.Builder
	log := slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(ctx, engineCheckTimeout)
	defer cancel()
	rt, err := runtime.Ensure(ctx, cfg, scratch, log)
	if err != nil {
		c.fail("runtime", err)
		return
	}
	note := ""
	if cfg.Runtime == "" || cfg.Runtime == "auto" {
		if rt.Source == "embedded" {
			note = " (the engine serves none, or could not be asked)"
		}
	}
	c.ok("runtime", "%s runner, sha256 %s%s", rt.Source, rt.Hash[:12], note)
}

func writeCheckUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: sudo fluksio-worker check [--user-service | --config FILE] [options]

Checks, one item at a time, what a worker needs, and says what to fix:
  config     the settings load (the installed service's config by default)
  python     the Python for node code runs, and which version it is
  account    the service account can run that Python (as root, system service)
  runtime    the runner script can be fetched from the engine or unpacked
  inventory  the CPUs, GPUs and memory this machine will advertise
  contain    how a call's processes are kept together (--containment): the
             running service's, from its status; else what this shell gets
  limits     the per-call limits can be set (--call-memory-max, --call-pids-max,
             --call-cpu-max)
  disk       the free space in the state directory (--min-free-disk)
  policy     the code policy and call hooks in force (--allow-module,
             --allow-source, --pre-call-hook, --post-call-hook)
  engine     the engine answers at the URL
  token      the engine accepts the token

It changes nothing here: the engine sees a hello and a goodbye.

Options:
`)
	config.WriteOption(w, "--config FILE", "check the worker this config describes, instead of the installed service's")
	config.WriteOption(w, "--user-service", userServiceHelp)
	config.WriteOption(w, "--json", "print the items as one JSON object ({\"ok\": …, \"items\": [{\"item\", \"result\", \"detail\"}]}), for scripts")
	config.WriteOption(w, "--url, --token-file, … ", "any option of 'fluksio-worker run', to check a worker that is not installed, or to try a change before installing it")
	fmt.Fprint(w, `
Exit status: 0 all good, 1 an item failed, 2 bad options.
`)
}
