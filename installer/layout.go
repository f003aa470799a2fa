package installer

import (
	"errors"
	"fmt"
	"path/filepath"
)

// Names the service is known by.
const (
	// unitName is the systemd unit (fluksio-worker.service) and the name of
	// the config, state and log directories everywhere.
	unitName = "fluksio-worker"
	// launchdLabel is the launchd job label and plist file name. launchd
	// expects reverse-DNS labels; ours follows the project's domain.
	launchdLabel = "io.fluksio.worker"
	// defaultAccount is the system account a system service runs as when
	// --user does not name another.
	defaultAccount = "fluksio-worker"
)

// Layout is where one installation keeps its pieces: a system service
// (root; a systemd system unit or a LaunchDaemon) or a user service (a
// systemd --user unit or a LaunchAgent). Every command derives the same
// Layout, so `status` finds what `install` wrote.
type Layout struct {
	GOOS        string // linux or darwin
	UserService bool
	ServiceName string // what the service manager calls it: unit name or launchd label
	UnitPath    string // the unit file or plist
	ConfigPath  string
	StateDir    string // written into the config as state-dir; status.json lives here
	LogDir      string // launchd only: systemd logs go to the journal
}

// ConfigDir is the directory holding the config file.
func (l Layout) ConfigDir() string { return filepath.Dir(l.ConfigPath) }

// Kind names the layout for messages: "systemd system service" and so on.
func (l Layout) Kind() string {
	manager := "systemd"
	if l.GOOS == "darwin" {
		manager = "launchd"
	}
	if l.UserService {
		return manager + " user service"
	}
	return manager + " system service"
}

// LogHint tells a person where the worker's log is.
func (l Layout) LogHint() string {
	switch {
	case l.GOOS == "darwin":
		return filepath.Join(l.LogDir, unitName+".log")
	case l.UserService:
		return "journalctl --user -u " + unitName
	default:
		return "journalctl -u " + unitName
	}
}

// dirs is what layoutFor needs to know about the person running it.
type dirs struct {
	Home          string // the user's home directory
	XDGConfigHome string // $XDG_CONFIG_HOME, may be empty
	XDGStateHome  string // $XDG_STATE_HOME, may be empty
}

// errUnsupportedOS is returned for systems without systemd or launchd
// support in this installer.
var errUnsupportedOS = errors.New("installing a service is supported on linux (systemd) and macOS (launchd); elsewhere run 'fluksio-worker run --config FILE' under your own supervisor")

// layoutFor decides every path. It touches nothing.
func layoutFor(goos string, userService bool, d dirs) (Layout, error) {
	l := Layout{GOOS: goos, UserService: userService}
	needHome := func() error {
		if d.Home == "" {
			return errors.New("a user service needs a home directory, and $HOME is not set")
		}
		return nil
	}
	switch {
	case goos == "linux" && !userService:
		l.ServiceName = unitName
		l.UnitPath = "/etc/systemd/system/" + unitName + ".service"
		l.ConfigPath = "/etc/" + unitName + "/config.toml"
		// The unit's StateDirectory= creates this, owned by the service user.
		l.StateDir = "/var/lib/" + unitName
	case goos == "linux":
		if err := needHome(); err != nil {
			return l, err
		}
		l.ServiceName = unitName
		// kardianos writes user units here whatever $XDG_CONFIG_HOME says.
		l.UnitPath = filepath.Join(d.Home, ".config/systemd/user", unitName+".service")
		configHome := d.XDGConfigHome
		if configHome == "" {
			configHome = filepath.Join(d.Home, ".config")
		}
		stateHome := d.XDGStateHome
		if stateHome == "" {
			stateHome = filepath.Join(d.Home, ".local/state")
		}
		l.ConfigPath = filepath.Join(configHome, unitName, "config.toml")
		l.StateDir = filepath.Join(stateHome, unitName)
	case goos == "darwin" && !userService:
		l.ServiceName = launchdLabel
		l.UnitPath = "/Library/LaunchDaemons/" + launchdLabel + ".plist"
		l.ConfigPath = "/Library/Application Support/" + unitName + "/config.toml"
		// A directory of its own inside the config's: the service account
		// owns it, while the config directory stays root's.
		l.StateDir = "/Library/Application Support/" + unitName + "/state"
		l.LogDir = "/Library/Logs/" + unitName
	case goos == "darwin":
		if err := needHome(); err != nil {
			return l, err
		}
		l.ServiceName = launchdLabel
		l.UnitPath = filepath.Join(d.Home, "Library/LaunchAgents", launchdLabel+".plist")
		l.ConfigPath = filepath.Join(d.Home, "Library/Application Support", unitName, "config.toml")
		l.StateDir = filepath.Join(d.Home, "Library/Application Support", unitName)
		l.LogDir = filepath.Join(d.Home, "Library/Logs", unitName)
	default:
		return l, fmt.Errorf("%w (this is %s)", errUnsupportedOS, goos)
	}
	return l, nil
}
