package config

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/fluksio/fluksio-worker/agent/hook"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/policy"
	"github.com/fluksio/fluksio-worker/platform"
)

// Config is everything `run` needs, wherever it came from. The installer
// writes the same keys to the TOML file that `run --config` reads, so both
// use the one option table below.
type Config struct {
	File        string // the config file read (absolute), if any: hidden from node code
	URL         string
	Token       string
	TokenFile   string
	Name        string
	Labels      []string
	Python      string // as given; "" means the python3 on PATH
	Parallel    int
	ArtifactURL string
	CPUs        int  // 0: detect
	GPUs        *int // nil: detect; 0 is a real answer
	RAMMB       int  // 0: detect
	MaxIdle     time.Duration
	Runtime     string // auto, embedded or a path
	CancelGrace time.Duration
	Containment string // auto ("" too), cgroup or subreaper (see runner.SetupContainment)
	// Sandbox: auto ("" too), on or off (runner.SetupSandbox); SandboxBinds
	// are the paths shown to node code beyond the system, "PATH" read-only
	// or "PATH:rw".
	Sandbox      string
	SandboxBinds []string
	// ReloadTimeout bounds how long a reload waits for running calls; 0
	// waits as long as they run.
	ReloadTimeout time.Duration
	MaxLine       int64
	LogFormat     string
	LogLevel      string
	NodeLogLevel  string // info ("" too), debug or off: a node's stderr lines (runner.NodeLog)
	StateDir      string
	CAFile        string        // extra trusted authorities, PEM; "" for the system's
	MaxCalls      int           // 0: no limit
	Listen        string        // host:port of /metrics, /healthz and /livez; "": off
	HealthGrace   time.Duration // how long /healthz stays 200 after a lost connection
	OutageGrace   time.Duration // how long calls are held through an outage (resume extension); 0: never
	Warm          *int          // spare runners in all; nil: as many as Parallel (--warm)
	Preload       []string      // modules spare runners import before they wait

	// The machine owner's code policy (agent/policy) and call hooks.
	AllowModule  []string      // module patterns a module node may name; empty: any
	AllowSource  string        // none, signed or any ("" too): shipped source
	TrustKeys    []string      // public key files or directories signed source may be signed with
	AllowEnv     []string      // patterns of the env names a call may set under a code policy, besides policy.Tuning
	PreCallHook  string        // a shell command that accepts or declines each call; "": none
	PostCallHook string        // a shell command told each call's outcome; "": none
	HookTimeout  time.Duration // how long a hook may run; 0: DefaultHookTimeout

	// Per-call limits, set on each call's cgroup; 0: none.
	CallMemoryMax int64   // bytes
	CallPidsMax   int     // processes and threads
	CallCPUMax    float64 // CPUs
	// MinFreeDisk: with less free where calls write, new calls are
	// declined; 0: never.
	MinFreeDisk int64
	// HeldDiskMax bounds the spill files of all held calls together
	// (resume extension); past it, held calls are paused.
	HeldDiskMax int64
	// ArtifactCacheMax bounds the artifact cache, in bytes, when
	// ArtifactCachePercent is 0; ArtifactCachePercent (1-100) bounds it to
	// that share of the file system it is on.
	ArtifactCacheMax     int64
	ArtifactCachePercent int
	// Policy is the code policy these settings make, read (trusted keys
	// and all) by Resolve; nil before, and nil is no policy.
	Policy *policy.Policy

	// Warnings are things worth telling the user that do not stop the
	// worker (a token file others can read); run logs them once it has a
	// logger, check and install print them.
	Warnings []string
}

// Defaults the command line documents.
const (
	DefaultParallel    = 1
	DefaultCancelGrace = 3 * time.Second
	// DefaultMaxLine bounds one runner line (an event or the answer). Answers
	// of tens of MiB are normal; hundreds are a node that should have saved an
	// artifact, and unbounded would let one node exhaust the machine.
	DefaultMaxLine = 256 << 20
	// DefaultHealthGrace covers an engine restart or an outage of up to
	// about a minute: reconnection waits up to 30 s (backoffMax) between
	// tries, so the last worker of a fleet can come back 30 s after the
	// engine did. Measured: 58 s from the drop until the last of 200
	// workers was attached again after a 30 s outage
	// (BenchmarkFleetReconnect), too close to the 60 s this used to be.
	DefaultHealthGrace = 90 * time.Second
	// DefaultOutageGrace is how long calls keep running through an outage
	// of an engine that accepted the resume extension: an engine restart or
	// a network cut of a few minutes, not a lost engine (whose calls another
	// worker should take over soon). The engine's own grace caps it.
	DefaultOutageGrace = 5 * time.Minute
	// maxOutageGrace: a day of output held for an engine that may never
	// come back is a disk filled, not a call saved.
	maxOutageGrace = 24 * time.Hour
)

// Limits on numbers, each beyond what a person can mean: a value past one is
// a typo or a unit mix-up, and is refused with the limit and its reason
// rather than accepted (or wrapped around) silently.
const (
	// maxParallel: each call is its own Python process; a thousand at once
	// is more than one machine runs usefully.
	maxParallel = 1024
	// maxCPUs and maxGPUs: more than any one machine has.
	maxCPUs = 1 << 16
	maxGPUs = 1024
	// maxRAMMB: 1 PiB of memory, more than any one machine has.
	maxRAMMB = 1 << 30
	// maxMaxIdle: a year; for a worker that never stops, leave it out.
	maxMaxIdle = 366 * 24 * time.Hour
	// maxCancelGrace: the service manager waits this long on every stop; a
	// node that needs longer to wind down should checkpoint as it goes.
	maxCancelGrace = time.Hour
	// maxMaxLine: a line is held in memory whole while it is read.
	maxMaxLine = 64 << 30
	// maxWarm: each spare is a waiting Python process; more than the
	// calls a machine can run at once only costs memory.
	maxWarm = maxParallel
	// maxHookTimeout: a pre-call hook holds its call (and the engine's
	// wait for it) this long; one that needs longer is not a check.
	maxHookTimeout = 10 * time.Minute
)

// DefaultHookTimeout bounds a call hook: enough for nvidia-smi on a busy
// machine (a second or two) or removing a large scratch directory, short
// enough that a hung hook delays a call by less than an engine waits for
// a worker's first heartbeat.
const DefaultHookTimeout = 10 * time.Second

// DefaultMinFreeDisk: below a GiB free, a call that writes a checkpoint,
// an artifact or held output may well fail half-way; declined, it runs on
// another worker.
const DefaultMinFreeDisk = 1 << 30

// DefaultHeldDiskMax bounds the held calls' spill files together: four
// times one call's own bound (1GiB), so that a few held calls fill it, not
// a state directory shared with the runtime cache.
const DefaultHeldDiskMax = 4 << 30

// DefaultArtifactCachePercent: the artifact cache may fill a quarter of
// its file system. A share rather than a size, so that it means something
// on a 30 GiB root disk and on a 4 TiB scratch disk alike; whatever the
// bound, the cache also gives way to --min-free-disk.
const DefaultArtifactCachePercent = 25

// maxCallPids: the kernel's own limit on pid numbers (PID_MAX_LIMIT).
const maxCallPids = 1 << 22

// EnvPrefix names every option's environment variable: --ram-mb is
// FLUKSIO_WORKER_RAM_MB.
const EnvPrefix = "FLUKSIO_WORKER_"

// Option is one setting: its flag and config key (the same name), its
// environment variable (derived), its help text and how a text value is
// applied. Declared once here, used by flags, env, TOML and the installer.
type Option struct {
	Name string
	Arg  string // placeholder in help, e.g. URL
	Help string
	set  func(c *Config, v string) error
}

// Env is the option's environment variable, "" for none. --gpus has none:
// FLUKSIO_WORKER_GPUS already means something else, a detected value that
// comes after SLURM_GPUS_ON_NODE (protocol section 1), so it cannot also be
// a setting that wins over everything.
func (o Option) Env() string {
	if o.Name == "gpus" {
		return ""
	}
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(o.Name, "-", "_"))
}

// Options is the table of every `run` setting, in help order.
var Options = []Option{
	{"url", "URL", "the engine's worker endpoint, e.g. wss://engine.example.com/api/v1/workers/attach; the engine's web address (https://engine.example.com) is completed to it",
		func(c *Config, v string) error { c.URL = v; return nil }},
	{"token", "TOKEN", "the worker token the engine issued, or - to read it from standard input (prefer --token-file, - or FLUKSIO_WORKER_TOKEN: a flag's value is visible to every user in the process list)",
		func(c *Config, v string) error { c.Token, c.TokenFile = v, ""; return nil }},
	{"token-file", "PATH", "read the token from this file (first line)",
		func(c *Config, v string) error { c.TokenFile, c.Token = v, ""; return nil }},
	{"name", "NAME", "the name this worker attaches as",
		func(c *Config, v string) error { c.Name = v; return nil }},
	{"labels", "A,B", "comma-separated labels the engine matches a node's device against, e.g. gpu,cuda12",
		func(c *Config, v string) error { c.Labels = SplitLabels(v); return nil }},
	{"python", "PATH", "the Python interpreter node code runs on",
		func(c *Config, v string) error { c.Python = v; return nil }},
	{"parallel", "K", "how many calls this worker offers to run at once",
		intInRange(func(c *Config, n int) { c.Parallel = n }, 1, maxParallel, "each call is its own Python process")},
	{"artifact-url", "URL", "where node code saves and loads artifacts",
		func(c *Config, v string) error { c.ArtifactURL = v; return nil }},
	{"cpus", "N", "CPUs to advertise",
		intInRange(func(c *Config, n int) { c.CPUs = n }, 1, maxCPUs, "more than a machine has")},
	{"gpus", "N", "GPUs to advertise; 0 means none",
		intInRange(func(c *Config, n int) { c.GPUs = &n }, 0, maxGPUs, "more than a machine has")},
	{"ram-mb", "MB", "memory in MiB to advertise",
		intInRange(func(c *Config, n int) { c.RAMMB = n }, 1, maxRAMMB, "1 PiB, more than a machine has")},
	{"max-idle", "DURATION", "exit 0 after this long with no call running, for batch jobs, e.g. 10m, 600 (seconds) or 7d; exit 4 if the worker never attached to the engine in that time",
		durationUpTo(func(c *Config, d time.Duration) { c.MaxIdle = d }, maxMaxIdle, "a year; for never, leave --max-idle out")},
	{"runtime", "auto|embedded|PATH", "the runner script: the engine's if it serves one (auto), the one built in (embedded), or a file",
		func(c *Config, v string) error { c.Runtime = v; return nil }},
	{"cancel-grace", "DURATION", "how long a cancelled call may clean up after SIGTERM (SIGKILL follows a second later)",
		durationUpTo(func(c *Config, d time.Duration) { c.CancelGrace = d }, maxCancelGrace, "every stop of the service waits this long")},
	{"containment", "auto|cgroup|subreaper", "how a call's processes are kept together so that all are stopped with it: a cgroup per call where the worker may write its cgroup (root, or systemd's Delegate=yes), else the subreaper and an environment cookie (auto)",
		oneOf(func(c *Config, v string) { c.Containment = v }, "auto", "cgroup", "subreaper")},
	{"sandbox", "auto|on|off", "whether each call runs in a sandbox of its own (Linux 5.12 and user namespaces): it sees its own directory and a private /tmp, /var/tmp and /dev/shm, reads the rest of the system, and cannot see the worker's state, config or token, another call, or signal the worker; auto: wherever the kernel allows; a worker with a code policy will not start without one unless this says off",
		oneOf(func(c *Config, v string) { c.Sandbox = v }, "auto", "on", "off")},
	{"sandbox-bind", "PATH[:rw],PATH", "paths a sandboxed call may reach beyond the system (read-only; :rw makes one writable): data sets, a shared cache; the flag may be repeated",
		func(c *Config, v string) error {
			for _, b := range SplitLabels(v) {
				p, mode, _ := strings.Cut(b, ":")
				if !filepath.IsAbs(p) || (mode != "" && mode != "rw" && mode != "ro") {
					return fmt.Errorf("%q: give an absolute path, optionally followed by :rw (writable) or :ro", b)
				}
				c.SandboxBinds = append(c.SandboxBinds, b)
			}
			return nil
		}},
	{"reload-timeout", "DURATION", "how long a reload (SIGHUP, 'systemctl reload', a package upgrade) waits for running calls before stopping them; 0 or forever waits as long as they run",
		func(c *Config, v string) error {
			if strings.EqualFold(strings.TrimSpace(v), "forever") {
				c.ReloadTimeout = 0
				return nil
			}
			return durationSetter(func(c *Config, d time.Duration) { c.ReloadTimeout = d })(c, v)
		}},
	{"max-line", "BYTES", "the largest line (event or answer) a call may send, e.g. 256MiB",
		func(c *Config, v string) error {
			n, err := ParseBytes(v)
			switch {
			case err != nil:
			case n < 1024:
				err = errors.New("must be at least 1KiB")
			case n > maxMaxLine:
				err = errors.New("must be at most 64GiB: a line is held in memory whole")
			}
			c.MaxLine = n
			return err
		}},
	{"log-format", "text|json", "how log lines are written to stderr",
		oneOf(func(c *Config, v string) { c.LogFormat = v }, "text", "json")},
	{"log-level", "LEVEL", "the worker's own messages shown: debug, info, warn or error (debug adds dial, hello and welcome with their timings)",
		oneOf(func(c *Config, v string) { c.LogLevel = v }, "debug", "info", "warn", "error")},
	{"node-log-level", "LEVEL", "what a node prints (print(), logging) is logged as a node output line, with its call_id, at info, at debug (shown only with --log-level debug), or off (not logged); so --log-level warn is not needed to quiet a chatty node",
		oneOf(func(c *Config, v string) { c.NodeLogLevel = v }, "info", "debug", "off")},
	{"state-dir", "DIR", "where the runtime cache and the status file live, private to this worker's user",
		func(c *Config, v string) error { c.StateDir = v; return nil }},
	{"ca-file", "PATH", "PEM file of certificate authorities to trust for the engine and the artifact store besides the system's, for an engine with its own CA (node processes get it through SSL_CERT_FILE)",
		func(c *Config, v string) error { c.CAFile = v; return nil }},
	{"max-calls", "N", "exit 0 once N calls have been answered: further calls are declined as in a drain",
		intSetter(func(c *Config, n int) { c.MaxCalls = n }, 0)},
	{"listen", "ADDR", "serve Prometheus /metrics, /healthz and /livez on this address, e.g. 127.0.0.1:9465; anyone who can reach it sees what the worker runs",
		func(c *Config, v string) error {
			if v != "" {
				if _, _, err := net.SplitHostPort(v); err != nil {
					return fmt.Errorf("expected host:port, e.g. 127.0.0.1:9465")
				}
			}
			c.Listen = v
			return nil
		}},
	{"health-grace", "DURATION", "how long /healthz stays healthy after the connection to the engine was lost",
		durationSetter(func(c *Config, d time.Duration) { c.HealthGrace = d })},
	{"outage-grace", "DURATION", "how long running calls keep running while the connection to the engine is lost, their output kept to be sent on reconnection; only with an engine that supports the resume extension, which may allow less; 0 stops them at once",
		durationUpTo(func(c *Config, d time.Duration) { c.OutageGrace = d }, maxOutageGrace, "held output fills the state directory")},
	{"warm", "N", "spare runners kept started (interpreter and runtime loaded, waiting) so a call does not wait for Python to start; each serves one call; 0 starts every runner cold",
		intInRange(func(c *Config, n int) { c.Warm = &n }, 0, maxWarm, "each spare is a waiting Python process")},
	{"preload", "MOD,MOD", "modules spare runners import before they wait, e.g. numpy,torch (embedded runtime only; CUDA is not initialized)",
		func(c *Config, v string) error { c.Preload = SplitLabels(v); return nil }},
	{"allow-module", "PATTERN,PATTERN", "the installed modules a module node may name: acme.train (that module), acme.* (every module under acme), * (any) or none; with it, a code policy is on, and under a code policy no module runs that it does not name",
		func(c *Config, v string) error { c.AllowModule = SplitLabels(v); return nil }},
	{"allow-source", "none|signed|any", "whether node source shipped with a call runs: never, only when signed by a --trust-key key (SIGNING.md), or always; none or signed puts a code policy on",
		oneOf(func(c *Config, v string) { c.AllowSource = v }, "none", "signed", "any")},
	{"trust-key", "PATH,PATH", "public keys (files 'fluksio-worker keygen' made, or directories of *.pub files) whose signatures --allow-source signed accepts, refused at start when a user other than root and the worker's may change them; the flag may be repeated",
		func(c *Config, v string) error { c.TrustKeys = append(c.TrustKeys, SplitLabels(v)...); return nil }},
	{"allow-env", "PATTERN,PATTERN", "under a code policy, the variables a call's env may set besides the built-in ones that only tune (thread counts, CUDA_VISIBLE_DEVICES, locale, TZ): names or patterns such as WANDB_*; any other is refused (PolicyRefused); the flag may be repeated",
		func(c *Config, v string) error { c.AllowEnv = append(c.AllowEnv, SplitLabels(v)...); return nil }},
	{"pre-call-hook", "CMD", "a shell command run in a call's slot before its runner starts (at most --parallel at once), the call's metadata as JSON on stdin: exit 0 takes the call, any other status declines it (NodeCancelled, its first stderr line the reason) so the engine runs it elsewhere",
		func(c *Config, v string) error { c.PreCallHook = v; return nil }},
	{"post-call-hook", "CMD", "a shell command run after a call's processes are gone, its outcome as JSON on stdin; its failure is logged, not the call's",
		func(c *Config, v string) error { c.PostCallHook = v; return nil }},
	{"hook-timeout", "DURATION", "how long a call hook may run before it is killed; a pre-call hook killed declines its call",
		durationUpTo(func(c *Config, d time.Duration) { c.HookTimeout = d }, maxHookTimeout, "a hook holds its call that long")},
	{"call-memory-max", "BYTES", "the memory (swap included) each call's processes may use together, e.g. 8GiB, set as its cgroup's memory limit: the kernel kills the call, not a neighbour or the worker, and its answer says it reached this limit; refused at start where the memory controller cannot be had",
		sizeAtLeast(func(c *Config, n int64) { c.CallMemoryMax = n }, 1<<20, "1MiB")},
	{"call-pids-max", "N", "the processes and threads each call may have at once (its cgroup's pids.max): a fork bomb stops there; refused at start where the pids controller cannot be had",
		intInRange(func(c *Config, n int) { c.CallPidsMax = n }, 1, maxCallPids, "the kernel's limit on pids")},
	{"call-cpu-max", "CPUS", "the CPU time each call may use, in CPUs, e.g. 2 or 0.5 (its cgroup's cpu.max); refused at start where the cpu controller cannot be had",
		func(c *Config, v string) error {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			switch {
			case err != nil || math.IsNaN(n):
				return errors.New("expected a number of CPUs, e.g. 2 or 0.5")
			case n < 0.01:
				return errors.New("must be at least 0.01")
			case n > maxCPUs:
				return fmt.Errorf("must be at most %d (more than a machine has)", maxCPUs)
			}
			c.CallCPUMax = n
			return nil
		}},
	{"min-free-disk", "BYTES", "new calls are declined (as in a drain, so the engine runs them elsewhere) and /healthz says why while less than this is free where calls write: the state directory (call directories, runtime cache, held output), once the artifact cache gave way (--artifact-cache-max); 0 never declines",
		sizeAtLeast(func(c *Config, n int64) { c.MinFreeDisk = n }, 0, "0")},
	{"held-disk-max", "BYTES", "how much held output (resume extension) all held calls together may spill to the state directory while the engine is unreachable; past it, held calls are paused until the engine takes their output",
		sizeAtLeast(func(c *Config, n int64) { c.HeldDiskMax = n }, 1<<20, "1MiB")},
	{"artifact-cache-max", "SIZE|PERCENT", "how much the artifacts node code loaded (load_artifact, cached in the state directory) may keep on disk: a size, e.g. 20GiB, or a share of the file system they are on, e.g. 25%; those used least recently are removed first, after each call and before a call would be declined for --min-free-disk, never one a running call loaded; 0 keeps only those of running calls",
		func(c *Config, v string) error {
			if pct, ok := strings.CutSuffix(strings.TrimSpace(v), "%"); ok {
				n, err := strconv.Atoi(strings.TrimSpace(pct))
				if err != nil || n < 0 || n > 100 {
					return errors.New("expected a share of the disk from 0% to 100%, or a size, e.g. 20GiB")
				}
				c.ArtifactCacheMax, c.ArtifactCachePercent = 0, n
				return nil
			}
			n, err := ParseBytes(v)
			if err != nil {
				return fmt.Errorf("%w; or a share of the disk, e.g. 25%%", err)
			}
			c.ArtifactCacheMax, c.ArtifactCachePercent = n, 0
			return nil
		}},
}

// sizeAtLeast accepts a size (ParseBytes) of at least minimum, which
// least says.
func sizeAtLeast(apply func(*Config, int64), minimum int64, least string) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := ParseBytes(v)
		if err != nil {
			return err
		}
		if n < minimum {
			return fmt.Errorf("must be at least %s", least)
		}
		apply(c, n)
		return nil
	}
}

// Repeatable says whether the option's flag may be given more than once,
// the values adding up.
func Repeatable(name string) bool { return repeatable[name] != nil }

// repeatable are the options whose flag may be given more than once, the
// values adding up; each layer (file, variable, flags) replaces the one
// before it, as for any option. Each entry empties its option.
var repeatable = map[string]func(*Config){
	"trust-key":    func(c *Config) { c.TrustKeys = nil },
	"sandbox-bind": func(c *Config) { c.SandboxBinds = nil },
	"allow-env":    func(c *Config) { c.AllowEnv = nil },
}

// optionDefaults is each option's default as --help, the manual and the
// README show it, by option name; "" for an option without one (the URL
// and the token must be given). A default in parentheses describes what
// happens without the option; any other is a value that, given, leaves
// DefaultConfig as it is (a test holds every entry to that).
var optionDefaults = map[string]string{
	"url":            "",
	"token":          "",
	"token-file":     "",
	"name":           "(the host name)",
	"labels":         "(none)",
	"python":         "(python3 on PATH)",
	"parallel":       strconv.Itoa(DefaultParallel),
	"artifact-url":   "(derived from --url)",
	"cpus":           "(what the job, container or machine has)",
	"gpus":           "(from SLURM variables, else /dev/nvidia*)",
	"ram-mb":         "(what the job, container or machine has)",
	"max-idle":       "(never)",
	"runtime":        "auto",
	"cancel-grace":   DefaultCancelGrace.String(),
	"containment":    "(auto)",
	"sandbox":        "auto",
	"sandbox-bind":   "(none)",
	"reload-timeout": "forever",
	"max-line":       logging.FormatBytes(DefaultMaxLine),
	"log-format":     "text",
	"log-level":      "info",
	"node-log-level": "(info)",
	"state-dir":      "($STATE_DIRECTORY, else the user cache directory)",
	"ca-file":        "(the system's authorities only)",
	"max-calls":      "(no limit)",
	"listen":         "(off)",
	"health-grace":   "90s",
	"outage-grace":   "5m",
	"warm":           "(--parallel)",
	"preload":        "(none)",
	"allow-module":   "(any module; none under a code policy)",
	"allow-source":   "(any)",
	"trust-key":      "(none)",
	"allow-env":      "(only the tuning variables)",
	"pre-call-hook":  "(none)",
	"post-call-hook": "(none)",
	"hook-timeout":   "(" + DefaultHookTimeout.String() + ")",

	// What each call may use, and the disk calls may fill.
	"call-memory-max": "(no limit)",
	"call-pids-max":   "(no limit)",
	"call-cpu-max":    "(no limit)",
	"min-free-disk":   logging.FormatBytes(DefaultMinFreeDisk),
	"held-disk-max":   logging.FormatBytes(DefaultHeldDiskMax),

	// What the worker keeps for itself.
	"artifact-cache-max": strconv.Itoa(DefaultArtifactCachePercent) + "%",
}

// Default is the option's default as a reader should see it ("3s", "the
// host name"), "" for none.
func (o Option) Default() string {
	return strings.TrimSuffix(strings.TrimPrefix(optionDefaults[o.Name], "("), ")")
}

// HelpWithDefault is the option's help and its default, as --help and the
// manual show it.
func (o Option) HelpWithDefault() string {
	if d := o.Default(); d != "" {
		return o.Help + " (default: " + d + ")"
	}
	return o.Help
}

// WarmSpares is how many spare runners to keep: --warm, else one per
// --parallel slot, so that every slot can start its next call at once.
func (c Config) WarmSpares() int {
	if c.Warm != nil {
		return *c.Warm
	}
	return c.Parallel
}

// configRelative are the keys holding paths that, in a config file, are
// read relative to that file's directory, as a person editing it expects
// and the README says: each key's function makes the paths in its value
// absolute against dir. A hook is a shell command: its program is (see
// hook.ResolveProgram), a command name found on PATH is not.
var configRelative = map[string]func(v, dir string) (string, error){
	"token-file": relativePath,
	"state-dir":  relativePath,
	"ca-file":    relativePath,
	"trust-key": func(v, dir string) (string, error) {
		paths := SplitLabels(v)
		for i, p := range paths {
			paths[i], _ = relativePath(p, dir)
		}
		return strings.Join(paths, ","), nil
	},
	"pre-call-hook":  hook.ResolveProgram,
	"post-call-hook": hook.ResolveProgram,
}

// relativePath is path read against dir when it is relative.
func relativePath(path, dir string) (string, error) {
	if path == "" || filepath.IsAbs(path) {
		return path, nil
	}
	return filepath.Join(dir, path), nil
}

// Check reports whether v is a value this option accepts, without a
// Config: install checks every option before it asks anything else.
func (o Option) Check(v string) error {
	c := DefaultConfig()
	return o.set(&c, v)
}

// OptionByName finds an option by flag or config key; TOML keys may use
// underscores (ram_mb) as well as dashes (ram-mb).
func OptionByName(name string) (Option, bool) {
	name = strings.ReplaceAll(name, "_", "-")
	for _, o := range Options {
		if o.Name == name {
			return o, true
		}
	}
	return Option{}, false
}

// DefaultConfig is the configuration before any file, variable or flag.
func DefaultConfig() Config {
	return Config{
		Parallel:    DefaultParallel,
		Runtime:     "auto",
		Sandbox:     "auto",
		CancelGrace: DefaultCancelGrace,
		MaxLine:     DefaultMaxLine,
		LogFormat:   "text",
		LogLevel:    "info",
		HealthGrace: DefaultHealthGrace,
		OutageGrace: DefaultOutageGrace,
		MinFreeDisk: DefaultMinFreeDisk,
		HeldDiskMax: DefaultHeldDiskMax,

		ArtifactCachePercent: DefaultArtifactCachePercent,
	}
}

// UsageError is a problem with the command line or configuration: the
// process exits 2 and says what to change.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func Usagef(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}

// Load builds the configuration: defaults, then the TOML file (--config or
// FLUKSIO_WORKER_CONFIG), then environment variables, then flags. Later
// layers win. Commands that dial then call Resolve.
func Load(args []string, getenv func(string) string) (Config, error) {
	cfg := DefaultConfig()
	// Its callers say its errors beside their own (run hides the token in
	// them), so it needs no help of its own.
	cmd := NewCommand("run", nil)
	var configPath string
	var showVersion bool
	cmd.StringVar(&configPath, "config", "", "")
	cmd.BoolVar(&showVersion, "version", false, "")
	var order, flagValues []string
	for _, o := range Options {
		name := o.Name
		cmd.Func(name, o.Help, func(v string) error {
			// Applied in command-line order, so a flag given twice
			// counts as given last.
			order = append(order, name)
			flagValues = append(flagValues, v)
			return nil
		})
	}
	if err := cmd.Parse(args); err != nil {
		return cfg, err
	}
	if slices.Contains(order, "token") && slices.Contains(order, "token-file") {
		return cfg, Usagef("give the token once: --token or --token-file, not both")
	}
	if getenv(EnvPrefix+"TOKEN") != "" && getenv(EnvPrefix+"TOKEN_FILE") != "" {
		return cfg, Usagef("give the token once: %sTOKEN or %sTOKEN_FILE, not both", EnvPrefix, EnvPrefix)
	}
	if showVersion {
		return cfg, ErrVersion
	}
	if configPath == "" {
		configPath = getenv(EnvPrefix + "CONFIG")
	}
	if configPath != "" {
		if err := ApplyFile(&cfg, configPath); err != nil {
			return cfg, err
		}
		cfg.File, _ = filepath.Abs(configPath)
	}
	for _, o := range Options {
		if o.Env() == "" {
			continue
		}
		if v := getenv(o.Env()); v != "" {
			if reset := repeatable[o.Name]; reset != nil {
				reset(&cfg)
			}
			if err := o.set(&cfg, v); err != nil {
				return cfg, Usagef("%s=%q: %v", o.Env(), v, err)
			}
		}
	}
	reset := map[string]bool{}
	for i, name := range order {
		o, _ := OptionByName(name)
		if empty := repeatable[name]; empty != nil && !reset[name] {
			empty(&cfg)
			reset[name] = true
		}
		if err := o.set(&cfg, flagValues[i]); err != nil {
			return cfg, Usagef("--%s %q: %v", name, flagValues[i], err)
		}
	}
	return cfg, nil
}

// ErrVersion asks the caller to print the version and exit 0.
var ErrVersion = errors.New("version requested")

// Resolve checks what dialing needs and reads the token file, so a missing
// URL or an empty token file is a usage error before anything dials. The
// URL is completed (CompleteURL) and checked whole.
func (c *Config) Resolve() error {
	if c.URL == "" {
		return Usagef("--url is required: the engine's worker endpoint, e.g. wss://engine.example.com/api/v1/workers/attach")
	}
	endpoint, warning, err := CompleteURL(c.URL)
	if err != nil {
		return &UsageError{err}
	}
	c.URL = endpoint
	if warning != "" {
		c.Warnings = append(c.Warnings, warning)
	}
	if c.Token == "-" && c.TokenFile == "" {
		tok, err := ReadTokenFrom(os.Stdin)
		if err != nil {
			return &UsageError{err}
		}
		c.Token = tok
	}
	if c.TokenFile != "" {
		tok, err := ReadTokenFile(c.TokenFile)
		if err != nil {
			return &UsageError{err}
		}
		c.Token = tok
		if w := looseModeWarning(c.TokenFile, "the token file"); w != "" {
			c.Warnings = append(c.Warnings, w)
		}
	}
	if c.Token == "" {
		return Usagef("a token is required: --token-file PATH, FLUKSIO_WORKER_TOKEN, token in the --config file, or --token")
	}
	if len(c.Token) < logging.MinRedactLen {
		c.Warnings = append(c.Warnings, fmt.Sprintf("the token is %d characters long; one shorter than %d cannot be told apart from ordinary words, so it is kept out of URLs the worker shows but not searched for in other text it writes: ask the engine's admin for a longer token", len(c.Token), logging.MinRedactLen))
	}
	if c.CAFile != "" {
		if _, err := c.TLSConfig(); err != nil {
			return &UsageError{err}
		}
	}
	return c.resolvePolicy()
}

// ReadTokenFile returns the token in a token file: its first line that is
// not blank, trimmed, without the byte order mark an editor may put first.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the token file: %w", err)
	}
	text := strings.TrimPrefix(string(b), "\uFEFF")
	for _, line := range strings.Split(text, "\n") {
		if tok := strings.TrimSpace(line); tok != "" {
			return tok, nil
		}
	}
	return "", fmt.Errorf("the token file %s is empty", path)
}

// looseModeWarning says, for a file holding the token, that users other
// than the worker may read it, as ssh says of a private key; "" when the
// file is private (or cannot be examined: reading it reports that). Read
// access for the file's group is private enough when the worker reads the
// file through that group: it is in it and does not own the file, as with
// a Kubernetes Secret mounted root-owned, mode 0440, group fsGroup, which
// the worker could not make 0600 (and 0400 would lock it out).
func looseModeWarning(path, what string) string {
	st, err := os.Stat(path)
	if err != nil {
		return ""
	}
	perm := st.Mode().Perm()
	if perm&0o004 == 0 && (perm&0o040 == 0 || readsThroughGroup(st)) {
		return ""
	}
	return fmt.Sprintf("%s %s holds the token and is mode %04o, readable by other users than its owner; make it private: chmod 600 %s", what, path, perm, path)
}

// readsThroughGroup reports whether this process can read the file only
// by being in its group: it does not own it and the group is one of its.
func readsThroughGroup(st fs.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) == os.Geteuid() {
		return false
	}
	gid := int(sys.Gid)
	if gid == os.Getegid() {
		return true
	}
	groups, _ := os.Getgroups()
	return slices.Contains(groups, gid)
}

// ApplyFile applies a TOML config file's keys to cfg. Unknown keys are an
// error that names them, so a typo does not silently do nothing.
func ApplyFile(cfg *Config, path string) error {
	values, err := ReadFile(path)
	if err != nil {
		return &UsageError{err}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if _, token := values["token"]; token {
		if _, file := values["token-file"]; file {
			return Usagef("%s: give the token once: token or token-file, not both", path)
		}
	}
	for _, k := range keys {
		o, ok := OptionByName(k)
		if !ok {
			return Usagef("%s: unknown key %q%s (known keys are the long flags of 'fluksio-worker run --help')", path, k, DidYouMean(strings.ReplaceAll(k, "_", "-"), OptionNames()))
		}
		err := o.CheckValueType(values[k])
		var text string
		if err == nil {
			text, err = ValueText(values[k])
		}
		if resolve := configRelative[o.Name]; err == nil && resolve != nil {
			text, err = resolve(text, filepath.Dir(path))
		}
		if err == nil {
			err = o.set(cfg, text)
		}
		if err != nil {
			return Usagef("%s: %s: %v", path, k, err)
		}
	}
	if _, hasToken := values["token"]; hasToken {
		if w := looseModeWarning(path, "the config file"); w != "" {
			cfg.Warnings = append(cfg.Warnings, w)
		}
	}
	return nil
}

// ReadFile decodes a config file into its raw keys, for callers (the
// installer) that rewrite it and must keep keys they do not set.
func ReadFile(path string) (map[string]any, error) {
	values := map[string]any{}
	if _, err := toml.DecodeFile(path, &values); err != nil {
		return nil, fmt.Errorf("reading config %s: %w", path, err)
	}
	return values, nil
}

// TakesNumber says whether the option is a whole number (--parallel N),
// written in a config file as a TOML integer.
func (o Option) TakesNumber() bool {
	return o.Arg == "N" || o.Arg == "K" || o.Arg == "MB"
}

// CheckValueType refuses a config file value of the wrong TOML type for
// the option, read from its placeholder: a whole number for a count
// (parallel = 2), a list of strings or one comma-separated string for a
// list (labels = ["gpu"]), a number of seconds or a string for a duration
// or a size, and a string for the rest. labels = 5 or parallel = "2" is a
// mistake better said than guessed at.
func (o Option) CheckValueType(v any) error {
	var want string
	switch x := v.(type) {
	case int64, int:
		if o.TakesNumber() || o.Arg == "DURATION" || o.Arg == "BYTES" || o.Arg == "CPUS" {
			return nil
		}
	case float64:
		if o.Arg == "DURATION" || o.Arg == "CPUS" {
			return nil
		}
	case string:
		if !o.TakesNumber() {
			return nil
		}
	case []string:
		if strings.Contains(o.Arg, ",") {
			return nil
		}
	case []any:
		if strings.Contains(o.Arg, ",") {
			for _, item := range x {
				if _, ok := item.(string); !ok {
					return fmt.Errorf("expected a list of strings, e.g. %s = [\"a\", \"b\"], got %v", o.Name, v)
				}
			}
			return nil
		}
	}
	switch {
	case o.TakesNumber():
		want = fmt.Sprintf("a whole number without quotes, e.g. %s = 2", o.Name)
	case strings.Contains(o.Arg, ","):
		want = fmt.Sprintf("a list of strings, e.g. %s = [\"a\", \"b\"]", o.Name)
	case o.Arg == "DURATION":
		want = fmt.Sprintf("a duration in quotes or seconds, e.g. %s = \"5m\" or %s = 300", o.Name, o.Name)
	case o.Arg == "BYTES":
		want = fmt.Sprintf("a size in quotes or bytes, e.g. %s = \"256MiB\"", o.Name)
	default:
		want = fmt.Sprintf("a string in quotes, e.g. %s = \"...\"", o.Name)
	}
	return fmt.Errorf("expected %s, got %v (a TOML %s)", want, v, tomlTypeName(v))
}

func tomlTypeName(v any) string {
	switch v.(type) {
	case int64, int:
		return "integer"
	case float64:
		return "float"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any, []string:
		return "array"
	case map[string]any:
		return "table"
	}
	return fmt.Sprintf("%T", v)
}

// ValueText turns a config value (as TOML decodes it, or as the installer
// holds it) into the text the flag would carry.
func ValueText(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case int:
		return strconv.Itoa(x), nil
	case []string:
		return strings.Join(x, ","), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	case []any:
		parts := make([]string, 0, len(x))
		for _, item := range x {
			s, ok := item.(string)
			if !ok {
				return "", fmt.Errorf("expected a list of strings, got %v", v)
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("unsupported value %v", v)
}

// SplitLabels splits on commas and drops blanks: " gpu, ,cuda12" is
// [gpu cuda12], as engines written for the Python agent expect.
func SplitLabels(s string) []string {
	labels := []string{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			labels = append(labels, part)
		}
	}
	return labels
}

// intSetter accepts a whole number of at least minimum, and below 2^31:
// more than that is no count a person means.
func intSetter(apply func(*Config, int), minimum int) func(*Config, string) error {
	return intInRange(apply, minimum, math.MaxInt32, "larger is no count anyone means")
}

// intInRange accepts a whole number from minimum to maximum; why says what
// the maximum is, for the error.
func intInRange(apply func(*Config, int), minimum, maximum int, why string) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch {
		case errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(strings.TrimSpace(v), "-"):
			return fmt.Errorf("must be at most %d (%s)", maximum, why)
		case err != nil:
			return fmt.Errorf("expected a whole number")
		case n < int64(minimum):
			return fmt.Errorf("must be at least %d", minimum)
		case n > int64(maximum):
			return fmt.Errorf("must be at most %d (%s)", maximum, why)
		}
		apply(c, int(n))
		return nil
	}
}

// durationSetter accepts a duration (ParseDuration) up to the longest a
// time.Duration holds (about 292 years), so a huge value is refused, not
// overflowed.
func durationSetter(apply func(*Config, time.Duration)) func(*Config, string) error {
	return durationUpTo(apply, math.MaxInt64, "the longest duration there is")
}

// durationUpTo is durationSetter up to maximum; why says what the maximum
// is, for the error.
func durationUpTo(apply func(*Config, time.Duration), maximum time.Duration, why string) func(*Config, string) error {
	return func(c *Config, v string) error {
		tooLarge := fmt.Errorf("must be at most %s (%s)", humanDuration(maximum), why)
		d, err := ParseDuration(v)
		switch {
		case errors.Is(err, errDurationTooLong):
			return tooLarge
		case err != nil:
			return fmt.Errorf("%v, at most %s", err, humanDuration(maximum))
		case d < 0:
			return fmt.Errorf("must not be negative")
		case d > maximum:
			return tooLarge
		}
		apply(c, d)
		return nil
	}
}

// DurationSyntax says what ParseDuration reads, for help and errors.
const DurationSyntax = "seconds (300), a duration (5m, 1h30m) or days (7d)"

// errDurationTooLong: longer than a time.Duration holds (about 292 years).
var errDurationTooLong = errors.New("too long")

// ParseDuration reads a duration as every option and command of this
// binary takes one: plain seconds ("300", "2.5", as the Python agent took
// them), a Go duration ("5m", "1h30m"), or days ("7d", "1.5d"), which
// people write for long waits and Go has no unit for. A negative value is
// returned as read, for the caller to refuse.
func ParseDuration(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	unit, number := time.Second, v
	if n, ok := strings.CutSuffix(strings.ToLower(v), "d"); ok {
		unit, number = 24*time.Hour, n
	}
	x, err := strconv.ParseFloat(number, 64)
	switch {
	case err != nil || math.IsNaN(x) || math.IsInf(x, 0) || strings.ContainsAny(number, "xXpP_"):
		// time.ParseDuration cannot tell an overflow from a typo.
		return 0, fmt.Errorf("expected %s", DurationSyntax)
	case math.Abs(x)*float64(unit) > math.MaxInt64:
		return 0, errDurationTooLong
	}
	return time.Duration(x * float64(unit)), nil
}

// humanDuration writes a limit as a person reads it: "366 days (8784h)",
// "1h", "24h", not Go's "8784h0m0s".
func humanDuration(d time.Duration) string {
	const day = 24 * time.Hour
	switch {
	case d == math.MaxInt64:
		return "about 292 years"
	case d > day && d%day == 0:
		return fmt.Sprintf("%d days (%dh)", d/day, d/time.Hour)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func oneOf(apply func(*Config, string), choices ...string) func(*Config, string) error {
	return func(c *Config, v string) error {
		for _, choice := range choices {
			if strings.EqualFold(v, choice) {
				apply(c, choice)
				return nil
			}
		}
		return fmt.Errorf("expected one of %s", strings.Join(choices, ", "))
	}
}

// ParseBytes reads a size: plain bytes or with a KiB/MiB/GiB (or K/M/G)
// suffix.
func ParseBytes(v string) (int64, error) {
	v = strings.TrimSpace(v)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(v), strings.ToUpper(u.suffix)) {
			v, mult = strings.TrimSpace(v[:len(v)-len(u.suffix)]), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if errors.Is(err, strconv.ErrRange) || (err == nil && n > math.MaxInt64/mult) {
		return 0, fmt.Errorf("too large: a size must be below 8EiB")
	}
	if err != nil || n < 0 {
		return 0, fmt.Errorf("expected a size in bytes, e.g. 268435456 or 256MiB")
	}
	return n * mult, nil
}

func (c Config) Overrides() platform.Overrides {
	return platform.Overrides{CPUs: c.CPUs, GPUs: c.GPUs, RAMMB: c.RAMMB}
}
