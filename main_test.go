package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/metrics"
	"github.com/fluksio/fluksio-worker/agent/protocol"
)

// `help COMMAND` is what `COMMAND --help` prints.
func TestHelpCommand(t *testing.T) {
	for _, name := range []string{"install", "status", "copy", "version"} {
		var viaHelp, viaFlag, errs bytes.Buffer
		if code := dispatch(context.Background(), []string{"help", name}, &viaHelp, &errs); code != config.ExitOK {
			t.Errorf("help %s: exit %d: %s", name, code, errs.String())
		}
		dispatch(context.Background(), []string{name, "--help"}, &viaFlag, &errs)
		if viaHelp.String() != viaFlag.String() || !strings.HasPrefix(viaHelp.String(), "Usage: ") || !strings.Contains(viaHelp.String(), "fluksio-worker "+name) {
			t.Errorf("help %s printed:\n%s\nwant %s --help:\n%s", name, viaHelp.String(), name, viaFlag.String())
		}
	}
	var out, errs bytes.Buffer
	if code := dispatch(context.Background(), []string{"help", "instal"}, &out, &errs); code != config.ExitUsage || !strings.Contains(errs.String(), `no command "instal"`) {
		t.Errorf("help instal: exit %d: %s", code, errs.String())
	}
}

// Every command reads its command line through config.Command, so all of
// them answer alike: --help on stdout with exit 0, a mistyped option with
// the option it is one edit from and exit 2, an argument it does not take
// with exit 2. A command that parsed its flags its own way would say
// something else here.
func TestEveryCommandAnswersAlike(t *testing.T) {
	// An option of each command ("" for none), mistyped below.
	options := map[string]string{
		"run": "url", "inventory": "labels", "selftest": "steps", "install": "user-service",
		"uninstall": "purge", "start": "user-service", "stop": "user-service", "restart": "user-service",
		"reload": "user-service", "status": "json", "check": "json", "check-config": "url",
		"completion": "", "copy": "", "keygen": "out", "sign": "expires", "version": "json",
	}
	// Those that take run's options send a reader to run --help for them.
	helpOf := map[string]string{"inventory": "run", "check-config": "run"}
	// Those that take arguments besides options: a stray one is theirs to judge.
	takesArguments := map[string]bool{"completion": true, "copy": true, "sign": true}
	answer := func(args ...string) (code int, stdout, stderr string) {
		var out, errs strings.Builder
		code = dispatch(context.Background(), args, &out, &errs)
		return code, out.String(), errs.String()
	}
	for _, c := range commands() {
		option, listed := options[c.name]
		if !listed {
			t.Errorf("%s: add it to this test's options", c.name)
			continue
		}
		see := c.name
		if helpOf[c.name] != "" {
			see = helpOf[c.name]
		}
		code, stdout, stderr := answer(c.name, "--help")
		synopsis, _, _ := strings.Cut(stdout, "\n")
		if code != config.ExitOK || stderr != "" || !strings.HasPrefix(synopsis, "Usage: ") ||
			!(strings.Contains(synopsis, "fluksio-worker "+c.name) || strings.Contains(synopsis, "["+c.name+"]")) {
			t.Errorf("%s --help: exit %d, stdout %q, stderr %q; want 0 and its synopsis on stdout", c.name, code, synopsis, stderr)
		}
		typed, want := "--frobnicate", "fluksio-worker: unknown option --frobnicate (see 'fluksio-worker "+see+" --help')\n"
		if option != "" {
			typed = "--" + option + option[len(option)-1:] // --urll
			want = "fluksio-worker: unknown option " + typed + "; did you mean --" + option + "? (see 'fluksio-worker " + see + " --help')\n"
		}
		if code, stdout, stderr := answer(c.name, typed); code != config.ExitUsage || stdout != "" || stderr != want {
			t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want 2 and %q", c.name, typed, code, stdout, stderr, want)
		}
		if takesArguments[c.name] {
			continue
		}
		want = "fluksio-worker: unexpected argument \"stray\" (see 'fluksio-worker " + see + " --help')\n"
		if code, stdout, stderr := answer(c.name, "stray"); code != config.ExitUsage || stdout != "" || stderr != want {
			t.Errorf("%s stray: exit %d, stdout %q, stderr %q; want 2 and %q", c.name, code, stdout, stderr, want)
		}
	}
}

// copy does not create its directory: a mistyped mount path fails.
func TestCopyNeedsAnExistingDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "fluksio", "bin")
	var out, errs bytes.Buffer
	if code := dispatch(context.Background(), []string{"copy", missing}, &out, &errs); code != config.ExitFailed || !strings.Contains(errs.String(), missing+" does not exist") {
		t.Errorf("copy into a missing directory: exit %d: %s", code, errs.String())
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("copy created %s", missing)
	}
	dir := t.TempDir()
	if code := dispatch(context.Background(), []string{"copy", dir}, &out, &errs); code != config.ExitOK {
		t.Fatalf("copy into %s: exit %d: %s", dir, code, errs.String())
	}
	if st, err := os.Stat(filepath.Join(dir, "fluksio-worker")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("the copy: %v %v", st, err)
	}
}

var update = flag.Bool("update", false, "rewrite the documentation's generated tables")

// The README's options table and docs/monitoring.md's metrics table are
// generated from the options table and the metrics registry: a new option
// or series that is not documented fails here
// (go test -run TestREADMETables . -update).
func TestREADMETables(t *testing.T) {
	var options, series bytes.Buffer
	writeOptionsTable(&options, config.Options)
	if err := writeMetricsTable(&series, metrics.New("dev", protocol.Version)); err != nil {
		t.Fatal(err)
	}
	for _, table := range []struct{ file, name, text string }{
		{"README.md", "options", options.String()},
		{"docs/monitoring.md", "metrics", series.String()},
	} {
		b, err := os.ReadFile(table.file)
		if err != nil {
			t.Fatal(err)
		}
		doc := string(b)
		head := "<!-- " + table.name + " table: "
		end := "<!-- " + table.name + ":end -->\n"
		i := strings.Index(doc, head)
		j := strings.Index(doc, end)
		if i < 0 || j < i {
			t.Fatalf("%s has no %q ... %q markers around its %s table", table.file, head, end, table.name)
		}
		i += strings.Index(doc[i:], "\n") + 1
		if doc[i:j] == table.text {
			continue
		}
		if !*update {
			t.Errorf("%s's %s table differs from the code's; run: go test -run TestREADMETables . -update\nwant:\n%s", table.file, table.name, table.text)
			continue
		}
		if err := os.WriteFile(table.file, []byte(doc[:i]+table.text+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The manual's ENVIRONMENT names every variable the worker reads, and its
// EXIT STATUS every command's codes.
func TestManualEnvironmentAndExitStatus(t *testing.T) {
	var man, errs bytes.Buffer
	if code := dispatch(context.Background(), []string{"man"}, &man, &errs); code != config.ExitOK {
		t.Fatalf("man: exit %d: %s", code, errs.String())
	}
	page := man.String()
	env := page[strings.Index(page, `.SH "ENVIRONMENT"`):strings.Index(page, `.SH "FILES"`)]
	for _, name := range []string{"FLUKSIO_WORKER_CONFIG", "FLUKSIO_WORKER_GPUS", "SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_NODE",
		"SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "STATE_DIRECTORY", "XDG_CACHE_HOME", "SSL_CERT_FILE",
		"HTTPS_PROXY", "NO_PROXY", "GOGC", "JOURNAL_STREAM"} {
		if !strings.Contains(env, strings.ReplaceAll(name, "-", `\-`)) {
			t.Errorf("the manual's ENVIRONMENT does not name %s", name)
		}
	}
	for _, o := range config.Options {
		if o.Env() != "" && !strings.Contains(env, o.Env()) {
			t.Errorf("the manual's ENVIRONMENT does not name %s", o.Env())
		}
	}
	exit := page[strings.Index(page, `.SH "EXIT STATUS"`):]
	for _, c := range commands() {
		if !strings.Contains(exit, `\fB`+strings.ReplaceAll(c.name, "-", `\-`)+`\fR`) {
			t.Errorf("the manual's EXIT STATUS does not give %s's codes (its --help needs an \"Exit status:\" sentence)", c.name)
		}
	}
}

// The command line as main wires it, in this process.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--version"}, 0, "fluksio-worker "},
		{[]string{"--help"}, 0, "Commands:"},
		{nil, 2, "Usage:"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"` + "\n"},
		// A mistyped command gets a "did you mean", as a mistyped flag does.
		{[]string{"stauts"}, 2, `unknown command "stauts"; did you mean status?`},
		{[]string{"instal", "--url", "x"}, 2, `unknown command "instal"; did you mean install?`},
		{[]string{"help", "chek"}, 2, `no command "chek" to show help for; did you mean check?`},
		// Bare flags mean run, as the Python agent's command line did.
		{[]string{"--url", "ws://127.0.0.1:1/api/v1/workers/attach", "--token", "t", "--parallel", "zero"}, 2, "--parallel"},
	} {
		var out strings.Builder
		if code := dispatch(context.Background(), tc.args, &out, &out); code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("fluksio-worker %q: exit %d, %q; want %d and %q", tc.args, code, out.String(), tc.code, tc.want)
		}
	}
	help := mainOutput(t, "run", "--help")
	for _, o := range config.Options {
		if !strings.Contains(help, "--"+o.Name+" ") {
			t.Errorf("run --help does not document --%s", o.Name)
		}
	}
}

// A --url that carries a token is refused without repeating it, by run
// and by check.
func TestTokenInTheURLIsNotRepeated(t *testing.T) {
	t.Setenv("FLUKSIO_WORKER_TOKEN", "the-token-given-properly")
	const secret = "s3cret-in-the-url-42"
	for _, args := range [][]string{
		{"run", "--url", "wss://engine.example.com/api/v1/workers/attach?token=" + secret},
		{"run", "--url", "ftp://engine.example.com/x?token=" + secret},
		{"run", "--url", "ws://engine.example.com:99999/x?token=" + secret},
		{"check", "--url", "wss://engine.example.com/x?token=" + secret},
	} {
		var out, errs bytes.Buffer
		if code := dispatch(context.Background(), args, &out, &errs); code == config.ExitOK {
			t.Errorf("%v: exit 0", args)
		}
		if said := out.String() + errs.String(); strings.Contains(said, secret) || said == "" {
			t.Errorf("%v said (it must say what is wrong, without the token):\n%s", args, said)
		}
	}
}
