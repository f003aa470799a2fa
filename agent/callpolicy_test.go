package agent_test

// The code policy and the call hooks at dispatch, with the fake engine and
// the fake runner (which ignores the node it is sent): what is refused is
// answered at once and never started; what the hooks decline goes back to
// the engine as NodeCancelled.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/policy"
	"github.com/fluksio/fluksio-worker/agent/protocol"
	"github.com/fluksio/fluksio-worker/agent/status"
)

// TestPolicyRefusesCodeAndSideDoors: a module outside --allow-module,
// shipped source under --allow-source none, and an env that sets a
// variable neither built-in nor named by --allow-env (LD_PRELOAD,
// OPENSSL_CONF, BASH_FUNC_echo%%, git's config by environment) are each
// answered PolicyRefused, with the rule and what the owner can change, and
// never take a slot; an allowed module runs with a tuning variable and
// what --allow-env names.
func TestPolicyRefusesCodeAndSideDoors(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--listen", "127.0.0.1:0", "--allow-module", "acme_pipelines.*", "--allow-source", "none",
		"--allow-env", "SEED", "--allow-env", "WANDB_*")
	base := monitoring(t, f)
	refused := func(id string, req map[string]any, want ...string) {
		t.Helper()
		req["call_id"] = id
		m := answerOf(t, f.runReq(t, req))
		declined(t, m, policy.ErrorType, want[0])
		for _, w := range want[1:] {
			if m.Error == nil {
				break
			}
			if !strings.Contains(m.Error.Message, w) {
				t.Errorf("%s: the refusal does not say %q: %s", id, w, m.Error.Message)
			}
		}
	}
	allowed := map[string]any{"module": "acme_pipelines.train"}
	refused("module", map[string]any{"node": map[string]any{"module": "os"}, "function": "system"},
		"--allow-module acme_pipelines.*", "module os is not among", "a code policy keeps out")
	refused("source", map[string]any{"op": "compile", "node": map[string]any{"source": "import os\n", "filename": "evil.py"}},
		"--allow-source none", "evil.py", "--allow-source signed")
	refused("preload", map[string]any{"node": allowed, "env": map[string]any{"LD_PRELOAD": "/tmp/x.so", "SEED": 1}},
		"LD_PRELOAD", "--allow-env LD_PRELOAD")
	refused("pythonpath", map[string]any{"node": allowed, "env": map[string]any{"PYTHONPATH": "/tmp"}},
		"PYTHONPATH")
	refused("openssl", map[string]any{"node": allowed, "env": map[string]any{"OPENSSL_CONF": "/state/artifacts/openssl.cnf"}},
		"OPENSSL_CONF", "--allow-env OPENSSL_CONF")
	refused("bash-function", map[string]any{"node": allowed, "env": map[string]any{"BASH_FUNC_echo%%": "() { touch /tmp/owned; }"}},
		"BASH_FUNC_echo%%", "--allow-env BASH_FUNC_echo%%")
	refused("git-config", map[string]any{"node": allowed, "env": map[string]any{"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "/tmp/x"}},
		"GIT_CONFIG_COUNT, GIT_CONFIG_KEY_0, GIT_CONFIG_VALUE_0")
	refused("git-parameters", map[string]any{"node": allowed, "env": map[string]any{"GIT_CONFIG_PARAMETERS": "'core.fsmonitor'='/tmp/x'"}},
		"GIT_CONFIG_PARAMETERS")
	ok := answerOf(t, f.runReq(t, map[string]any{"call_id": "allowed", "node": allowed,
		"env": map[string]any{"SEED": 1, "WANDB_PROJECT": "p", "OMP_NUM_THREADS": 2, "LANG": "C.UTF-8"}}))
	if !ok.OK {
		t.Errorf("an allowed module answered %s", ok.Raw)
	}
	// status counts them beside the calls done, as the metrics do.
	eventually(t, goneTimeout, "the status file to count 8 calls declined by policy and 1 done", func() bool {
		st, _ := status.Read(f.stateDir)
		return st.CallsDeclined["policy"] == 8 && st.CallsDone == 1 && st.CallsRunning == 0
	})
	_, m := httpGet(t, base+"/metrics")
	for _, want := range []string{`fluksio_worker_calls_declined_total{reason="policy"} 8`, `fluksio_worker_calls_started_total{op="run"} 1`, `fluksio_worker_calls_started_total{op="compile"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics does not say %s:\n%s", want, m)
		}
	}
}

// TestSignedSourceRunsTamperedIsRefused: under --allow-source signed, the
// source signed with a trusted key runs; the same file with one byte
// changed is refused, saying so.
func TestSignedSourceRunsTamperedIsRefused(t *testing.T) {
	t.Parallel()
	key := filepath.Join(t.TempDir(), "owner")
	if _, err := policy.GenerateKey(key); err != nil {
		t.Fatal(err)
	}
	priv, err := policy.ReadPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	signed := string(policy.Sign([]byte("from fluksio import node\n\n@node()\ndef train():\n    return 1\n"), priv, time.Time{}))
	f := serveFake(t, enginetest.Options{}, "--allow-source", "signed", "--trust-key", key+policy.PublicKeySuffix)
	ok := answerOf(t, f.runReq(t, map[string]any{"call_id": "signed", "node": map[string]any{"source": signed, "filename": "train.py"}}))
	if !ok.OK {
		t.Errorf("signed source answered %s", ok.Raw)
	}
	tampered := strings.Replace(signed, "return 1", "return 2", 1)
	declined(t, answerOf(t, f.runReq(t, map[string]any{"call_id": "tampered", "node": map[string]any{"source": tampered, "filename": "train.py"}})),
		policy.ErrorType, "does not match the source")
}

// TestPreCallHookDeclines: a hook that exits 1 declines the call as a
// drain does (NodeCancelled), its first stderr line the reason; it read
// the call's metadata on stdin.
func TestPreCallHookDeclines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	seen := filepath.Join(dir, "call.json")
	f := serveFake(t, enginetest.Options{}, "--pre-call-hook", "cat > "+seen+"; echo 'GPU 0 is busy (93% used)' >&2; exit 1")
	src := "x = 1\n"
	declined(t, answerOf(t, f.runReq(t, map[string]any{"call_id": "busy", "function": "train",
		"node": map[string]any{"source": src, "filename": "train.py"}, "env": map[string]any{"SEED": 1, "OMP_NUM_THREADS": 2, "CUDA_VISIBLE_DEVICES": "1"}})),
		protocol.TypeNodeCancelled, "declined by this worker's pre-call hook: GPU 0 is busy (93% used)")
	var got struct {
		CallID, Op, Function, Filename, Engine string
		SourceSHA256                           string   `json:"source_sha256"`
		EnvKeys                                []string `json:"env_keys"`
		CUDA                                   string   `json:"cuda_visible_devices"`
	}
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("the hook read %q: %v", b, err)
	}
	if got.Op != "run" || got.Function != "train" || got.Filename != "train.py" || len(got.SourceSHA256) != 64 ||
		strings.Join(got.EnvKeys, ",") != "CUDA_VISIBLE_DEVICES,OMP_NUM_THREADS,SEED" || got.CUDA != "1" || !strings.HasPrefix(got.Engine, "ws://") || strings.Contains(string(b), fakeToken) {
		t.Errorf("the hook read %s", b)
	}
	if !strings.Contains(string(b), `"call_id":"busy"`) {
		t.Errorf("the hook was not told the call id: %s", b)
	}
}

// TestPreCallHookThatHangs: a hook past --hook-timeout is killed and its
// call declined; the worker goes on taking calls.
func TestPreCallHookThatHangs(t *testing.T) {
	t.Parallel()
	// The hook of the call "hangs" hangs; the others' accept. The bound
	// leaves a loaded machine time to start a shell.
	f := serveFake(t, enginetest.Options{}, "--pre-call-hook", `grep -q '"call_id":"hangs"' && exec sleep 600; exit 0`, "--hook-timeout", "3s")
	declined(t, answerOf(t, f.run(t, "hangs")), protocol.TypeNodeCancelled, "declined by this worker's pre-call hook: it did not answer within 3s")
	if answer := answerOf(t, f.run(t, "next")); !answer.OK {
		t.Errorf("the call after a hung hook answered %s", answer.Raw)
	}
}

// TestPostCallHook: the hook hears each call's outcome once its processes
// are gone, within the call's slot (the next call waits for it), and its
// failure is logged, the call's answer untouched.
func TestPostCallHook(t *testing.T) {
	t.Parallel()
	outcomes := filepath.Join(t.TempDir(), "outcomes")
	// The hook's input ends with a newline: appended, one record a line.
	f := serveFake(t, enginetest.Options{}, "--parallel", "1", "--post-call-hook", "cat >> "+outcomes+"; echo 'scratch is gone' >&2; exit 7")
	if a := answerOf(t, f.run(t, "first")); !a.OK {
		t.Fatalf("first answered %s", a.Raw)
	}
	declined(t, answerOf(t, f.run(t, "second", map[string]any{"exit": 3})), protocol.TypeRemoteError, "")
	// The third call took the slot after the second's hook was done.
	answerOf(t, f.run(t, "third"))
	b, err := os.ReadFile(outcomes)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 3 || lines[len(lines)-1] != "" {
		t.Fatalf("the hook heard %q; want one JSON record a line, each ending with a newline", b)
	}
	var first, second struct {
		CallID    string `json:"call_id"`
		Outcome   string
		ErrorType string `json:"error_type"`
		CPUMS     *int64 `json:"cpu_ms"`
	}
	json.Unmarshal([]byte(lines[0]), &first)
	json.Unmarshal([]byte(lines[1]), &second)
	if first.CallID != "first" || first.Outcome != "ok" || first.CPUMS == nil || second.CallID != "second" || second.Outcome != "error" || second.ErrorType != protocol.TypeRemoteError {
		t.Errorf("the hook heard:\n%s", b)
	}
	if !strings.Contains(f.log.String(), "the post-call hook failed; the call's answer stands") || !strings.Contains(f.log.String(), "scratch is gone") {
		t.Error("the log does not say the post-call hook failed")
	}
}

// TestPreCallHookCancelled: a cancel for a call whose pre-call hook still
// runs stops the hook and answers the call as cancelled before it started.
func TestPreCallHookCancelled(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--pre-call-hook", "exec sleep 600", "--hook-timeout", "10m")
	c := f.run(t, "waits")
	if err := f.wk.Cancel("waits"); err != nil {
		t.Fatal(err)
	}
	declined(t, answerOf(t, c), protocol.TypeNodeCancelled, "the call was cancelled before it started")
}

// TestPostCallHookThatHangs: a post-call hook past --hook-timeout is
// killed; it holds the slot no longer than that, and the calls' answers
// stand.
// TestHookStderrIsLoggedWhateverItsExit: hooks that exit 0, taking the
// call, still have what they said on stderr logged (a missing tool, say),
// with the call it was about.
func TestHookStderrIsLoggedWhateverItsExit(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1",
		"--pre-call-hook", "echo 'nvidia-smi: not found' >&2; exit 0", "--post-call-hook", "echo 'scratch: 3 files left' >&2")
	if a := answerOf(t, f.run(t, "taken")); !a.OK {
		t.Fatalf("the call answered %s", a.Raw)
	}
	// The next call takes the slot once the first's post-call hook is done.
	answerOf(t, f.run(t, "next"))
	for _, want := range []string{
		`msg="the pre-call hook wrote on stderr" call_id=taken exit=0 stderr="nvidia-smi: not found"`,
		`msg="the post-call hook wrote on stderr"`, `stderr="scratch: 3 files left"`,
	} {
		if !strings.Contains(f.log.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, f.log.String())
		}
	}
}

func TestPostCallHookThatHangs(t *testing.T) {
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1", "--post-call-hook", "exec sleep 600", "--hook-timeout", "300ms")
	for _, id := range []string{"first", "second"} {
		if a := answerOf(t, f.run(t, id)); !a.OK {
			t.Errorf("%s answered %s", id, a.Raw)
		}
	}
	// The second call had the slot only once the first call's hook was
	// killed at its bound.
	if !strings.Contains(f.log.String(), "did not finish within 300ms") {
		t.Errorf("the log does not say the post-call hook was killed:\n%s", f.log.String())
	}
}

// TestPreCallHooksAtMostParallel: a pipeline's whole fan-out sent to a
// --parallel 1 worker runs its pre-call hooks one at a time, each in the
// slot its call takes, the rest of the calls waiting in the queue; every
// call runs. Each hook counts the hooks running with it (itself included)
// and lingers, so hooks run at once would see each other.
func TestPreCallHooksAtMostParallel(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	running, seen := filepath.Join(dir, "running"), filepath.Join(dir, "seen")
	if err := os.Mkdir(running, 0o755); err != nil {
		t.Fatal(err)
	}
	hook := fmt.Sprintf(`: > '%[1]s'/$$; ls '%[1]s' | wc -l >> '%[2]s'; sleep 0.2; rm -f '%[1]s'/$$; exit 0`, running, seen)
	f := serveFake(t, enginetest.Options{}, "--parallel", "1", "--pre-call-hook", hook)
	const calls = 12
	var sent []*enginetest.Call
	for i := range calls {
		sent = append(sent, f.run(t, fmt.Sprint("fan-", i)))
	}
	for _, c := range sent {
		if a := answerOf(t, c); !a.OK {
			t.Errorf("%s answered %s", c.ID, a.Raw)
		}
	}
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	counts := strings.Fields(string(b))
	most := 0
	for _, n := range counts {
		v, _ := strconv.Atoi(n)
		most = max(most, v)
	}
	if len(counts) != calls || most != 1 {
		t.Errorf("%d pre-call hooks ran, at most %d at once (each saw %v); want %d, one at a time under --parallel 1", len(counts), most, counts, calls)
	}
}

// TestPreCallHookCallGetsHeartbeats: a call whose pre-call hook runs longer
// than the heartbeat interval hears heartbeats from the book, as a waiting
// call does, and then runs.
func TestPreCallHookCallGetsHeartbeats(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the 10 s heartbeat")
	}
	t.Parallel()
	f := serveFake(t, enginetest.Options{}, "--parallel", "1", "--pre-call-hook", "sleep 11; exit 0", "--hook-timeout", "1m")
	c := f.run(t, "slow-hook", map[string]any{"announce": true})
	m, err := c.Next(timeoutCtx(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Raw) != `{"call_id":"slow-hook","event":"heartbeat"}` {
		t.Fatalf("the first frame while its pre-call hook ran was %s, want a heartbeat", m.Raw)
	}
	answer, events := wait(t, c)
	if !answer.OK || !startedIn(events) {
		t.Errorf("the call answered %s after %q", answer.Raw, rawOf(events))
	}
}

// TestDrainRunsCallWhosePreCallHookTakesIt: a call whose pre-call hook runs
// when a drain begins was admitted before it: it runs once its hook takes
// it, as a call waiting for a slot does, and the drain ends after its
// answer. A call sent during the drain is declined.
func TestDrainRunsCallWhosePreCallHookTakesIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	began, gate := filepath.Join(dir, "began"), filepath.Join(dir, "gate")
	hook := fmt.Sprintf(`: > '%s'; while [ ! -e '%s' ]; do sleep 0.05; done; exit 0`, began, gate)
	f := serveFake(t, enginetest.Options{}, "--parallel", "1", "--pre-call-hook", hook, "--hook-timeout", "1m")
	c := f.run(t, "vetted", map[string]any{"announce": true})
	eventually(t, callTimeout, "the pre-call hook to run", func() bool { _, err := os.Stat(began); return err == nil })
	f.a.Drain()
	declined(t, answerOf(t, f.run(t, "late")), protocol.TypeNodeCancelled, "the worker is draining")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	answer, events := wait(t, c)
	if !answer.OK || !startedIn(events) {
		t.Errorf("the call whose hook ran when the drain began answered %s after %q", answer.Raw, rawOf(events))
	}
	if err := f.result(t); err != nil {
		t.Fatalf("Serve after the drain: %v", err)
	}
}

// TestStopAnswersCallInPreCallHook: a stop kills the pre-call hooks that
// run and answers their calls NodeCancelled, "the worker is stopping";
// the worker then exits.
func TestStopAnswersCallInPreCallHook(t *testing.T) {
	t.Parallel()
	began := filepath.Join(t.TempDir(), "began")
	f := serveFake(t, enginetest.Options{}, "--pre-call-hook", fmt.Sprintf(`: > '%s'; exec sleep 600`, began), "--hook-timeout", "10m")
	c := f.run(t, "vetting", map[string]any{"announce": true})
	eventually(t, callTimeout, "the pre-call hook to run", func() bool { _, err := os.Stat(began); return err == nil })
	f.a.Stop()
	answer, events := wait(t, c)
	if answer.Error == nil || answer.Error.Type != protocol.TypeNodeCancelled || answer.Error.Message != "the worker is stopping" || startedIn(events) {
		t.Errorf("a call in its pre-call hook at a stop answered %s after %q", answer.Raw, rawOf(events))
	}
	if err := f.result(t); err != nil {
		t.Fatalf("Serve after the stop: %v", err)
	}
}
