//go:build linux

package runner

// The wire driven for real: the worker's own code (askCapabilities, a
// zygote's start, its report read, a fork asked) against Debian's
// /usr/bin/python3 running the embedded runtime, with no pool and no
// cgroup. TestWireMatchesTheRuntime compares the constants; this one
// fails where a side reads a key, a descriptor or a name other than its
// constant says (the runtime's child reading "workdir" for the fork
// request's "cwd", the worker reading "watched" for the report's "watch").

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// wireNode answers with where it runs and what its call's env says.
const wireNode = `import os
def f():
    return {"cwd": os.getcwd(), "marker": os.environ.get("WIRE_MARKER"), "call_dir": os.environ.get("FLUKSIO_CALL_DIR")}
`

func TestTheRuntimeSpeaksTheWire(t *testing.T) {
	if !fileExists(systemPython) {
		t.Skip("the wire test runs " + systemPython)
	}
	path, err := filepath.Abs("../runtime/worker_main.py")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log := &enginetest.Buffer{}
	cfg := &Config{
		Python:      systemPython,
		StateDir:    filepath.Join(dir, "state"),
		BaseEnv:     []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir},
		CancelGrace: testGrace,
		MaxLine:     1 << 20,
		Log:         slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the worker's log:\n%s", log.String())
		}
	})
	rt := Runtime{Path: path, Embedded: true}

	t.Run("capabilities", func(t *testing.T) {
		c, err := askCapabilities(cfg, rt)
		if err != nil {
			t.Fatal(err)
		}
		for _, flag := range []string{outputFlag, spareFlag, zygoteFlag} {
			if !c.speaks(flag) {
				t.Errorf("the runtime does not say it speaks %s: %+v", flag, c)
			}
		}
		if want := runtimeConstants(t)["RUNTIME_VERSION"]; c.Version != want {
			t.Errorf("the runtime says it is version %q; its RUNTIME_VERSION is %v", c.Version, want)
		}
	})

	t.Run("zygote", func(t *testing.T) {
		p := &warmPool{cfg: cfg, forkTimeout: forkTimeout, exitReportWait: exitReportWait}
		we := &warmEnv{rt: rt, env: []string{"WIRE_MARKER=from the request"}}
		z := &zygote{spare: &spare{pool: p, we: we, started: make(chan struct{}), exited: make(chan struct{}), box: &box{log: cfg.Log}}}
		report, err := z.start()
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			z.closeControl() // the zygote exits at the end of its control socket
			<-z.exited
			z.dir.remove()
		}()
		r, err := z.awaitReport(report)
		if err != nil {
			t.Fatalf("reading the zygote's report: %v", err)
		}
		// What it loaded is watched: the runtime itself among it.
		if !slices.Contains(r.paths(), reportedPath{path, true}) {
			t.Errorf("the zygote's report watches no %s: %+v", path, r.paths())
		}
		if r.Failed == nil {
			t.Errorf("the zygote's report says nothing of its preloads: %+v", r)
		}

		// The runner's call directory is its working directory too, as
		// where the worker's own one is read-only (a service's).
		d, err := newCallDir(cfg.StateDir)
		if err != nil {
			t.Fatal(err)
		}
		d.cwd = d.path
		cfg.dirs = &callDirs{}
		if !cfg.dirs.put(d) {
			t.Fatal("the call directory was not kept for the fork")
		}
		s := &spare{pool: p, we: we, exited: make(chan struct{}), box: &box{log: cfg.Log}}
		if err := z.fork(s, false); err != nil {
			t.Fatalf("forking a runner: %v", err)
		}
		defer func() {
			s.stdout.Close()
			s.stderr.Close()
			s.pipes.close()
			s.dir.remove()
		}()
		req, _ := json.Marshal(map[string]any{
			"op": "run", "call_id": "wire", "function": "f", "inputs": map[string]any{}, "settings": map[string]any{},
			"node": map[string]any{"source": wireNode, "filename": "pipeline.py"},
		})
		s.stdin.Write(append(req, '\n'))
		s.stdin.Close()
		var last []byte
		for lines := bufio.NewScanner(s.stdout); lines.Scan(); {
			last = append(last[:0], lines.Bytes()...)
		}
		<-s.exited
		var a struct {
			OK      bool `json:"ok"`
			Outputs struct {
				Cwd     string `json:"cwd"`
				Marker  string `json:"marker"`
				CallDir string `json:"call_dir"`
			} `json:"outputs"`
		}
		if err := json.Unmarshal(last, &a); err != nil || !a.OK {
			t.Fatalf("the forked runner answered %q (%v); it exited %s", last, err, exitStatus(s.exitErr))
		}
		if got, want := realPath(t, a.Outputs.Cwd), realPath(t, s.dir.cwd); got != want {
			t.Errorf("the forked runner ran in %s; its fork request's cwd is %s", got, want)
		}
		if a.Outputs.Marker != "from the request" {
			t.Errorf("the forked runner's WIRE_MARKER is %q; its fork request's env has it", a.Outputs.Marker)
		}
		if a.Outputs.CallDir != s.dir.path {
			t.Errorf("the forked runner's %s is %q; its call directory is %s", callDirEnv, a.Outputs.CallDir, s.dir.path)
		}
	})
}

func realPath(t *testing.T, path string) string {
	t.Helper()
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	return real
}
