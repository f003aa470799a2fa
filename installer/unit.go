package installer

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// serviceParams is everything the unit file or plist depends on. Nothing
// secret: the token stays in the config file.
type serviceParams struct {
	Executable  string // absolute path of the fluksio-worker binary
	ConfigPath  string
	Account     string        // User= / UserName; "" for a user service
	CancelGrace time.Duration // the agent's SIGTERM→SIGKILL grace for each call
	// WritableHome is the account's home when it is a person's (under /home,
	// or /root): ProtectHome=read-only would leave node code unable to
	// write its caches there (~/.cache/huggingface, say), so it is exempted.
	WritableHome string
}

// stopTimeout is how long the service manager lets the worker stop before
// it kills everything: the agent cancels its calls (SIGTERM, then SIGKILL
// after the cancel grace), reports them to the engine and closes the
// socket, so it needs the grace plus time for a slow network.
func stopTimeout(grace time.Duration) int {
	const closeMargin = 30 * time.Second
	return int(math.Ceil((grace + closeMargin).Seconds()))
}

// unitServiceCommon and unitRestartAndStop are the [Service] lines the
// system and the user unit share (systemUnit says why each is there): how
// the worker is started, reloaded and watched, then how it is restarted
// and stopped. The system unit puts User= between the two.
const unitServiceCommon = `Type=notify
NotifyAccess=main
ExecStart=@EXEC@ run --config @CONFIG_ARG@
# A reload lets running calls finish, then re-executes the worker in place.
# (sh's own kill: a minimal system may have no /bin/kill.)
ExecReload=/bin/sh -c "kill -HUP $MAINPID"
# The worker's main loop pings every second; a worker stuck for 30 s is
# restarted. An engine outage does not stop the pings.
WatchdogSec=30
`

const unitRestartAndStop = `# Exit 1 means the engine refused this worker (say, a revoked token), exit 2
# a bad configuration: starting again would not change either. Fix the cause,
# then 'systemctl restart'. (A crash dies of SIGABRT, and is restarted.)
Restart=on-failure
RestartSec=5
RestartPreventExitStatus=1 2
# SIGTERM goes to the worker alone; it stops its calls and reports them.
KillMode=mixed
TimeoutStopSec=@STOP_TIMEOUT@
`

// systemUnit is the unit of a system service. The rules it follows:
//   - ExecStart carries no secret: the token is read from the 0600 config.
//   - RestartPreventExitStatus=1 2: the agent exits 1 when the engine
//     refuses it (a revoked token) and 2 for a bad configuration; restarting
//     would fail the same way every 5 s forever. A Go panic would also exit
//     2, but under a service manager the worker makes a crash die of
//     SIGABRT instead (RunCommand), which Restart=on-failure restarts.
//   - ExecReload sends SIGHUP: the worker declines new calls, lets running
//     ones finish (--reload-timeout) and re-executes itself in place, so
//     upgrades and new settings never kill a call; `restart` still does.
//   - KillMode=mixed: stop sends SIGTERM to the agent alone, which cancels
//     and reports its calls itself; whatever is left when TimeoutStopSec
//     runs out gets SIGKILL. (kardianos' default unit, KillMode=control-group
//     with no stop timeout, would kill the calls under the agent.)
//   - OOMScoreAdjust=-500: when memory runs out the kernel's OOM killer is
//     to pick node code (the worker raises each runner to +500), not the
//     worker that would report what happened. Only a system unit may lower
//     it; a user manager would refuse to start the service.
//   - LimitMEMLOCK=64M: each zygote pins the pages its forks write, some
//     2 to 3 MiB, so that a fork copies them at once rather than one fault
//     at a time (worker_main.py's ForkPinning); the pinned pages count
//     against this limit for the service's user as a whole, and the
//     default 8M would cover only a few environments' zygotes.
//   - Delegate=yes: the worker may make a cgroup per call under its own and
//     kill it whole when the call ends (--containment); for that its
//     cgroup must be writable, so no ProtectControlGroups (it would mount
//     /sys/fs/cgroup read-only).
//   - Hardening that keeps the GPUs and the user's Python reachable: no
//     PrivateDevices, DeviceAllow or ProtectClock (each closes /dev, and the
//     GPUs are /dev/nvidia* and /dev/dri/*); ProtectHome=read-only, not yes
//     (venvs live under /home); no MemoryDenyWriteExecute (JITs: numba,
//     triton) and no allow-list of system calls (node code is arbitrary).
//     The system calls denied are ones an unprivileged process cannot use
//     anyway, and they fail with EPERM rather than killing the process.
//   - RestrictNamespaces=user mnt pid and @mount allowed: each call's
//     sandbox is made of new user and mount namespaces (and a PID namespace
//     where the kernel lacks Landlock's scopes), in which the worker's own
//     binary mounts what the call may see (--sandbox, platform/sandbox.go);
//     no other namespace, and no mount outside them: an unprivileged
//     process may mount only in a user namespace of its own. This costs
//     0.6 of systemd-analyze's exposure (2.5 to 3.1), and confines node
//     code, the one untrusted thing the service runs, far more than the
//     unit alone could. ProtectSystem=strict as well (the worker writes
//     only its state directory and its cgroup).
//   - Type=notify: the worker says READY=1 once its configuration is valid
//     and it is dialing (not once the engine answers: an engine that is down
//     at boot must not fail the unit), and keeps STATUS= current (attached
//     as which name to which engine, calls running and done), which
//     `systemctl status` shows. NotifyAccess=main: node code cannot speak
//     for the worker.
//   - WatchdogSec=30: the worker's main loop pings every second; it never
//     waits on the engine, so only a worker that is stuck itself (deadlocked,
//     stopped) misses 30 s of pings and is restarted. systemd first sends
//     SIGABRT, whose goroutine dump lands in the journal.
const systemUnit = `# Written by 'fluksio-worker install'; running it again rewrites this file.
# Settings are in @CONFIG@.
[Unit]
Description=Fluksio worker: runs pipeline nodes for a Fluksio engine
Documentation=https://github.com/fluksio/fluksio-worker
After=network-online.target
Wants=network-online.target

[Service]
` + unitServiceCommon + `User=@USER@
` + unitRestartAndStop + `# The out-of-memory killer picks node code (raised to +500), not the worker.
OOMScoreAdjust=-500
# Each call runs in a cgroup of its own under the worker's, killed whole at its end.
Delegate=yes
StateDirectory=fluksio-worker
StateDirectoryMode=0750
# Data loaders in node code open many files at once.
LimitNOFILE=65536
# A zygote pins the pages its forks write (a few MiB each) so that a fork
# copies them at once; 8M, the default, is shared by all the worker's zygotes.
LimitMEMLOCK=64M

# Hardening that leaves GPUs (/dev) and a Python under /home or /opt usable.
NoNewPrivileges=yes
CapabilityBoundingSet=
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictNamespaces=user mnt pid
RestrictRealtime=yes
RestrictSUIDSGID=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
LockPersonality=yes
RemoveIPC=yes
PrivateMounts=yes
UMask=0027
SystemCallArchitectures=native
SystemCallFilter=~@clock @cpu-emulation @module @obsolete @raw-io @reboot @swap
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
`

// userUnit is the unit of a systemd --user service. The user manager has
// no network-online.target to wait for (the agent retries its connection
// anyway), cannot raise limits above its own, and can only apply the
// sandboxing options that need no privileges.
const userUnit = `# Written by 'fluksio-worker install --user-service'; running it again rewrites this file.
# Settings are in @CONFIG@.
[Unit]
Description=Fluksio worker: runs pipeline nodes for a Fluksio engine
Documentation=https://github.com/fluksio/fluksio-worker

[Service]
` + unitServiceCommon + unitRestartAndStop + `NoNewPrivileges=yes

[Install]
WantedBy=default.target
`

// renderUnit returns the systemd unit for p.
func renderUnit(p serviceParams, userService bool) (string, error) {
	if err := checkServiceParams(p); err != nil {
		return "", err
	}
	text := systemUnit
	if userService {
		text = userUnit
	} else if p.Account == "" {
		return "", fmt.Errorf("a system unit needs the account it runs as")
	}
	if p.WritableHome != "" && !userService {
		text = strings.Replace(text, "ProtectHome=read-only\n", "ProtectHome=read-only\n"+
			"# The account's home stays writable: node code keeps its caches there.\n"+
			"ReadWritePaths=-"+systemdWord(p.WritableHome)+"\n", 1)
	}
	r := strings.NewReplacer(
		"@EXEC@", systemdWord(p.Executable),
		"@CONFIG_ARG@", systemdWord(p.ConfigPath),
		"@CONFIG@", p.ConfigPath, // in a comment, where systemd expands nothing
		"@USER@", p.Account,
		"@STOP_TIMEOUT@", fmt.Sprint(stopTimeout(p.CancelGrace)),
	)
	return r.Replace(text), nil
}

// systemdWord writes one word of a systemd command line. systemd expands %
// specifiers and $VARIABLES even inside quotes, so those are doubled; a word
// with blanks, quotes or backslashes is double-quoted with C escapes.
func systemdWord(s string) string {
	s = strings.NewReplacer("%", "%%", "$", "$$").Replace(s)
	if s == "" || strings.ContainsAny(s, " \t\"'\\;") {
		s = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
	}
	return s
}

// checkServiceParams rejects what no service file can carry safely: control
// characters (a newline would end the line and start a new directive) and
// "{{", which kardianos would take for a template action.
func checkServiceParams(p serviceParams) error {
	for what, v := range map[string]string{"the binary's path": p.Executable, "the config path": p.ConfigPath, "the account name": p.Account, "the account's home": p.WritableHome} {
		if strings.Contains(v, "{{") {
			return fmt.Errorf("%s %q contains {{, which the service file cannot carry; move it", what, v)
		}
		for _, r := range v {
			if r < 0x20 || r == 0x7f {
				return fmt.Errorf("%s %q contains a control character; move it", what, v)
			}
		}
	}
	return nil
}
