package installer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/fluksio-worker/agent"
	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/hook"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/platform"
)

// InstallCommand is `fluksio-worker install`: write the config, install or
// update the service, start it and show whether it attached.
func InstallCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return install(ctx, thisHost(), args, stdout, stderr)
}

// installRequest is install's command line.
type installRequest struct {
	given       map[string]string // worker options given, by name
	order       []string          // their names in the order given
	user        string
	userService bool
	noStart     bool
	check       bool
	refreshUnit bool
}

// installHelp replaces the `run` help of the options that do more at
// install; the others read as in `run --help`.
var installHelp = map[string]string{
	"url":        "the engine's address; its web address (https://engine.example.com) is enough, the worker endpoint path /api/v1/workers/attach is added",
	"token":      "the worker token the engine issued; '-' reads it from standard input, which keeps it out of shell history and the process list",
	"token-file": "read the token from this file now (first line); it is copied into the protected config, so the file need not stay",
	"python":     "the Python node code runs on (default: python3 on PATH); resolved now to an absolute path and checked to run as the service account",
	"state-dir":  "where the worker keeps its status file and runner cache (default: /var/lib/fluksio-worker for the system service, ~/.local/state/fluksio-worker for a user service; on macOS under Application Support)",
}

// engineCheckTimeout bounds the hello install sends before installing.
const engineCheckTimeout = 30 * time.Second

// attachWait is how long install waits to see the started worker attach.
const attachWait = 20 * time.Second

// installCommand is install's command line, read into req.
func installCommand(req *installRequest) *config.Command {
	req.given = map[string]string{}
	cmd := config.NewCommand("install", writeInstallUsage)
	for _, o := range config.Options {
		name := o.Name
		cmd.Func(name, "", func(v string) error {
			prev, seen := req.given[name]
			if !seen {
				req.order = append(req.order, name)
			} else if config.Repeatable(name) {
				v = prev + "," + v // --trust-key a --trust-key b trusts both
			}
			req.given[name] = v
			return nil
		})
	}
	cmd.StringVar(&req.user, "user", "", "")
	cmd.BoolVar(&req.userService, "user-service", false, "")
	cmd.BoolVar(&req.noStart, "no-start", false, "")
	cmd.BoolVar(&req.check, "check", true, "")
	cmd.BoolVar(&req.refreshUnit, "refresh-unit", false, "")
	return cmd
}

// validate refuses what the flags parse but install cannot do.
func (req installRequest) validate() error {
	_, token := req.given["token"]
	_, tokenFile := req.given["token-file"]
	switch {
	case req.user != "" && req.userService:
		return errors.New("--user and --user-service do not go together: a user service runs as you")
	case token && tokenFile:
		return errors.New("give the token once: --token or --token-file, not both")
	case req.refreshUnit && len(req.given) > 0:
		return errors.New("--refresh-unit only rewrites the service file from this binary; change settings with a plain install")
	}
	// Every value is checked here, before install asks the service manager
	// or anything else, so a bad option is reported on any machine.
	for _, name := range req.order {
		v := req.given[name]
		var err error
		switch name {
		case "token", "token-file":
			continue // read, and checked, when install reads the token
		case "url":
			_, _, err = completeURL(v)
		default:
			o, _ := config.OptionByName(name)
			if err = o.Check(v); err != nil {
				err = fmt.Errorf("--%s %q: %w", name, v, err)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func install(ctx context.Context, h host, args []string, stdout, stderr io.Writer) int {
	var req installRequest
	cmd := installCommand(&req)
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	if err := req.validate(); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "fluksio-worker install: %v\n", err)
		var usage *config.UsageError
		if errors.As(err, &usage) {
			return config.ExitUsage
		}
		return config.ExitFailed
	}
	l, err := h.layout(req.userService)
	if err != nil {
		return fail(err)
	}
	if err := h.needRoot(l, "installing"); err != nil {
		return fail(fmt.Errorf("%w (or add --user-service to install it for your user alone)", err))
	}
	if l.UserService && h.root() {
		if h.Getenv("SUDO_USER") != "" {
			return fail(errors.New("--user-service installs for the user who runs it, and that is root here: run it without sudo"))
		}
		return fail(errors.New("--user-service installs for the user who runs it, and that is root here: run it as the user the worker is for (log in as them, or: su - NAME -c 'fluksio-worker install --user-service ...'), or install a system service without --user-service"))
	}
	if req.refreshUnit {
		return refreshUnit(ctx, h, l, stdout, stderr)
	}
	if err := checkServiceManager(l); err != nil {
		return fail(err)
	}
	p, err := planInstall(ctx, h, l, req, stdout, stderr)
	if err != nil {
		return fail(err)
	}
	done, err := p.write(stdout, stderr)
	if err != nil {
		return fail(err)
	}
	if req.noStart {
		switch {
		case done.before == Running && l.GOOS == "linux":
			fmt.Fprintln(stdout, "Not restarted (--no-start): the running worker keeps its old settings until 'fluksio-worker reload' (or restart).")
		default:
			fmt.Fprintln(stdout, "Not started (--no-start). Start it with: fluksio-worker start"+userServiceArg(l))
		}
		return config.ExitOK
	}
	if err := done.start(ctx, stdout, stderr); err != nil {
		if errors.Is(err, errNotRunning) {
			return config.ExitFailed
		}
		return fail(err)
	}
	return config.ExitOK
}

// installPlan is what install writes, once everything that can fail for
// a reason the user can fix has been checked.
type installPlan struct {
	l      Layout
	values map[string]any
	cfg    config.Config
	exe    string
	acct   account
}

// planInstall checks everything that can fail for a reason the user can
// fix before anything is written, and says the warnings; its one change
// to the system is the service account, which the last check needs.
func planInstall(ctx context.Context, h host, l Layout, req installRequest, stdout, stderr io.Writer) (*installPlan, error) {
	values, warnings, err := installSettings(ctx, h, l, req)
	if err != nil {
		return nil, err
	}
	if tok := req.given["token"]; tok != "" && tok != "-" {
		warnings = append(warnings, "a token on the command line is visible to other users while install runs and stays in your shell history; next time use --token - (stdin) or --token-file")
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "fluksio-worker install: warning: %s\n", w)
	}
	cfg, err := loadConfig(values)
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings {
		if !slices.Contains(warnings, w) { // the URL's was said above
			fmt.Fprintf(stderr, "fluksio-worker install: warning: %s\n", w)
		}
	}
	exe, err := executable(h)
	if err != nil {
		return nil, err
	}
	if err := checkLocations(l, exe, cfg); err != nil {
		return nil, err
	}
	if req.check {
		if err := checkEngine(ctx, cfg, stdout, stderr); err != nil {
			return nil, err
		}
	}
	// The first change to the system: the service account, which the
	// last check needs.
	acct := currentAccount()
	if !l.UserService {
		// An update keeps the account the service already runs as.
		name := req.user
		if old, err := os.ReadFile(l.UnitPath); err == nil && name == "" {
			name = unitAccount(string(old))
		}
		if acct, err = serviceAccount(ctx, h, name, stdout); err != nil {
			return nil, err
		}
	}
	if err := checkReachable(ctx, h, l, acct, exe, cfg); err != nil {
		if !l.UserService {
			err = fmt.Errorf("%w\nNothing was installed; the account %s is kept for the next install", err, acct.Name)
		}
		return nil, err
	}
	if bind := homeCacheBind(l, acct, values); bind != "" {
		values["sandbox-bind"] = withBind(values["sandbox-bind"], bind)
		if cfg, err = loadConfig(values); err != nil {
			return nil, err
		}
		fmt.Fprintf(stdout, "Calls may write %s's caches in %s (sandbox-bind in the config); the rest of the home is read-only to them.\n", acct.Name, strings.TrimSuffix(bind, ":rw"))
	}
	return &installPlan{l: l, values: values, cfg: cfg, exe: exe, acct: acct}, nil
}

// personsHome is acct's home where it is a person's (under /home, or
// root's), which the service may write (the unit's ReadWritePaths); ""
// for a service account's.
func personsHome(acct account) string {
	if acct.Home == "/root" || strings.HasPrefix(acct.Home, "/home/") {
		return acct.Home
	}
	return ""
}

// homeCacheBind is the --sandbox-bind that keeps a person's caches
// (~/.cache: Hugging Face's, torch's, pip's) writable to the calls of a
// service running as that person, as they were before calls had a
// sandbox (which shows the rest of the system read-only); "" where the
// service runs as an account of its own, where the sandbox is off, or
// where the config already shows it.
func homeCacheBind(l Layout, acct account, values map[string]any) string {
	home := personsHome(acct)
	if home == "" || l.GOOS != "linux" || values["sandbox"] == "off" {
		return ""
	}
	cache := filepath.Join(home, ".cache")
	var given []string
	switch v := values["sandbox-bind"].(type) {
	case string:
		given = config.SplitLabels(v)
	case []string:
		given = v
	case []any:
		for _, b := range v {
			given = append(given, fmt.Sprint(b))
		}
	}
	for _, b := range given {
		if p, _, _ := strings.Cut(b, ":"); p == cache || p == home {
			return ""
		}
	}
	return cache + ":rw"
}

// withBind adds bind to a sandbox-bind value as install keeps it: the
// command line's text, or a config file's list.
func withBind(old any, bind string) any {
	switch v := old.(type) {
	case nil:
		return bind
	case []any:
		return append(v, bind)
	case []string:
		return append(v, bind)
	}
	return fmt.Sprint(old) + "," + bind
}

// installed is the service install wrote: its manager, whether it ran
// before, and whether new settings reach it by a reload.
type installed struct {
	l      Layout
	cfg    config.Config
	m      *manager
	before State
	reload bool
}

// write writes the config file, the directories and the service file.
func (p *installPlan) write(stdout, stderr io.Writer) (*installed, error) {
	l, acct := p.l, p.acct
	data, err := encodeConfig(p.values)
	if err != nil {
		return nil, err
	}
	text, err := renderServiceFile(l, p.exe, acct, p.cfg)
	if err != nil {
		return nil, err
	}
	m, err := newManager(l, text)
	if err != nil {
		return nil, err
	}

	fileOwner, dirMode := platform.KeepOwner, userConfigDirMode
	if !l.UserService {
		fileOwner, dirMode = acct.owner(), systemConfigDirMode
	}
	if err := writeConfig(l.ConfigPath, data, fileOwner, dirMode); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "Wrote %s (mode 0600, readable by %s only).\n", l.ConfigPath, acct.Name)
	if err := prepareDirs(l, acct, p.cfg.StateDir, p.cfg.SandboxBinds); err != nil {
		return nil, err
	}
	before, _ := m.State()
	oldUnit, _ := os.ReadFile(l.UnitPath)
	// A running systemd service takes new settings by a reload, which lets
	// its calls finish; launchd's install above unloaded the job already.
	reload := before == Running && l.GOOS == "linux" && reloadApplies(string(oldUnit), text)
	if err := m.Install(); err != nil {
		return nil, err
	}
	runsAs := ""
	if !l.UserService {
		runsAs = ", runs as " + acct.Name
	}
	fmt.Fprintf(stdout, "Installed %s (%s%s, starts %s).\n", l.UnitPath, l.Kind(), runsAs, startsWhen(l))
	if l.GOOS == "linux" && l.UserService {
		warnWithoutLinger(acct, stderr)
	}
	return &installed{l: l, cfg: p.cfg, m: m, before: before, reload: reload}, nil
}

// errNotRunning: the service was installed but is not running; start said
// so already.
var errNotRunning = errors.New("the service is installed but not running")

// start starts the installed service (reloads or restarts one that ran)
// and says how it is once it attached, or once attachWait ran out.
func (s *installed) start(ctx context.Context, stdout, stderr io.Writer) error {
	l, m := s.l, s.m
	started := time.Now()
	var err error
	// systemd's restart also starts a stopped unit; Install left a launchd
	// job unloaded, so there it is a start.
	switch {
	case s.reload:
		fmt.Fprintln(stdout, "Reloading the running worker: its running calls finish first, then it takes the new settings.")
		err = m.Reload()
	case l.GOOS == "darwin":
		err = m.Start()
	default:
		if s.before == Running {
			fmt.Fprintln(stdout, "Restarting the running worker (its service definition changed, which only a restart applies): running calls are stopped.")
		}
		err = m.Restart()
	}
	if err != nil {
		return err
	}
	state, st, stErr := waitAttached(ctx, m, s.cfg.StateDir, started, attachWait)
	fmt.Fprintln(stdout)
	writeStatus(stdout, l, state, st, stErr)
	switch {
	case s.reload && stErr == nil && st.State == status.StateReloading:
		fmt.Fprintf(stdout, "\nThe worker reloads once its running calls finish; watch 'fluksio-worker status%s'.\n", userServiceArg(l))
	case state != Running:
		fmt.Fprintf(stderr, "fluksio-worker install: the service is installed but not running; see %s\n", l.LogHint())
		return errNotRunning
	case stErr != nil || st.State != status.StateAttached:
		fmt.Fprintf(stderr, "fluksio-worker install: the service runs but has not attached yet; watch 'fluksio-worker status%s' and %s\n", userServiceArg(l), l.LogHint())
	}
	return nil
}

// installSettings builds the config's keys: those of the existing config,
// overridden by the options given. The token is read now (from stdin for
// --token -, or from --token-file) and stored as token; Python is resolved
// to an absolute path; state-dir is set, so `status` knows where to look.
func installSettings(ctx context.Context, h host, l Layout, req installRequest) (values map[string]any, warnings []string, err error) {
	values, err = readConfig(l.ConfigPath)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range req.order {
		v := req.given[name]
		switch name {
		case "url":
			endpoint, warning, err := completeURL(v)
			if err != nil {
				return nil, nil, &config.UsageError{Err: err}
			}
			if warning != "" {
				warnings = append(warnings, warning)
			}
			values["url"] = endpoint
		case "token", "token-file":
			tok, err := readToken(h, name, v)
			if err != nil {
				return nil, nil, err
			}
			// The config keeps the token itself: a token file the service
			// account cannot read, or that is deleted later, would stop it.
			values["token"] = tok
			delete(values, "token-file")
		case "state-dir", "ca-file", "trust-key", "pre-call-hook", "post-call-hook":
			// The service starts elsewhere, and the config would read a
			// relative path against its own directory: keep the one meant.
			abs, err := absolutePaths(name, v)
			if err != nil {
				return nil, nil, &config.UsageError{Err: fmt.Errorf("--%s %s: %w", name, v, err)}
			}
			values[name] = flagValue(name, abs)
		default:
			values[name] = flagValue(name, v)
		}
	}
	if _, ok := values["url"]; !ok {
		return nil, nil, &config.UsageError{Err: errors.New("--url is required: the engine's address, e.g. --url https://engine.example.com")}
	}
	_, hasToken := values["token"]
	_, hasTokenFile := values["token-file"]
	if !hasToken && !hasTokenFile {
		return nil, nil, &config.UsageError{Err: errors.New("a token is required: --token - (paste it, or pipe it in), --token-file PATH, or --token TOKEN")}
	}
	python, _ := values["python"].(string)
	path, _, err := platform.FindPython(ctx, python)
	if err != nil {
		return nil, nil, err
	}
	values["python"] = path
	if _, ok := values["state-dir"]; !ok {
		values["state-dir"] = l.StateDir
	}
	return values, warnings, nil
}

// absolutePaths is an option's value with its paths made absolute against
// the working directory: each of --trust-key's, a hook's program
// (hook.ResolveProgram), or the one path of the others.
func absolutePaths(name, v string) (string, error) {
	switch name {
	case "pre-call-hook", "post-call-hook":
		return hook.ResolveProgram(v, ".")
	case "trust-key":
		paths := config.SplitLabels(v)
		for i, p := range paths {
			abs, err := filepath.Abs(p)
			if err != nil {
				return "", err
			}
			paths[i] = abs
		}
		return strings.Join(paths, ","), nil
	}
	return filepath.Abs(v)
}

// readToken reads --token (from stdin when "-") or --token-file.
func readToken(h host, flagName, v string) (string, error) {
	switch {
	case flagName == "token-file":
		return config.ReadTokenFile(v)
	case v == "-":
		return config.ReadTokenFrom(h.Stdin)
	case v == "":
		return "", &config.UsageError{Err: errors.New("--token is empty")}
	}
	return v, nil
}

// executable is the fluksio-worker binary the service will run, with
// symlinks resolved so an upgrade that moves the link target still works
// the way the package manager expects.
func executable(h host) (string, error) {
	exe, err := h.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err == nil {
		exe, err = filepath.Abs(exe)
	}
	if err != nil {
		return "", fmt.Errorf("cannot tell where this fluksio-worker binary is: %w", err)
	}
	return exe, nil
}

// checkEngine says hello to the engine with the config about to be
// installed. What the service would give up on at once stops the install:
// a refusal (it would exit 1), and a URL that can never work, wss:// to a
// server without TLS or ws:// to one with it (it would exit 2; the error
// says the URL to use). An engine that cannot be reached now may be down
// for a moment, and the service keeps trying, so that is a warning.
func checkEngine(ctx context.Context, cfg config.Config, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, engineCheckTimeout)
	defer cancel()
	err := agent.CheckAttach(ctx, cfg)
	var refused *protocol.RefusedError
	var usage *config.UsageError
	switch {
	case errors.As(err, &refused):
		return fmt.Errorf("%w; nothing was installed (check the token, or skip this check with --check=false)", refused)
	case errors.As(err, &usage):
		return &config.UsageError{Err: fmt.Errorf("%w; nothing was installed (the service would stop at its first attempt with this --url)", err)}
	case err != nil:
		fmt.Fprintf(stderr, "fluksio-worker install: warning: could not reach the engine at %s: %v; installing anyway, the service keeps trying\n", logging.ShownURL(cfg.URL), err)
	default:
		fmt.Fprintf(stdout, "The engine at %s accepts this worker.\n", logging.ShownURL(cfg.URL))
	}
	return nil
}

// renderServiceFile renders the unit or plist for this install.
func renderServiceFile(l Layout, exe string, acct account, cfg config.Config) (string, error) {
	p := serviceParams{Executable: exe, ConfigPath: l.ConfigPath, CancelGrace: cfg.CancelGrace}
	if !l.UserService {
		p.Account = acct.Name
		p.WritableHome = personsHome(acct)
	}
	if l.GOOS == "darwin" {
		return renderPlist(p, l.LogDir)
	}
	return renderUnit(p, l.UserService)
}

// prepareDirs makes the directories the service writes to and no one
// creates for it: systemd's StateDirectory= does it for a system unit, but
// launchd has no such thing, and a user unit's state lives under
// $XDG_STATE_HOME, which may not exist yet.
func prepareDirs(l Layout, acct account, stateDir string, binds []string) error {
	if err := prepareBinds(acct, binds); err != nil {
		return err
	}
	if l.GOOS == "linux" && !l.UserService {
		return nil
	}
	dirs := []string{stateDir}
	if l.LogDir != "" {
		dirs = append(dirs, l.LogDir)
	}
	for _, dir := range dirs {
		// The state directory holds the runner script every call runs, so
		// it is the service account's alone (the worker refuses one that
		// others may write); the log directory may be read by its group.
		mode := os.FileMode(0o750)
		if dir == stateDir {
			mode = 0o700
		}
		if err := os.MkdirAll(dir, mode); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
		if !l.UserService {
			if err := os.Chown(dir, acct.UID, acct.GID); err != nil {
				return fmt.Errorf("handing %s to %s: %w", dir, acct.Name, err)
			}
		}
	}
	return nil
}

// prepareBinds makes the cache directory homeCacheBind shows, if the
// person has none yet, as theirs (0700): a path shown to a sandbox must
// be there when a call starts.
func prepareBinds(acct account, binds []string) error {
	home := personsHome(acct)
	for _, b := range binds {
		p, _, _ := strings.Cut(b, ":")
		if home == "" || p != filepath.Join(home, ".cache") {
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Mkdir(p, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", p, err)
		}
		if os.Geteuid() == 0 {
			if err := os.Chown(p, acct.UID, acct.GID); err != nil {
				return fmt.Errorf("handing %s to %s: %w", p, acct.Name, err)
			}
		}
	}
	return nil
}

func startsWhen(l Layout) string {
	if l.UserService {
		return "when you log in"
	}
	return "at boot"
}

// userServiceArg is what to add to a suggested command for a user service.
func userServiceArg(l Layout) string {
	if l.UserService {
		return " --user-service"
	}
	return ""
}

// warnWithoutLinger says that a systemd user service stops at logout unless
// the user lingers.
func warnWithoutLinger(acct account, stderr io.Writer) {
	if acct.Name == "" || exists(filepath.Join("/var/lib/systemd/linger", acct.Name)) {
		return
	}
	fmt.Fprintf(stderr, "fluksio-worker install: note: a user service stops when you log out; to keep it running (and start it at boot) run: sudo loginctl enable-linger %s\n", acct.Name)
}

func writeInstallUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: sudo fluksio-worker install --url URL --token - [options]
       fluksio-worker install --user-service --url URL --token - [options]

Sets this machine up as a Fluksio worker that runs in the background and
starts at boot. A worker connects out to a Fluksio engine (the server that
schedules a pipeline's nodes), tells it what this machine has, and runs the
nodes it is sent in Python here. Nothing needs to connect in.

install:
  1. checks the engine accepts the token (a hello, then it hangs up);
  2. writes the settings to a config file only the service can read
     (Linux: /etc/fluksio-worker/config.toml);
  3. installs a service that runs 'fluksio-worker run --config FILE' as an
     unprivileged account (systemd on Linux, launchd on macOS), enables it
     and starts it;
  4. waits a little and shows whether the worker attached.

Run it again to change settings: options you give replace those in the
config, the others are kept, and a running service reloads with them: it
lets its running calls finish first (see 'fluksio-worker reload --help').

Examples:
  # paste the token when asked, so it stays out of your shell history:
  sudo fluksio-worker install --url https://engine.example.com \
      --token - --labels gpu
  # or from a file:
  sudo fluksio-worker install --url https://engine.example.com \
      --token-file /root/worker-token
  # for yourself only, without root (systemd --user or a LaunchAgent):
  fluksio-worker install --user-service --url https://engine.example.com \
      --token -

Service options:
`)
	config.WriteOption(w, "--user NAME", "the account the service runs as. Default: the one it already runs as; for a first install on Linux, the system account fluksio-worker, created if missing and added to the video and render groups so it can use the GPUs; on macOS, the account that ran sudo.")
	config.WriteOption(w, "--user-service", "install for the current user only, without root: a systemd user unit (Linux) or a LaunchAgent (macOS), with its config in your home directory (~/.config/fluksio-worker on Linux).")
	config.WriteOption(w, "--no-start", "write the config and the service, but do not start or restart it.")
	config.WriteOption(w, "--check=false", "do not ask the engine first. By default an engine that refuses the token, or a URL that can never work (wss:// to a server without TLS, ws:// to one with it), stops the install, and an engine that cannot be reached is only a warning.")
	config.WriteOption(w, "--refresh-unit", "only rewrite the service file from this binary (package upgrades run this); the config is left alone.")
	fmt.Fprint(w, `
Worker options (written to the config; as in 'fluksio-worker run --help'):
`)
	for _, o := range config.Options {
		help := o.HelpWithDefault()
		if h, ok := installHelp[o.Name]; ok {
			help = h
		}
		config.WriteOption(w, "--"+o.Name+" "+o.Arg, help)
	}
	fmt.Fprint(w, `
Afterwards: 'fluksio-worker status' shows what the worker is doing,
'fluksio-worker check' diagnoses one that does not attach, and
'fluksio-worker uninstall' removes it. Exit status: 0 installed (and started),
1 failed, 2 bad options.
`)
}
