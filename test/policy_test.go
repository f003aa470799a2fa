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

	"github.com/fluksio/fluksio-worker/agent/enginetest"
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
