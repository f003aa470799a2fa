package test

// Hardening: what a worker does on a shared machine, with a careless
// operator and a hostile engine (state directory planting, the token in
// text the worker did not write, URLs, TLS with a private CA, token files,
// numbers that cannot be meant, install's order, selftest and SIGTERM).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// neighbour is another local user, as root can make one appear: files it
// owns are what another account on a shared machine would leave.
const neighbour = 4242

// envWithout is cleanEnv without the named variables.
func envWithout(names ...string) []string {
	var env []string
	for _, kv := range cleanEnv() {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			keep = keep && name != n
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}

// startIn runs the worker binary in dir with exactly env.
func startIn(t *testing.T, dir string, env []string, args ...string) *worker {
	t.Helper()
	cmd := exec.Command(workerBinary(t), args...)
	cmd.Dir, cmd.Env = dir, env
	return startCommand(t, cmd)
}

// runOutputs runs a fake-runner call and returns its outputs.
func runOutputs(t *testing.T, wk *enginetest.Worker, id string, steps ...map[string]any) map[string]any {
	t.Helper()
	answer, _ := wait(t, run(t, wk, id, steps...))
	var out struct {
		OK      bool           `json:"ok"`
		Outputs map[string]any `json:"outputs"`
	}
	if err := answer.Decode(&out); err != nil || !out.OK {
		t.Fatalf("call %s: %s", id, answer.Raw)
	}
	return out.Outputs
}

func runnerEnv(t *testing.T, wk *enginetest.Worker, names ...string) map[string]string {
	t.Helper()
	out := runOutputs(t, wk, "env", step{"env": names})
	env := map[string]string{}
	for k, v := range out["env"].(map[string]any) {
		env[k] = v.(string)
	}
	return env
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// Item 1: a state directory another user owns or may write is refused at
// start with what to do, whichever part of it is the problem.
func TestStateDirOthersCanWriteIsRefused(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	for _, tc := range []struct {
		name  string
		setup func(state string)
		says  []string
	}{
		{"owned by a neighbour", func(state string) { os.Chown(state, neighbour, neighbour) },
			[]string{"belongs to uid 4242", "--state-dir"}},
		{"world-writable", func(state string) { os.Chmod(state, 0o777) },
			[]string{"mode 0777", "chmod 700 " + "STATE"}},
		{"group-writable", func(state string) { os.Chmod(state, 0o770) },
			[]string{"mode 0770", "chmod 700"}},
		{"runtime/ world-writable", func(state string) {
			os.Mkdir(filepath.Join(state, "runtime"), 0o700)
			os.Chmod(filepath.Join(state, "runtime"), 0o777)
		}, []string{"runtime", "mode 0777", "chmod 700 " + "STATE/runtime"}},
		{"artifacts/ owned by a neighbour", func(state string) {
			os.Mkdir(filepath.Join(state, "artifacts"), 0o700)
			os.Chown(filepath.Join(state, "artifacts"), neighbour, neighbour)
		}, []string{"artifacts", "belongs to uid 4242"}},
		{"inside a world-writable directory without the sticky bit", func(state string) {
			os.Chmod(filepath.Dir(state), 0o777)
		}, []string{"every user may write", "--state-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(state, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.setup(state)
			w := startWorker(t, eng, nil, "--state-dir", state)
			if code := w.wait(20 * time.Second); code != 2 {
				t.Fatalf("exit %d, want 2 (refused at start)", code)
			}
			logs := w.logs.String()
			for _, want := range tc.says {
				want = strings.ReplaceAll(want, "STATE", state)
				if !strings.Contains(logs, want) {
					t.Errorf("the message does not say %q:\n%s", want, logs)
				}
			}
			if len(eng.Hellos()) != 0 {
				t.Errorf("the worker attached with an unsafe state directory")
			}
		})
	}
}

// Item 1: what the worker creates is private.
func TestStateDirIsCreatedPrivate(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	state := filepath.Join(t.TempDir(), "new", "state")
	w := startWorker(t, eng, nil, "--state-dir", state)
	wk := attach(t, eng)
	runOutputs(t, wk, "c1", step{"events": 1})
	for _, dir := range []string{state, filepath.Join(state, "runtime"), filepath.Join(state, "artifacts")} {
		if m := mode(t, dir); m != 0o700 {
			t.Errorf("%s is mode %04o, want 0700", dir, m)
		}
	}
	entries, _ := filepath.Glob(filepath.Join(state, "runtime", "*.py"))
	if len(entries) != 1 {
		t.Fatalf("runtime files: %v", entries)
	}
	for _, f := range append(entries, filepath.Join(state, "status.json")) {
		if m := mode(t, f); m&0o077 != 0 {
			t.Errorf("%s is mode %04o, want private", f, m)
		}
	}
	w.signal(syscall.SIGTERM)
	w.wait(20 * time.Second)
}

// Item 1: a runner script planted under the cached name, with the right
// size but other bytes, is replaced before anything executes it.
func TestPlantedRunnerIsNotExecuted(t *testing.T) {
	t.Parallel()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3")
	}
	embedded, err := os.ReadFile("../agent/runtime/worker_main.py")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(embedded)
	state := t.TempDir()
	marker := filepath.Join(t.TempDir(), "planted-code-ran")
	plant := []byte("open(" + strings.ReplaceAll(string(mustJSON(t, marker)), `"`, `'`) + ", 'w').write('owned')\n")
	plant = append(plant, []byte(strings.Repeat("#", len(embedded)-len(plant)-1)+"\n")...)
	if len(plant) != len(embedded) {
		t.Fatalf("plant is %d bytes, runner %d", len(plant), len(embedded))
	}
	os.Mkdir(filepath.Join(state, "runtime"), 0o700)
	cached := filepath.Join(state, "runtime", hex.EncodeToString(sum[:])+".py")
	if err := os.WriteFile(cached, plant, 0o600); err != nil {
		t.Fatal(err)
	}

	eng := startEngine(t, enginetest.Options{})
	w := startWorker(t, eng, nil, "--python", python, "--state-dir", state)
	wk := attach(t, eng)
	c, err := wk.Run(map[string]any{"op": "run", "call_id": "p1",
		"node":     map[string]any{"source": "def f():\n    return {\"x\": 41 + 1}\n", "filename": "f.py"},
		"function": "f", "inputs": map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := wait(t, c)
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("the planted script ran")
	}
	if !answer.OK {
		t.Errorf("the call failed: %s", answer.Raw)
	}
	if have, _ := os.ReadFile(cached); string(have) != string(embedded) {
		t.Errorf("the cached runner was not rewritten with the real one")
	}
	w.signal(syscall.SIGTERM)
	w.wait(20 * time.Second)
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Item 1: without HOME the worker uses STATE_DIRECTORY or XDG_CACHE_HOME,
// else stops and names --state-dir; it never falls back to /tmp.
func TestNoSharedStateDirFallback(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	base := []string{"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(t), "--runtime", "embedded"}
	env := append(envWithout("HOME", "XDG_CACHE_HOME"), "FLUKSIO_WORKER_TOKEN="+testToken)
	shared := filepath.Join(os.TempDir(), "fluksio-worker-"+strconv.Itoa(os.Getuid()))
	existed := exists(shared)
	if !existed {
		// Where a worker that falls back would have left its state.
		t.Cleanup(func() { os.RemoveAll(shared) })
	}

	w := startIn(t, t.TempDir(), env, base...)
	if code := w.wait(20 * time.Second); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if logs := w.logs.String(); !strings.Contains(logs, "--state-dir") || !strings.Contains(logs, "HOME") {
		t.Errorf("the message does not say to set --state-dir:\n%s", logs)
	}
	if !existed && exists(shared) {
		t.Errorf("the worker fell back to %s, a directory others can create first", shared)
	}

	xdg := t.TempDir()
	w = startIn(t, t.TempDir(), append(env, "XDG_CACHE_HOME="+xdg), base...)
	attach(t, eng)
	if m := mode(t, filepath.Join(xdg, "fluksio-worker")); m != 0o700 {
		t.Errorf("$XDG_CACHE_HOME/fluksio-worker is mode %04o, want 0700", m)
	}
	w.signal(syscall.SIGTERM)
	w.wait(20 * time.Second)
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// Item 1: the SLURM example gives the worker a fresh private state
// directory, not a name another user of the node could create first.
func TestSlurmExampleStateDirIsPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin, tmp, home := filepath.Join(dir, "bin"), filepath.Join(dir, "tmp"), filepath.Join(dir, "home")
	for _, d := range []string{bin, tmp, filepath.Join(home, ".config", "fluksio-worker")} {
		os.MkdirAll(d, 0o755)
	}
	os.Chmod(tmp, 0o1777)
	os.WriteFile(filepath.Join(home, ".config", "fluksio-worker", "token"), []byte(testToken), 0o600)
	// A stand-in worker that reports the state directory it was given.
	os.WriteFile(filepath.Join(bin, "fluksio-worker"), []byte("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --state-dir ] && echo \"$2\"; shift; done\n"), 0o755)
	cmd := exec.Command("bash", "../packaging/slurm/fluksio-worker.sbatch")
	cmd.Env = append(cleanEnv(), "PATH="+bin+":"+os.Getenv("PATH"), "HOME="+home, "TMPDIR="+tmp, "SLURM_JOB_ID=77")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the batch script: %v", err)
	}
	state := strings.TrimSpace(string(out))
	if state == "" || state == tmp || strings.HasSuffix(state, "-77") {
		t.Fatalf("--state-dir %q is a name others can guess", state)
	}
	if m := mode(t, state); m != 0o700 {
		t.Errorf("%s is mode %04o, want 0700", state, m)
	}
}
