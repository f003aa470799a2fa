package config

import (
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/platform"
)

// envMap is a getenv over a fixed set of variables.
func envMap(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// writeConfig writes a TOML config file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeToken writes a token file and returns its path.
func writeToken(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustLoad(t *testing.T, args []string, env map[string]string) Config {
	t.Helper()
	cfg, err := Load(args, envMap(env))
	if err != nil {
		t.Fatalf("Load(%q): %v", args, err)
	}
	return cfg
}

// wantUsageError checks err is a *UsageError whose text names every part.
func wantUsageError(t *testing.T, err error, parts ...string) {
	t.Helper()
	var usage *UsageError
	if !errors.As(err, &usage) {
		t.Fatalf("error = %v (%T), want a *UsageError (exit 2)", err, err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not name %q", err, p)
		}
	}
}

func TestLoadDefaults(t *testing.T) {
	cfg := mustLoad(t, nil, nil)
	want := Config{
		Parallel:    1,
		Runtime:     "auto",
		Sandbox:     "auto",
		CancelGrace: 3 * time.Second,
		MaxLine:     256 << 20,
		LogFormat:   "text",
		LogLevel:    "info",
		HealthGrace: 90 * time.Second,
		OutageGrace: 5 * time.Minute,
		MinFreeDisk: 1 << 30,
		HeldDiskMax: 4 << 30,

		ArtifactCachePercent: 25,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("defaults = %+v, want %+v", cfg, want)
	}
	if cfg.GPUs != nil {
		t.Errorf("GPUs = %d with no --gpus, want nil (detect)", *cfg.GPUs)
	}
}

// fullConfig sets every key, mixing dashes and underscores as people do.
const fullConfig = `
url = "wss://engine.example.com/api/v1/workers/attach"
token = "tok-from-file"
name = "gpu-box-1"
labels = ["gpu", "cuda12"]
python = "/opt/venv/bin/python"
parallel = 4
artifact_url = "https://store.example.com/artifacts"
cpus = 8
gpus = 2
ram_mb = 64000
max-idle = 300
runtime = "embedded"
cancel_grace = "5s"
max_line = "1MiB"
log-format = "json"
log_level = "debug"
state-dir = "/var/lib/fluksio-worker"
max-calls = 3
listen = "127.0.0.1:9465"
health_grace = "75s"
outage_grace = "2m"
`

func checkFullConfig(t *testing.T, cfg Config) {
	t.Helper()
	gpus := 2
	want := Config{
		URL:         "wss://engine.example.com/api/v1/workers/attach",
		Token:       "tok-from-file",
		Name:        "gpu-box-1",
		Labels:      []string{"gpu", "cuda12"},
		Python:      "/opt/venv/bin/python",
		Parallel:    4,
		ArtifactURL: "https://store.example.com/artifacts",
		CPUs:        8,
		GPUs:        &gpus,
		RAMMB:       64000,
		MaxIdle:     300 * time.Second,
		Runtime:     "embedded",
		Sandbox:     "auto",
		CancelGrace: 5 * time.Second,
		MaxLine:     1 << 20,
		LogFormat:   "json",
		LogLevel:    "debug",
		StateDir:    "/var/lib/fluksio-worker",
		MaxCalls:    3,
		Listen:      "127.0.0.1:9465",
		HealthGrace: 75 * time.Second,
		OutageGrace: 2 * time.Minute,
		MinFreeDisk: 1 << 30,
		HeldDiskMax: 4 << 30,

		ArtifactCachePercent: 25,
	}
	cfg.File = "" // where it was read, which each test chooses
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config from the file =\n %+v\nwant\n %+v", cfg, want)
	}
}

func TestLoadConfigFileByFlag(t *testing.T) {
	path := writeConfig(t, fullConfig)
	checkFullConfig(t, mustLoad(t, []string{"--config", path}, nil))
}

func TestLoadConfigFileByVariable(t *testing.T) {
	path := writeConfig(t, fullConfig)
	checkFullConfig(t, mustLoad(t, nil, map[string]string{"FLUKSIO_WORKER_CONFIG": path}))
}

func TestLoadConfigFlagBeatsConfigVariable(t *testing.T) {
	byFlag := writeConfig(t, `name = "from-flag-file"`)
	byEnv := writeConfig(t, `name = "from-env-file"`)
	cfg := mustLoad(t, []string{"--config", byFlag}, map[string]string{"FLUKSIO_WORKER_CONFIG": byEnv})
	if cfg.Name != "from-flag-file" {
		t.Errorf("name = %q, want the --config file's", cfg.Name)
	}
}

func TestLoadLayers(t *testing.T) {
	path := writeConfig(t, `
name = "file"
parallel = 4
labels = "a,b"
max_idle = 60
`)
	env := map[string]string{
		"FLUKSIO_WORKER_CONFIG":   path,
		"FLUKSIO_WORKER_PARALLEL": "6",
		"FLUKSIO_WORKER_LABELS":   "env1,env2",
		"FLUKSIO_WORKER_RAM_MB":   "1000",
	}

	cfg := mustLoad(t, nil, env)
	if cfg.Name != "file" || cfg.Parallel != 6 || !reflect.DeepEqual(cfg.Labels, []string{"env1", "env2"}) ||
		cfg.MaxIdle != time.Minute || cfg.RAMMB != 1000 {
		t.Errorf("file+env: name %q parallel %d labels %q max-idle %v ram %d; want file, 6 (env), [env1 env2] (env), 1m (file), 1000 (env)",
			cfg.Name, cfg.Parallel, cfg.Labels, cfg.MaxIdle, cfg.RAMMB)
	}

	cfg = mustLoad(t, []string{"--parallel", "8", "--name", "flag", "--ram-mb=2000"}, env)
	if cfg.Name != "flag" || cfg.Parallel != 8 || cfg.RAMMB != 2000 || !reflect.DeepEqual(cfg.Labels, []string{"env1", "env2"}) {
		t.Errorf("file+env+flags: name %q parallel %d ram %d labels %q; want flag, 8, 2000, [env1 env2]",
			cfg.Name, cfg.Parallel, cfg.RAMMB, cfg.Labels)
	}
}

func TestLoadRepeatedFlagLastWins(t *testing.T) {
	cfg := mustLoad(t, []string{"--parallel", "2", "--parallel", "3"}, nil)
	if cfg.Parallel != 3 {
		t.Errorf("--parallel 2 --parallel 3: parallel = %d, want 3", cfg.Parallel)
	}
}

// A token and a token file are one setting: whichever the higher layer
// gives wins, whichever form it takes.
func TestTokenPrecedence(t *testing.T) {
	fileTok := writeToken(t, "tok-in-file\n")
	const url = `url = "wss://e/api/v1/workers/attach"` + "\n"
	tests := []struct {
		name string
		conf string
		env  map[string]string
		args []string
		want string
	}{
		{"config token", `token = "conf"`, nil, nil, "conf"},
		{"config token-file", `token-file = "` + fileTok + `"`, nil, nil, "tok-in-file"},
		{"env token beats config token-file", `token_file = "` + fileTok + `"`,
			map[string]string{"FLUKSIO_WORKER_TOKEN": "env"}, nil, "env"},
		{"env token-file beats config token", `token = "conf"`,
			map[string]string{"FLUKSIO_WORKER_TOKEN_FILE": fileTok}, nil, "tok-in-file"},
		{"flag token-file beats env token", ``,
			map[string]string{"FLUKSIO_WORKER_TOKEN": "env"}, []string{"--token-file", fileTok}, "tok-in-file"},
		{"flag token beats env token-file", ``,
			map[string]string{"FLUKSIO_WORKER_TOKEN_FILE": fileTok}, []string{"--token", "flag"}, "flag"},
		{"flag token beats config token-file", `token-file = "` + fileTok + `"`, nil, []string{"--token", "flag"}, "flag"},
		{"flag token-file beats config token", `token = "conf"`, nil, []string{"--token-file", fileTok}, "tok-in-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"FLUKSIO_WORKER_CONFIG": writeConfig(t, url+tt.conf)}
			for k, v := range tt.env {
				env[k] = v
			}
			cfg := mustLoad(t, tt.args, env)
			if err := cfg.Resolve(); err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if cfg.Token != tt.want {
				t.Errorf("token = %q, want %q", cfg.Token, tt.want)
			}
		})
	}
}

func TestLabels(t *testing.T) {
	tests := []struct {
		conf string
		want []string
	}{
		{`labels = ["gpu", "cuda12"]`, []string{"gpu", "cuda12"}},
		{`labels = "gpu, cuda12,,"`, []string{"gpu", "cuda12"}},
		{`labels = []`, []string{}},
		{`labels = ""`, []string{}},
		{`labels = [" a ", ""]`, []string{"a"}},
	}
	for _, tt := range tests {
		cfg := mustLoad(t, []string{"--config", writeConfig(t, tt.conf)}, nil)
		if !reflect.DeepEqual(cfg.Labels, tt.want) {
			t.Errorf("%s: labels = %q, want %q", tt.conf, cfg.Labels, tt.want)
		}
	}
	cfg := mustLoad(t, []string{"--labels", " gpu ,,cuda12 "}, nil)
	if !reflect.DeepEqual(cfg.Labels, []string{"gpu", "cuda12"}) {
		t.Errorf("--labels: labels = %q, want [gpu cuda12]", cfg.Labels)
	}
}

func TestDurations(t *testing.T) {
	tests := []struct {
		conf string
		want time.Duration
	}{
		{`max-idle = 300`, 300 * time.Second},
		{`max-idle = 2.5`, 2500 * time.Millisecond},
		{`max-idle = "300"`, 300 * time.Second},
		{`max-idle = "5m"`, 5 * time.Minute},
		{`max-idle = "1h30m"`, 90 * time.Minute},
		{`max-idle = 0`, 0},
		{`max-idle = "7d"`, 7 * 24 * time.Hour},
		{`max-idle = "1.5D"`, 36 * time.Hour},
	}
	for _, tt := range tests {
		cfg := mustLoad(t, []string{"--config", writeConfig(t, tt.conf)}, nil)
		if cfg.MaxIdle != tt.want {
			t.Errorf("%s: max-idle = %v, want %v", tt.conf, cfg.MaxIdle, tt.want)
		}
	}
	cfg := mustLoad(t, []string{"--cancel-grace", "10"}, map[string]string{"FLUKSIO_WORKER_MAX_IDLE": "90"})
	if cfg.CancelGrace != 10*time.Second || cfg.MaxIdle != 90*time.Second {
		t.Errorf("cancel-grace %v max-idle %v, want 10s and 1m30s", cfg.CancelGrace, cfg.MaxIdle)
	}
}

func TestUnknownConfigKey(t *testing.T) {
	path := writeConfig(t, "url = \"wss://e/x\"\nram_gb = 64\n")
	_, err := Load([]string{"--config", path}, envMap(nil))
	wantUsageError(t, err, path, "ram_gb")
	// A mistyped key gets a "did you mean", as a mistyped flag does.
	_, err = Load([]string{"--config", writeConfig(t, "url = \"wss://e/x\"\nlables = [\"gpu\"]\n")}, envMap(nil))
	wantUsageError(t, err, `unknown key "lables"; did you mean labels?`)
	_, err = Load([]string{"--config", writeConfig(t, "url = \"wss://e/x\"\nmax_idel = 60\n")}, envMap(nil))
	wantUsageError(t, err, `unknown key "max_idel"; did you mean max-idle?`)
}

func TestBadValuesNameWhatToChange(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		conf  string
		names []string
	}{
		{"parallel 0 by flag", []string{"--parallel", "0"}, nil, "", []string{"--parallel", "at least 1"}},
		{"cpus not a number by variable", nil, map[string]string{"FLUKSIO_WORKER_CPUS": "many"}, "", []string{"FLUKSIO_WORKER_CPUS", "whole number"}},
		{"negative gpus", []string{"--gpus", "-1"}, nil, "", []string{"--gpus"}},
		{"log format", []string{"--log-format", "xml"}, nil, "", []string{"--log-format", "text, json"}},
		{"log level by variable", nil, map[string]string{"FLUKSIO_WORKER_LOG_LEVEL": "loud"}, "", []string{"FLUKSIO_WORKER_LOG_LEVEL"}},
		{"max-line too small", []string{"--max-line", "10"}, nil, "", []string{"--max-line", "1KiB"}},
		{"max-line not a size", nil, map[string]string{"FLUKSIO_WORKER_MAX_LINE": "big"}, "", []string{"FLUKSIO_WORKER_MAX_LINE"}},
		{"max-idle not a duration", []string{"--max-idle", "soon"}, nil, "", []string{"--max-idle", "seconds"}},
		{"cancel-grace negative", []string{"--cancel-grace", "-3s"}, nil, "", []string{"--cancel-grace", "negative"}},
		{"listen without a port", []string{"--listen", "localhost"}, nil, "", []string{"--listen", "host:port"}},
		{"max-calls negative by variable", nil, map[string]string{"FLUKSIO_WORKER_MAX_CALLS": "-1"}, "", []string{"FLUKSIO_WORKER_MAX_CALLS", "at least 0"}},
		{"bad value in the file", nil, nil, "parallel = \"lots\"\n", []string{"parallel", "whole number"}},
		{"labels of numbers in the file", nil, nil, "labels = [1, 2]\n", []string{"labels"}},
		{"a table in the file", nil, nil, "[inventory]\ncpus = 4\n", []string{"inventory"}},
		{"not TOML", nil, nil, "url = \n", []string{"config"}},
		{"unknown flag", []string{"--nope"}, nil, "", []string{"nope"}},
		{"flag without its value", []string{"--cpus"}, nil, "", []string{"cpus"}},
		{"stray argument", []string{"--cpus", "2", "extra"}, nil, "", []string{"extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range tt.env {
				env[k] = v
			}
			if tt.conf != "" {
				env["FLUKSIO_WORKER_CONFIG"] = writeConfig(t, tt.conf)
			}
			_, err := Load(tt.args, envMap(env))
			wantUsageError(t, err, tt.names...)
		})
	}
}

func TestMissingConfigFile(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.toml")
	_, err := Load([]string{"--config", missing}, envMap(nil))
	wantUsageError(t, err, missing)
}

func TestVersionAndHelp(t *testing.T) {
	if _, err := Load([]string{"--version"}, envMap(nil)); !errors.Is(err, ErrVersion) {
		t.Errorf("--version: %v, want ErrVersion", err)
	}
	if _, err := Load([]string{"--help"}, envMap(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v, want flag.ErrHelp", err)
	}
}

func TestGPUsFlagZeroVersusAbsent(t *testing.T) {
	if cfg := mustLoad(t, nil, nil); cfg.GPUs != nil {
		t.Errorf("no --gpus: GPUs = %d, want nil (detect)", *cfg.GPUs)
	}
	cfg := mustLoad(t, []string{"--gpus", "0"}, nil)
	if cfg.GPUs == nil || *cfg.GPUs != 0 {
		t.Errorf("--gpus 0: GPUs = %v, want 0 (none)", cfg.GPUs)
	}
	cfg = mustLoad(t, []string{"--config", writeConfig(t, "gpus = 0\n")}, nil)
	if cfg.GPUs == nil || *cfg.GPUs != 0 {
		t.Errorf("gpus = 0 in the file: GPUs = %v, want 0 (none)", cfg.GPUs)
	}
	// Each Load has its own value.
	a, b := mustLoad(t, []string{"--gpus", "1"}, nil), mustLoad(t, []string{"--gpus", "2"}, nil)
	if *a.GPUs != 1 || *b.GPUs != 2 {
		t.Errorf("two loads share their GPUs: %d, %d", *a.GPUs, *b.GPUs)
	}
}

// FLUKSIO_WORKER_GPUS is, by the protocol, a detection source that comes
// after SLURM_GPUS_ON_NODE and is ignored when not numeric, as the
// reference agent reads it. It must not turn into a --gpus flag that beats
// the scheduler's grant, nor stop a worker from starting.
func TestGPUsVariableKeepsTheProtocolOrder(t *testing.T) {
	env := map[string]string{"SLURM_GPUS_ON_NODE": "1", "FLUKSIO_WORKER_GPUS": "4"}
	cfg, err := Load(nil, envMap(env))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	probe := platform.Machine{
		Getenv:     envMap(env),
		DevDir:     t.TempDir(),
		CgroupRoot: t.TempDir(),
		ProcSelf:   t.TempDir(),
		CPUs:       func() int { return 4 },
		MemoryMB:   func() (int, bool) { return 1024, true },
	}
	if got := probe.Inventory(cfg.Overrides()).GPUs; got != 1 {
		t.Errorf("SLURM_GPUS_ON_NODE=1 FLUKSIO_WORKER_GPUS=4: advertises %d GPUs, want 1 (SLURM_GPUS_ON_NODE comes first)", got)
	}

	if _, err := Load(nil, envMap(map[string]string{"FLUKSIO_WORKER_GPUS": "all"})); err != nil {
		t.Errorf("FLUKSIO_WORKER_GPUS=all: %v; the protocol ignores a value that is not numeric", err)
	}
}

func TestResolve(t *testing.T) {
	const url = "wss://e/api/v1/workers/attach"
	t.Run("no url", func(t *testing.T) {
		cfg := mustLoad(t, []string{"--token", "t"}, nil)
		wantUsageError(t, cfg.Resolve(), "--url is required")
	})
	t.Run("not a websocket url", func(t *testing.T) {
		cfg := mustLoad(t, []string{"--url", "ftp://e/api/v1/workers/attach", "--token", "t"}, nil)
		wantUsageError(t, cfg.Resolve(), "ws://", "wss://")
	})
	t.Run("the engine's web address is completed", func(t *testing.T) {
		cfg := mustLoad(t, []string{"--url", "HTTPS://e", "--token", "t"}, nil)
		if err := cfg.Resolve(); err != nil || cfg.URL != url {
			t.Errorf("Resolve: url %q, %v; want %s", cfg.URL, err, url)
		}
	})
	t.Run("no token", func(t *testing.T) {
		cfg := mustLoad(t, []string{"--url", url}, nil)
		wantUsageError(t, cfg.Resolve(), "token is required", "--token-file", "FLUKSIO_WORKER_TOKEN")
	})
	t.Run("missing token file", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "token")
		cfg := mustLoad(t, []string{"--url", url, "--token-file", missing}, nil)
		wantUsageError(t, cfg.Resolve(), "token file", missing)
	})
	t.Run("empty token file", func(t *testing.T) {
		empty := writeToken(t, "\n \n\t\n")
		cfg := mustLoad(t, []string{"--url", url, "--token-file", empty}, nil)
		wantUsageError(t, cfg.Resolve(), empty, "empty")
	})
	t.Run("token file: byte order mark and blank lines before the token", func(t *testing.T) {
		cfg := mustLoad(t, []string{"--url", url, "--token-file", writeToken(t, "\uFEFF\n\n  second-line \r\n")}, nil)
		if err := cfg.Resolve(); err != nil || cfg.Token != "second-line" {
			t.Errorf("Resolve: token %q, %v; want second-line", cfg.Token, err)
		}
	})
	t.Run("token file first line, trimmed", func(t *testing.T) {
		cfg := mustLoad(t, []string{"--url", url, "--token-file", writeToken(t, "  abc123 \r\nsecond\n")}, nil)
		if err := cfg.Resolve(); err != nil || cfg.Token != "abc123" {
			t.Errorf("Resolve: token %q, %v; want abc123", cfg.Token, err)
		}
	})
	t.Run("token file without newline", func(t *testing.T) {
		cfg := mustLoad(t, []string{"--url", url, "--token-file", writeToken(t, "abc123")}, nil)
		if err := cfg.Resolve(); err != nil || cfg.Token != "abc123" {
			t.Errorf("Resolve: token %q, %v; want abc123", cfg.Token, err)
		}
	})
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"1024", 1024}, {"256MiB", 256 << 20}, {"1KiB", 1024}, {"2G", 2 << 30},
		{"3 MB", 3 << 20}, {"64k", 64 << 10}, {"10B", 10},
	}
	for _, tt := range tests {
		if got, err := ParseBytes(tt.in); err != nil || got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1", "1.5GiB", "lots"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q): no error", bad)
		}
	}
}

// TestReloadTimeout: the default waits as long as calls run; "forever" and 0
// say so explicitly; anything else is a duration.
func TestReloadTimeout(t *testing.T) {
	if cfg := mustLoad(t, nil, nil); cfg.ReloadTimeout != 0 {
		t.Errorf("default reload-timeout %v, want 0 (forever)", cfg.ReloadTimeout)
	}
	for conf, want := range map[string]time.Duration{
		`reload-timeout = "forever"`: 0,
		`reload-timeout = 0`:         0,
		`reload-timeout = "2h"`:      2 * time.Hour,
		`reload_timeout = 90`:        90 * time.Second,
	} {
		if cfg := mustLoad(t, []string{"--config", writeConfig(t, conf)}, nil); cfg.ReloadTimeout != want {
			t.Errorf("%s: reload-timeout %v, want %v", conf, cfg.ReloadTimeout, want)
		}
	}
	if cfg := mustLoad(t, nil, map[string]string{"FLUKSIO_WORKER_RELOAD_TIMEOUT": "30m"}); cfg.ReloadTimeout != 30*time.Minute {
		t.Errorf("FLUKSIO_WORKER_RELOAD_TIMEOUT=30m: %v", cfg.ReloadTimeout)
	}
	if _, err := Load([]string{"--reload-timeout", "soon"}, func(string) string { return "" }); err == nil {
		t.Error("--reload-timeout soon was accepted")
	}
}

// A token shorter than logging.MinRedactLen draws a warning: the worker
// cannot hide it in free text.
func TestShortTokenWarns(t *testing.T) {
	cfg := Config{URL: "ws://h", Token: "short"}
	if err := cfg.Resolve(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "shorter than 8") {
		t.Errorf("warnings %q", cfg.Warnings)
	}
}

// Numbers past what anyone can mean are refused with the limit.
func TestOptionLimits(t *testing.T) {
	for name, v := range map[string]string{
		"max-idle": "1e10", "cancel-grace": "1e300", "max-line": "9999999999999GiB",
		"parallel": "100000", "cpus": "99999999999", "gpus": "5000", "ram-mb": "99999999999",
	} {
		o, _ := OptionByName(name)
		err := o.Check(v)
		if err == nil || !(strings.Contains(err.Error(), "at most") || strings.Contains(err.Error(), "too large")) {
			t.Errorf("--%s %s: %v", name, v, err)
		}
	}
	for name, v := range map[string]string{"max-idle": "8760h", "cancel-grace": "30m", "max-line": "1GiB", "parallel": "64", "cpus": "256"} {
		o, _ := OptionByName(name)
		if err := o.Check(v); err != nil {
			t.Errorf("--%s %s: %v", name, v, err)
		}
	}
}

// Duration limits read as a person writes them, and days, which Go has no
// unit for, are refused saying so and what to write instead.
func TestDurationLimitsSaidPlainly(t *testing.T) {
	for _, c := range []struct{ option, value, want string }{
		{"max-idle", "1e10", "must be at most 366 days (8784h)"},
		{"max-idle", "9000h", "must be at most 366 days (8784h)"},
		{"cancel-grace", "2h", "must be at most 1h ("},
		{"outage-grace", "25h", "must be at most 24h ("},
		{"outage-grace", "2d", "must be at most 24h ("},
		{"max-idle", "400d", "must be at most 366 days (8784h)"},
		{"max-idle", "soon", "expected seconds (300), a duration (5m, 1h30m) or days (7d), at most 366 days (8784h)"},
		{"max-idle", "-1d", "must not be negative"},
	} {
		o, _ := OptionByName(c.option)
		err := o.Check(c.value)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--%s %s: %v; want it to say %q", c.option, c.value, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "0m0s") {
			t.Errorf("--%s %s: %v says Go's form of a duration", c.option, c.value, err)
		}
	}
	for d, want := range map[time.Duration]string{time.Hour: "1h", 90 * time.Second: "1m30s", 5 * time.Minute: "5m", 36 * time.Hour: "36h", math.MaxInt64: "about 292 years"} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q; want %q", d, got, want)
		}
	}
}

// The token given twice in one place is a mistake, said as install says
// it; only a higher layer (flags over variables over the file) overrides.
func TestTokenGivenTwiceRefused(t *testing.T) {
	fileTok := writeToken(t, "tok-in-file\n")
	_, err := Load([]string{"--token", "t", "--token-file", fileTok}, envMap(nil))
	wantUsageError(t, err, "give the token once", "--token", "--token-file")
	_, err = Load(nil, envMap(map[string]string{"FLUKSIO_WORKER_TOKEN": "t", "FLUKSIO_WORKER_TOKEN_FILE": fileTok}))
	wantUsageError(t, err, "give the token once", "FLUKSIO_WORKER_TOKEN", "FLUKSIO_WORKER_TOKEN_FILE")
	path := writeConfig(t, "token = \"t\"\ntoken-file = \""+fileTok+"\"\n")
	_, err = Load([]string{"--config", path}, envMap(nil))
	wantUsageError(t, err, path, "give the token once")
}

// A config value of the wrong TOML type is refused with what to write.
func TestConfigValueTypes(t *testing.T) {
	for _, tt := range []struct{ conf, want string }{
		{`labels = 5`, `a list of strings, e.g. labels = ["a", "b"]`},
		{`parallel = "2"`, `a whole number without quotes, e.g. parallel = 2`},
		{`parallel = 2.5`, `a whole number`},
		{`name = 7`, `a string in quotes`},
		{`max-idle = true`, `a duration`},
		{`labels = ["gpu", 1]`, `a list of strings`},
	} {
		path := writeConfig(t, tt.conf)
		_, err := Load([]string{"--config", path}, envMap(nil))
		wantUsageError(t, err, path, tt.want)
	}
	// What the documentation shows stays accepted.
	for _, conf := range []string{`parallel = 2`, `labels = ["gpu"]`, `labels = "gpu,cuda"`, `max-idle = 300`, `max-idle = "10m"`, `max-line = "256MiB"`, `max-line = 1048576`, `cancel-grace = 2.5`} {
		mustLoad(t, []string{"--config", writeConfig(t, conf)}, nil)
	}
}

// An unknown option is shown as typed, with the nearest known one.
func TestUnknownOptionDidYouMean(t *testing.T) {
	_, err := Load([]string{"--urll", "wss://e/x"}, envMap(nil))
	wantUsageError(t, err, "unknown option --urll; did you mean --url?")
	_, err = Load([]string{"-paralel=2"}, envMap(nil))
	wantUsageError(t, err, "unknown option -paralel; did you mean --parallel?")
	_, err = Load([]string{"--frobnicate"}, envMap(nil))
	wantUsageError(t, err, "unknown option --frobnicate (see")
}

// Every option says its default, and a default given as a value is the
// one the worker really has: given explicitly, it changes nothing.
func TestOptionDefaultsAreTheRealOnes(t *testing.T) {
	for _, o := range Options {
		d, ok := optionDefaults[o.Name]
		if !ok {
			t.Errorf("--%s has no entry in optionDefaults: add its default (in parentheses where it is a description), so --help, the manual and the README show it", o.Name)
			continue
		}
		if d == "" || strings.HasPrefix(d, "(") {
			continue
		}
		cfg := DefaultConfig()
		if err := o.set(&cfg, d); err != nil {
			t.Errorf("--%s: its documented default %q is refused: %v", o.Name, d, err)
		} else if !reflect.DeepEqual(cfg, DefaultConfig()) {
			t.Errorf("--%s: its documented default %q is not the real one: it changes the configuration", o.Name, d)
		}
		if !strings.Contains(o.HelpWithDefault(), "(default: "+d+")") {
			t.Errorf("--%s: the help does not show the default: %q", o.Name, o.HelpWithDefault())
		}
	}
	for name := range optionDefaults {
		if _, ok := OptionByName(name); !ok {
			t.Errorf("optionDefaults has %q, which is no option", name)
		}
	}
}

// TestArtifactCacheMax: the artifact cache's bound is a size or a share of
// its file system, from the flag, the variable or the file alike.
func TestArtifactCacheMax(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		env     map[string]string
		bytes   int64
		percent int
	}{
		{nil, nil, 0, 25},
		{[]string{"--artifact-cache-max", "20GiB"}, nil, 20 << 30, 0},
		{[]string{"--artifact-cache-max", "10%"}, nil, 0, 10},
		{[]string{"--artifact-cache-max", "0"}, nil, 0, 0},
		{nil, map[string]string{"FLUKSIO_WORKER_ARTIFACT_CACHE_MAX": "512MiB"}, 512 << 20, 0},
	} {
		cfg := mustLoad(t, tt.args, tt.env)
		if cfg.ArtifactCacheMax != tt.bytes || cfg.ArtifactCachePercent != tt.percent {
			t.Errorf("%q %v: %d bytes, %d%%; want %d, %d%%", tt.args, tt.env, cfg.ArtifactCacheMax, cfg.ArtifactCachePercent, tt.bytes, tt.percent)
		}
	}
	for _, bad := range []string{"101%", "-5%", "half%", "lots"} {
		_, err := Load([]string{"--artifact-cache-max", bad}, envMap(nil))
		wantUsageError(t, err, "--artifact-cache-max", "%")
	}
}
