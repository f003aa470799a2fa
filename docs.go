package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/fluksio/fluksio-worker/agent/clidoc"
	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/installer"
)

// cli describes the command line for the manual and the completions: the
// command list, each command's own --help, and run's options table.
func cli(ctx context.Context) (clidoc.CLI, error) {
	c := clidoc.CLI{
		Program:      "fluksio-worker",
		Version:      version,
		Date:         manualDate(),
		Tagline:      "run Fluksio pipeline nodes on this machine for a remote engine",
		About:        about,
		Examples:     quickStart,
		TableCommand: "run",
		Options:      config.Options,
		Environment:  environment,
	}
	for _, s := range synopsis {
		c.Synopsis = append(c.Synopsis, s[0])
	}
	for _, cmd := range commands() {
		var help, errs bytes.Buffer
		if code := cmd.run(ctx, []string{"--help"}, &help, &errs); code != config.ExitOK || help.Len() == 0 {
			return c, fmt.Errorf("'%s --help' exited %d, printing no help: %s", cmd.name, code, errs.String())
		}
		c.Commands = append(c.Commands, clidoc.Command{
			Name:       cmd.name,
			Summary:    cmd.summary,
			Help:       help.String(),
			TakesTable: takesRunOptions[cmd.name],
		})
	}
	return c, nil
}

// environment is every variable the worker reads besides its options', for
// the manual's ENVIRONMENT.
var environment = [][2]string{
	{"FLUKSIO_WORKER_CONFIG", "the config file, as --config."},
	{"FLUKSIO_WORKER_GPUS", "GPUs detected, read after SLURM_GPUS_ON_NODE and before /dev/nvidia*; not --gpus's variable (--gpus wins over it)."},
	{"SLURM_CPUS_ON_NODE, SLURM_MEM_PER_NODE, SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS", "what a SLURM job was given: CPUs, memory in MiB, and GPUs (a count, or the list of devices), advertised unless --cpus, --ram-mb or --gpus say otherwise."},
	{"CUDA_VISIBLE_DEVICES", "the GPUs this worker may use: a call asking for device 0 gets the first of them."},
	{"STATE_DIRECTORY", "systemd's StateDirectory=: the state directory when --state-dir is not given."},
	{"XDG_CACHE_HOME", "where the state directory is made (XDG_CACHE_HOME/fluksio-worker, else ~/.cache/fluksio-worker) when neither --state-dir nor STATE_DIRECTORY is set; XDG_CONFIG_HOME and XDG_STATE_HOME likewise place a user service's config and state."},
	{"SSL_CERT_FILE, SSL_CERT_DIR", "the certificate authorities trusted for the engine and the artifact store, as the system's are (--ca-file adds to them); node processes get SSL_CERT_FILE."},
	{"HTTPS_PROXY, HTTP_PROXY, NO_PROXY", "the proxy to dial the engine through (https_proxy for wss://, http_proxy for ws://), and the hosts to reach directly."},
	{"GOGC, GOMEMLIMIT", "the Go garbage collector's settings; when neither is set, run uses GOGC=50, so that a worker relaying large answers holds less memory."},
	{"JOURNAL_STREAM", "set by systemd when stderr is the journal: the text log then starts each line with its priority (<3> error to <7> debug) and leaves out the time the journal records."},
	{"NOTIFY_SOCKET, WATCHDOG_USEC", "set by systemd for a Type=notify unit: the worker says READY=1, its STATUS=, and pings the watchdog. Node processes do not get them."},
	{"SUDO_USER", "install: on macOS the account a LaunchDaemon runs as; everywhere, whether to say \"without sudo\" when --user-service is run as root."},
	{"SOURCE_DATE_EPOCH", "man: the date the manual page carries."},
}

// manualDate is the date on the manual: SOURCE_DATE_EPOCH's (the release
// build sets the commit's, so the same commit gives the same page), else
// today.
func manualDate() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Now().UTC()
}

// completionCommand is `fluksio-worker completion SHELL`.
func completionCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := config.NewCommand("completion", writeCompletionUsage)
	cmd.Operands = true // the shell
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	if cmd.NArg() != 1 {
		fmt.Fprintln(stderr, "fluksio-worker completion: name one shell: bash, zsh or fish (see 'fluksio-worker completion --help')")
		return config.ExitUsage
	}
	c, err := cli(ctx)
	if err == nil {
		err = clidoc.WriteCompletion(stdout, c, cmd.Arg(0))
	}
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker completion: %v\n", err)
		return config.ExitUsage
	}
	return config.ExitOK
}

func writeCompletionUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: fluksio-worker completion bash|zsh|fish

Prints the completion script for a shell: commands, their flags, and the
values of flags that take one of a few (--log-format, --runtime). The deb and
rpm install them where each shell looks; otherwise, for yourself:

  bash: fluksio-worker completion bash > ~/.local/share/bash-completion/completions/fluksio-worker
  zsh:  fluksio-worker completion zsh > "${fpath[1]}/_fluksio-worker"
  fish: fluksio-worker completion fish > ~/.config/fish/completions/fluksio-worker.fish

Exit status: 0 printed, 2 no such shell.
`)
}

// manCommand is the hidden `fluksio-worker man`: the manual page, in roff,
// on stdout.
func manCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: fluksio-worker man > fluksio-worker.1")
		return config.ExitUsage
	}
	c, err := cli(ctx)
	if err == nil {
		err = clidoc.WriteMan(stdout, c, manualFiles())
	}
	if err != nil {
		fmt.Fprintf(stderr, "fluksio-worker man: %v\n", err)
		return config.ExitRefused
	}
	return config.ExitOK
}

// manualFiles are the files the manual explains, where Linux keeps them.
func manualFiles() []clidoc.File {
	system, user := installer.LinuxLayouts()
	return []clidoc.File{
		{Path: system.ConfigPath, What: "The system service's settings, written by install and read by run --config. It holds the token, so only root and the service account can read it."},
		{Path: system.UnitPath, What: "The systemd unit install writes; a package upgrade rewrites it (install --refresh-unit)."},
		{Path: system.StateDir, What: "The system service's state: the status file that status reads, and the runner cache."},
		{Path: user.ConfigPath, What: "A user service's settings (install --user-service)."},
		{Path: user.UnitPath, What: "A user service's systemd unit."},
		{Path: user.StateDir, What: "A user service's state."},
		{Path: "/usr/share/doc/fluksio-worker/config.example.toml", What: "Every setting, commented, as the packages ship it."},
	}
}
