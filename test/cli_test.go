package test

import (
	"encoding/json"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

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
	meta, err := exec.Command("go", "version", "-m", workerBinary(t)).Output()
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
