package config

// Exit codes of every fluksio-worker command, in one table. A service
// manager reads them: the unit tells systemd not to restart on ExitRefused,
// and `status` answers as `systemctl status` and LSB init scripts do.
const (
	ExitOK      = 0 // done: stopped, drained, idle, --max-calls reached; installed; all checks passed
	ExitRefused = 1 // run: the engine refused this worker (retrying would not change it)
	ExitFailed  = 1 // install, uninstall, check, reload, copy: something failed, and says what
	ExitUsage   = 2 // a bad option or configuration; the message says which

	// run
	ExitReloadFailed = 3 // a reload could not execute the binary: not 1, so the service manager restarts it
	// ExitNeverAttached: --max-idle ran out and the engine never welcomed
	// this worker (a wrong URL or token, no network): a batch job's
	// scheduler must not count that as done.
	ExitNeverAttached = 4

	// status
	ExitStopped      = 3 // installed, not running
	ExitNotInstalled = 4 // not installed
)
