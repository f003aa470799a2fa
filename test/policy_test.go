package test

// The code policy through the real binary and the embedded runtime on a
// real Python: a node file signed with `fluksio-worker sign` runs, the same
// file changed by one byte is refused, and the runner the engine serves is
// never used.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/policy"
)

func TestPolicySignedSourceThroughTheBinary(t *testing.T) {
	dir := t.TempDir()
	bin := workerBinary(t)
	key := filepath.Join(dir, "owner")
	node := filepath.Join(dir, "pipeline.py")
	src := "from fluksio import node, Port\n\n@node(requires=[Port('x', int)], provides=[Port('y', int)])\ndef double(x):\n    return {'y': 2 * x}\n"
	if err := os.WriteFile(node, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"keygen", "--out", key}, {"sign", "--key", key, node}} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("fluksio-worker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	signed, err := os.ReadFile(node)
	if err != nil {
		t.Fatal(err)
	}
	// The engine serves a runner of its own; with a policy on, it is not run.
	eng := startEngine(t, enginetest.Options{Runtime: []byte("import os\nos.system('touch " + filepath.Join(dir, "engine-runner-ran") + "')\n")})
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startBinary(t, []string{"FLUKSIO_ARTIFACT_CACHE=" + t.TempDir()}, "run", "--url", eng.AttachURL(), "--token-file", tokenFile,
		"--python", runtimePython(t), "--state-dir", t.TempDir(), "--warm", "0",
		"--allow-source", "signed", "--trust-key", key+".pub", "--allow-env", "WANDB_*")
	wk := attach(t, eng)

	req := nodeRun("signed", string(signed), "double", map[string]any{"x": 21})
	answer, _ := wait(t, startNode(t, wk, req))
	if !answer.OK || !strings.Contains(string(answer.Raw), `"y": 42`) && !strings.Contains(string(answer.Raw), `"y":42`) {
		t.Errorf("the signed node answered %s", answer.Raw)
	}
	tampered := strings.Replace(string(signed), "2 * x", "3 * x", 1)
	answer, _ = wait(t, startNode(t, wk, nodeRun("tampered", tampered, "double", map[string]any{"x": 21})))
	if answer.OK || answer.Error == nil || answer.Error.Type != "PolicyRefused" || !strings.Contains(answer.Error.Message, "does not match the source") {
		t.Errorf("the tampered node answered %s", answer.Raw)
	}
	// The signed node with an env that would load the engine's code
	// (OPENSSL_CONF names an openssl.cnf that loads a .so when the runner
	// imports hashlib; a bash function replaces echo) is refused; with
	// what only tunes and what --allow-env names, it runs.
	for _, env := range []map[string]any{{"OPENSSL_CONF": filepath.Join(dir, "openssl.cnf")}, {"BASH_FUNC_echo%%": "() { touch " + dir + "/owned; }"}} {
		req := nodeRun("env", string(signed), "double", map[string]any{"x": 21})
		req["env"] = env
		answer, _ = wait(t, startNode(t, wk, req))
		if answer.OK || answer.Error == nil || answer.Error.Type != "PolicyRefused" || !strings.Contains(answer.Error.Message, "--allow-env") {
			t.Errorf("the signed node with env %v answered %s", env, answer.Raw)
		}
	}
	req = nodeRun("tuned", string(signed), "double", map[string]any{"x": 21})
	req["env"] = map[string]any{"OMP_NUM_THREADS": "2", "LANG": "C.UTF-8", "WANDB_PROJECT": "p"}
	if answer, _ = wait(t, startNode(t, wk, req)); !answer.OK {
		t.Errorf("the signed node with tuning env answered %s", answer.Raw)
	}
	if _, err := os.Stat(filepath.Join(dir, "engine-runner-ran")); err == nil {
		t.Error("the engine's runner ran under a code policy")
	}
}

// TestKeysAndHooksOthersMayWriteRefusedAtStart: a --trust-key directory
// or key, or a hook's program, that a user other than root and the
// worker's may change is refused at start (exit 2, saying what to change)
// and the worker never attaches; kept private, the same start attaches.
func TestKeysAndHooksOthersMayWriteRefusedAtStart(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, enginetest.Options{})
	setup := func(t *testing.T) (keys, hook string) {
		dir := filepath.Join(t.TempDir(), "etc")
		keys = filepath.Join(dir, "keys")
		if err := os.MkdirAll(keys, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := policy.GenerateKey(filepath.Join(keys, "owner")); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(keys, "owner"))
		hook = filepath.Join(dir, "gpu-free.sh")
		if err := os.WriteFile(hook, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{dir, keys, hook} {
			os.Chmod(p, 0o755)
		}
		os.Chmod(filepath.Join(keys, "owner.pub"), 0o644)
		return keys, hook
	}
	for _, tc := range []struct {
		name  string
		spoil func(keys, hook string)
		says  []string
	}{
		{"a key directory at 0777", func(keys, hook string) { os.Chmod(keys, 0o777) }, []string{"--trust-key KEYS", "mode 0777", "chmod go-w KEYS"}},
		{"a key another user owns", func(keys, hook string) { os.Chown(filepath.Join(keys, "owner.pub"), neighbour, neighbour) },
			[]string{"--trust-key KEYS/owner.pub", "belongs to uid 4242", "chown"}},
		{"a pre-call hook at 0777", func(keys, hook string) { os.Chmod(hook, 0o777) }, []string{"--pre-call-hook program HOOK", "mode 0777", "chmod go-w HOOK"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, hook := setup(t)
			tc.spoil(keys, hook)
			w := startWorker(t, eng, nil, "--allow-source", "signed", "--trust-key", keys, "--pre-call-hook", hook)
			if code := w.wait(20 * time.Second); code != 2 {
				t.Fatalf("exit %d, want 2 (refused at start)", code)
			}
			logs := w.logs.String()
			for _, want := range tc.says {
				want = strings.NewReplacer("KEYS", keys, "HOOK", hook).Replace(want)
				if !strings.Contains(logs, want) {
					t.Errorf("the message does not say %q:\n%s", want, logs)
				}
			}
		})
	}
	if len(eng.Hellos()) != 0 {
		t.Errorf("a worker attached with keys or a hook others may change")
	}
	keys, hook := setup(t)
	startWorker(t, eng, nil, "--allow-source", "signed", "--trust-key", keys, "--pre-call-hook", hook)
	attach(t, eng)
}
