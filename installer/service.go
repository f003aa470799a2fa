package installer

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kardianos/service"
)

// State is what the service manager says about the worker's service.
type State int

const (
	NotInstalled State = iota
	Stopped
	Running
)

func (s State) String() string {
	switch s {
	case Running:
		return "running"
	case Stopped:
		return "stopped"
	}
	return "not installed"
}

// manager drives the OS service manager for one Layout through
// kardianos/service, which knows the systemctl and launchctl verbs and the
// per-user variants. We hand it a finished service file (see unit.go and
// plist.go) as its template: text without {{ }} actions passes through its
// template engine unchanged, so the golden files are exactly what lands on
// disk, and the values in it are escaped for systemd and XML here, where
// tests can see them.
type manager struct {
	layout Layout
	svc    service.Service
}

// program satisfies kardianos' Interface; the worker itself never runs
// through kardianos (the unit runs `fluksio-worker run`).
type program struct{}

func (program) Start(service.Service) error { return nil }
func (program) Stop(service.Service) error  { return nil }

// supportedSystems are the kardianos backends this installer writes files for.
var supportedSystems = map[string]string{"linux": "linux-systemd", "darwin": "darwin-launchd"}

// newManager returns the manager for l. serviceFile is the rendered unit or
// plist; only install needs it.
func newManager(l Layout, serviceFile string) (*manager, error) {
	if err := checkServiceManager(l); err != nil {
		return nil, err
	}
	cfg := &service.Config{
		Name:        l.ServiceName,
		DisplayName: "Fluksio worker",
		Description: "Fluksio worker: runs pipeline nodes for a Fluksio engine",
		Option: service.KeyValue{
			"UserService":   l.UserService,
			"SystemdScript": serviceFile,
			"LaunchdConfig": serviceFile,
		},
	}
	svc, err := service.New(program{}, cfg)
	if err != nil {
		return nil, err
	}
	return &manager{layout: l, svc: svc}, nil
}

// checkServiceManager says whether this machine runs the service manager
// the layout is for (kardianos detects it: on Linux, systemd as init).
func checkServiceManager(l Layout) error {
	system := service.ChosenSystem()
	if system != nil && system.String() == supportedSystems[l.GOOS] {
		return nil
	}
	found := "not one kardianos/service knows"
	if system != nil {
		found = system.String()
	}
	return fmt.Errorf("this machine's service manager is %s; %w", found, errUnsupportedOS)
}

// installed says whether the unit file or plist is in place.
func (m *manager) installed() bool {
	_, err := os.Stat(m.layout.UnitPath)
	return err == nil
}

// Install writes the service file and enables it (systemd) or puts it in
// place for loading (launchd). kardianos refuses to install over an existing
// file, and install must update, so an existing one is removed first; a
// running systemd service keeps running through that, on the old settings,
// until the caller restarts it. On launchd the removal unloads (stops) it.
func (m *manager) Install() error {
	if m.installed() {
		if err := m.svc.Uninstall(); err != nil {
			return m.explain("replacing the installed service", err)
		}
	}
	if err := m.svc.Install(); err != nil {
		return m.explain("installing the service", err)
	}
	return nil
}

// Uninstall disables and removes the service file; the caller stops first.
func (m *manager) Uninstall() error {
	if err := m.svc.Uninstall(); err != nil {
		return m.explain("removing the service", err)
	}
	return nil
}

// Start starts the service; on launchd this loads the job.
func (m *manager) Start() error { return m.explain("starting the service", m.svc.Start()) }

// Stop stops the service; on launchd this unloads the job until the next
// start (or boot, for a LaunchDaemon).
func (m *manager) Stop() error { return m.explain("stopping the service", m.svc.Stop()) }

// Restart stops and starts it; systemd also starts a stopped unit this way.
func (m *manager) Restart() error { return m.explain("restarting the service", m.svc.Restart()) }

// State asks the service manager.
func (m *manager) State() (State, error) {
	if !m.installed() {
		return NotInstalled, nil
	}
	st, err := m.svc.Status()
	switch {
	case errors.Is(err, service.ErrNotInstalled):
		// The file is there but the manager has not read it (say, no
		// daemon-reload since it was copied in): installed, not running.
		return Stopped, nil
	case err != nil && strings.Contains(err.Error(), "failed state"):
		// systemd's "failed": it exited with an error and is not restarting.
		return Stopped, nil
	case err != nil:
		return Stopped, m.explain("asking the service manager", err)
	case st == service.StatusRunning:
		return Running, nil
	}
	return Stopped, nil
}

// explain adds what a person can do to a service manager's error. The
// kardianos errors carry only the exit status of systemctl or launchctl.
func (m *manager) explain(doing string, err error) error {
	if err == nil {
		return nil
	}
	l := m.layout
	hint := ""
	switch {
	case l.GOOS == "linux" && l.UserService:
		hint = "; is your systemd user instance running ('systemctl --user status')? Over ssh or 'sudo -u' there may be none: log in as that user, or run 'sudo loginctl enable-linger " + currentAccount().Name + "'"
	case l.GOOS == "linux":
		hint = "; see 'systemctl status " + unitName + "' and '" + l.LogHint() + "'"
	case l.GOOS == "darwin":
		hint = "; see 'launchctl print " + launchdTarget(l) + "' and " + l.LogHint()
	}
	return fmt.Errorf("%s (%s): %w%s", doing, l.Kind(), err, hint)
}

// launchdTarget is the launchctl service target: system/LABEL for a daemon,
// gui/UID/LABEL for an agent.
func launchdTarget(l Layout) string {
	if l.UserService {
		return fmt.Sprintf("gui/%d/%s", os.Getuid(), l.ServiceName)
	}
	return "system/" + l.ServiceName
}
