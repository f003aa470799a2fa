package test

import (
	"encoding/json"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
)

func TestInventoryCommandPrintsTheHello(t *testing.T) {
	t.Parallel()
	w := startBinary(t, []string{"SLURM_CPUS_ON_NODE=12", "SLURM_JOB_GPUS=0,1"},
		"inventory", "--python", fakeRunner, "--ram-mb", "2048", "--labels", "gpu,a100", "--name", "n1")
	if code := w.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d: %s", code, w.logs.String())
	}
	var hello struct {
		Op        string   `json:"op"`
		Protocol  int      `json:"protocol"`
		Name      string   `json:"name"`
		Labels    []string `json:"labels"`
		Python    string   `json:"python"`
		Inventory struct {
			CPUs, GPUs int
			RAMMB      int `json:"ram_mb"`
		} `json:"inventory"`
		VenvDigest string `json:"venv_digest"`
	}
	if err := json.Unmarshal([]byte(w.logs.String()), &hello); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, w.logs.String())
	}
	inv := hello.Inventory
	if hello.Name != "n1" || strings.Join(hello.Labels, ",") != "gpu,a100" || hello.Python != fakeRunner ||
		inv.CPUs != 12 || inv.GPUs != 2 || inv.RAMMB != 2048 || len(hello.VenvDigest) != 16 || hello.Op != "hello" || hello.Protocol != 2 ||
		strings.Contains(w.logs.String(), "containment") {
		t.Errorf("inventory printed %s", w.logs.String())
	}
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	w := startBinary(t, nil, "--version")
	if code := w.wait(10 * time.Second); code != 0 || !strings.HasPrefix(w.logs.String(), "fluksio-worker ") {
		t.Errorf("--version: exit %d, %q", code, w.logs.String())
	}
	w = startBinary(t, nil, "run", "--help")
	if code := w.wait(10 * time.Second); code != 0 {
		t.Errorf("run --help: exit %d", code)
	}
	for _, o := range config.Options {
		if !strings.Contains(w.logs.String(), "--"+o.Name+" ") {
			t.Errorf("run --help does not document --%s", o.Name)
		}
	}
	w = startBinary(t, nil, "frobnicate")
	if code := w.wait(10 * time.Second); code != 2 || !strings.Contains(w.logs.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, %q", code, w.logs.String())
	}
	w = startBinary(t, nil, "--url", "ws://127.0.0.1:1/api/v1/workers/attach", "--token", "t", "--parallel", "zero")
	if code := w.wait(10 * time.Second); code != 2 || !strings.Contains(w.logs.String(), "--parallel") {
		t.Errorf("bad flag value: exit %d, %q", code, w.logs.String())
	}
}

// `version` says which build this is: a `go build` in a git checkout
// carries its revision, so a bug report names the exact code.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	w := startBinary(t, nil, "version", "--json")
	if code := w.wait(10 * time.Second); code != 0 {
		t.Fatalf("version --json: exit %d: %s", code, w.logs.String())
	}
	var info struct {
		Version, Revision, Go, OS, Arch string
		BuildDate                       string `json:"build_date"`
		Protocol                        int
	}
	if err := json.Unmarshal([]byte(w.logs.String()), &info); err != nil {
		t.Fatalf("version --json printed %q: %v", w.logs.String(), err)
	}
	if info.Version != "dev" || info.Go != runtime.Version() || info.OS != runtime.GOOS || info.Arch != runtime.GOARCH || info.Protocol != 2 {
		t.Errorf("version --json: %+v", info)
	}
	// What the build recorded (nothing where GOFLAGS has -buildvcs=false).
	meta, err := exec.Command("go", "version", "-m", workerBin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var revision, date string
	for _, line := range strings.Split(string(meta), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "build" {
			k, v, _ := strings.Cut(f[1], "=")
			switch k {
			case "vcs.revision":
				revision = v
			case "vcs.time":
				date = v
			}
		}
	}
	if info.Revision != revision || info.BuildDate != date {
		t.Errorf("version --json: revision %q, build date %q; the build recorded %q and %q", info.Revision, info.BuildDate, revision, date)
	}
	w = startBinary(t, nil, "version")
	if code := w.wait(10 * time.Second); code != 0 || !strings.HasPrefix(w.logs.String(), "fluksio-worker dev\n") || !strings.Contains(w.logs.String(), "protocol  2") {
		t.Errorf("version: exit %d:\n%s", code, w.logs.String())
	}
}
