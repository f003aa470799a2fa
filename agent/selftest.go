package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/logging"
	"github.com/fluksio/fluksio-worker/agent/runner"
	"github.com/fluksio/fluksio-worker/agent/runtime"
	"github.com/fluksio/fluksio-worker/platform"
)

// selftestTimeout bounds the whole self-test; the example takes seconds.
const selftestTimeout = 3 * time.Minute

// SelftestCommand is `fluksio-worker selftest`: it proves the whole path on
// this machine without an engine. It starts the fake engine on loopback,
// attaches a worker to it in this process, and through the embedded
// runtime on the chosen Python compiles the example node file, runs its
// generator node `train` (showing the streamed metrics as they arrive),
// and loads back the model artifact `train` saved. Exit 0 only if all of
// it worked.
func SelftestCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := config.NewCommand("selftest", writeSelftestUsage)
	python := cmd.String("python", "", "")
	steps := cmd.Int("steps", 5, "")
	verbose := cmd.Bool("verbose", false, "")
	nodeFile := cmd.String("node", "", "")
	function := cmd.String("function", "", "")
	inputs := cmd.String("inputs", "", "")
	if err := cmd.Parse(args); err != nil {
		return cmd.Answer(err, stdout, stderr)
	}
	if *steps < 1 {
		fmt.Fprintln(stderr, "fluksio-worker selftest: takes only --python P, --steps N (>= 1), --node FILE --function NAME [--inputs JSON] and --verbose")
		return config.ExitUsage
	}
	st := &selftest{out: stdout, steps: *steps}
	if *nodeFile != "" || *function != "" || *inputs != "" {
		var err error
		if st.own, err = readOwnNode(*nodeFile, *function, *inputs, cmd.Given("steps")); err != nil {
			fmt.Fprintf(stderr, "fluksio-worker selftest: %v (see 'fluksio-worker selftest --help')\n", err)
			return config.ExitUsage
		}
	}
	// SIGTERM (a CI runner's timeout, systemd) ends the self-test as SIGINT
	// does, through the cleanup below: its engine, worker and temporary
	// directory do not outlive it.
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	if st.own == nil {
		// The example takes seconds; a node of your own runs as long as it
		// runs (Ctrl-C stops it).
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, selftestTimeout)
		defer cancel()
	}
	// The worker's own log goes to stderr with --verbose; otherwise it is
	// kept and shown only if something fails.
	var agentLog bytes.Buffer
	logTo := io.Writer(&agentLog)
	if *verbose {
		logTo = stderr
	}
	level := "info"
	if *verbose {
		level = "debug"
	}
	token := randomToken()
	err := st.run(ctx, *python, token, logging.NewLogger(logTo, "text", level, token))
	if err != nil {
		fmt.Fprintf(stdout, "\nFAILED: %v\n", err)
		if errors.Is(err, errNodeFailed) {
			return config.ExitRefused // the node's own error, shown above
		}
		if !*verbose && agentLog.Len() > 0 {
			fmt.Fprintf(stderr, "\nThe worker's log:\n%s", logging.LastLines(agentLog.String(), 60)+"\n")
		}
		return config.ExitRefused
	}
	if st.own == nil {
		st.report()
	}
	return config.ExitOK
}

func writeSelftestUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: fluksio-worker selftest [--python P] [--steps N] [--verbose]
       fluksio-worker selftest --node FILE --function NAME [--inputs JSON] [--python P] [--verbose]

Proves this machine can run Fluksio nodes, with no engine needed: starts a
built-in engine on loopback, attaches a worker to it, and runs the bundled
example node (a small training loop) through the embedded runtime on the
chosen Python: compile, a generator node whose metrics stream live, and an
artifact saved and loaded back. Exits 0 only if all of it worked.

With --node, it runs your own node the same way instead: FILE is compiled
(the nodes it defines are listed), then the function NAME is called with
--inputs, and every message an engine would receive is printed as it
arrives (events, with the seconds since the call was sent), then the
answer and how long the call took. Artifacts it saves go to the built-in
engine and are gone afterwards. It runs until the node returns (Ctrl-C
stops it).

Options:
  --python P        the interpreter nodes will run on (default: python3 on PATH)
  --steps N         training steps of the example (default 5)
  --node FILE       a Python file of nodes of your own, run instead of the example
  --function NAME   the node of FILE to call
  --inputs JSON     its inputs, a JSON object (default {})
  --verbose         show the worker's own log as it runs

Exit status: 0 all of it worked, 1 a step failed or the node answered an
error (it says which), 2 bad options or a FILE that cannot be read.
`)
}

// selftest carries what the report shows.
type selftest struct {
	out   io.Writer
	steps int
	own   *ownNode // --node: the user's node, run instead of the example

	python, pyVersion string
	hello             enginetest.Hello
	runtimeHash       string
	timings           []string
	streamed          int
	model             map[string]any
}

func (st *selftest) say(format string, args ...any) {
	fmt.Fprintf(st.out, format+"\n", args...)
}

func (st *selftest) run(ctx context.Context, python, token string, log *slog.Logger) error {
	path, version, err := platform.FindPython(ctx, python)
	if err != nil {
		return fmt.Errorf("finding Python: %w", err)
	}
	st.python, st.pyVersion = path, version
	st.runtimeHash = runtime.EmbeddedHash()
	st.say("fluksio-worker %s selftest: %s (%s), embedded runtime %s", Version, path, version, st.runtimeHash[:12])

	tmp, err := os.MkdirTemp("", "fluksio-selftest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	eng, err := enginetest.Start(enginetest.Options{Tokens: []string{token}})
	if err != nil {
		return fmt.Errorf("starting the built-in engine: %w", err)
	}
	defer eng.Close()

	cfg := config.DefaultConfig()
	cfg.URL = eng.AttachURL()
	cfg.Token = token
	cfg.Name = "selftest"
	cfg.Python = python
	cfg.Runtime = "embedded"
	cfg.StateDir = tmp
	worker := New(cfg, log, path, filepath.Join(tmp, "state"))
	served := make(chan error, 1)
	go func() { served <- worker.Serve(ctx) }()
	defer func() {
		worker.Stop()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
		}
	}()

	attachCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	wk, err := eng.NextWorker(attachCtx)
	if err != nil {
		select {
		case serveErr := <-served:
			return fmt.Errorf("the worker did not attach: %v", serveErr)
		default:
			return fmt.Errorf("the worker did not attach: %w", err)
		}
	}
	st.hello = wk.Hello

	// The cache is the self-test's own, so the load really fetches.
	env := map[string]any{runner.ArtifactCacheEnv: filepath.Join(tmp, "artifacts")}
	if st.own != nil {
		return st.runOwn(ctx, wk, env)
	}
	if err := st.compile(ctx, wk); err != nil {
		return err
	}
	final, err := st.train(ctx, wk, eng, env)
	if err != nil {
		return err
	}
	return st.evaluate(ctx, wk, env, final)
}

// roundTrip sends one request and reads its call to the answer, handing
// each message before it to event with the seconds since the request.
func roundTrip(ctx context.Context, wk *enginetest.Worker, req map[string]any, event func(m enginetest.Message, took float64)) (answer map[string]any, raw []byte, took float64, err error) {
	id := req["call_id"].(string)
	started := time.Now()
	c, err := wk.Run(req)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("%s: sending the call: %w", id, err)
	}
	for {
		m, err := c.Next(ctx)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("%s: no answer: %w", id, err)
		}
		took := time.Since(started).Seconds()
		if !m.IsAnswer() {
			event(m, took)
			continue
		}
		if err := m.Decode(&answer); err != nil {
			return nil, nil, 0, fmt.Errorf("%s: the answer is not JSON: %w", id, err)
		}
		return answer, m.Raw, took, nil
	}
}

// call sends one request and reads it to its answer, showing stream events
// as they arrive.
func (st *selftest) call(ctx context.Context, wk *enginetest.Worker, req map[string]any, live bool) (map[string]any, error) {
	id := req["call_id"].(string)
	answer, _, took, err := roundTrip(ctx, wk, req, func(m enginetest.Message, took float64) {
		if live && m.Event == "stream" {
			var ev struct {
				Values map[string]any `json:"values"`
			}
			m.Decode(&ev)
			st.streamed++
			st.say("  %6.2fs  %s", took, formatValues(ev.Values))
		}
	})
	if err != nil {
		return nil, err
	}
	st.timings = append(st.timings, fmt.Sprintf("%s %.2fs", strings.TrimPrefix(id, "selftest-"), took))
	if answer["ok"] != true {
		return nil, fmt.Errorf("%s: %s", id, describeError(answer))
	}
	return answer, nil
}

func (st *selftest) compile(ctx context.Context, wk *enginetest.Worker) error {
	answer, err := st.call(ctx, wk, map[string]any{
		"op": "compile", "call_id": "selftest-compile",
		"node": map[string]any{"source": runtime.Example, "filename": "train.py"},
	}, false)
	if err != nil {
		return err
	}
	var names []string
	nodes, _ := answer["nodes"].([]any)
	for _, n := range nodes {
		if n, ok := n.(map[string]any); ok {
			names = append(names, fmt.Sprint(n["name"]))
		}
	}
	if strings.Join(names, ",") != "train,evaluate" {
		return fmt.Errorf("compile: found nodes %v, want train and evaluate", names)
	}
	st.say("compile   train.py defines %s", strings.Join(names, " and "))
	return nil
}

func (st *selftest) train(ctx context.Context, wk *enginetest.Worker, eng *enginetest.Engine, env map[string]any) (map[string]any, error) {
	st.say("train     %d steps, streaming:", st.steps)
	answer, err := st.call(ctx, wk, map[string]any{
		"op": "run", "call_id": "selftest-train", "env": env,
		"node":     map[string]any{"source": runtime.Example, "filename": "train.py"},
		"function": "train", "inputs": map[string]any{"steps": st.steps},
		"settings": map[string]any{"delay": 0.2},
	}, true)
	if err != nil {
		return nil, err
	}
	if st.streamed != 2*st.steps {
		return nil, fmt.Errorf("train: %d stream events arrived, want %d", st.streamed, 2*st.steps)
	}
	outputs, _ := answer["outputs"].(map[string]any)
	model, _ := outputs["model"].(map[string]any)
	final, _ := outputs["final"].(map[string]any)
	digest, _ := model["digest"].(string)
	stored, ok := eng.Artifact(digest)
	if !ok {
		return nil, fmt.Errorf("train: the model artifact %q never reached the engine's store", digest)
	}
	if sum := sha256.Sum256(stored); digest != "sha256:"+hex.EncodeToString(sum[:]) {
		return nil, fmt.Errorf("train: the engine holds bytes that do not match %s", digest)
	}
	st.model = model
	st.say("train     final %s; model saved as %s", formatValues(final), digest)
	return final, nil
}

func (st *selftest) evaluate(ctx context.Context, wk *enginetest.Worker, env map[string]any, final map[string]any) error {
	answer, err := st.call(ctx, wk, map[string]any{
		"op": "run", "call_id": "selftest-evaluate", "env": env,
		"node":     map[string]any{"source": runtime.Example, "filename": "train.py"},
		"function": "evaluate", "inputs": map[string]any{"model": st.model},
	}, false)
	if err != nil {
		return err
	}
	outputs, _ := answer["outputs"].(map[string]any)
	if outputs["weight"] != final["weight"] {
		return fmt.Errorf("evaluate: loaded weight %v, train saved %v", outputs["weight"], final["weight"])
	}
	st.say("evaluate  loaded the model back: weight %v", outputs["weight"])
	return nil
}

func (st *selftest) report() {
	inv := st.hello.Inventory
	ram := "unknown"
	if inv.RAMMB != nil {
		ram = fmt.Sprintf("%d MiB", *inv.RAMMB)
	}
	venv := st.hello.VenvDigest
	switch venv {
	case "":
		venv = "none (pip freeze could not run)"
	case emptyVenvDigest:
		venv += " (pip freeze listed nothing: this Python has no pip, or no packages installed)"
	default:
		venv += " (pip freeze's packages, hashed: the engine may match a node's environment on it)"
	}
	st.say("")
	st.say("selftest passed")
	st.say("  python     %s (%s)", st.python, st.pyVersion)
	st.say("  runtime    embedded, sha256 %s", st.runtimeHash)
	st.say("  inventory  %d CPUs, %d GPUs seen, %s RAM", inv.CPUs, inv.GPUs, ram)
	st.say("  venv       %s", venv)
	st.say("  calls      %s", strings.Join(st.timings, ", "))
	st.say("  artifact   %v, %v bytes, saved and loaded back", st.model["name"], st.model["size"])
}

// emptyVenvDigest is the venv digest of an empty pip freeze (the first 16
// hex digits of sha256 of nothing): a Python without pip reports it.
const emptyVenvDigest = "e3b0c44298fc1c14"

// describeError renders an error answer for a person.
func describeError(answer map[string]any) string {
	e, _ := answer["error"].(map[string]any)
	if e == nil {
		b, _ := json.Marshal(answer)
		return "unexpected answer " + string(b)
	}
	text := fmt.Sprint(e["short"])
	// A traceback without the node's frames is the short line again.
	if tb, _ := e["traceback"].(string); strings.TrimSpace(tb) != "" && strings.TrimSpace(tb) != text {
		text += "\n" + strings.TrimRight(tb, "\n")
	}
	return text
}

// formatValues prints a stream or output dict in key order, numbers short.
func formatValues(values map[string]any) string {
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		v := values[k]
		if f, ok := v.(float64); ok {
			parts[i] = fmt.Sprintf("%s=%.6g", k, f)
		} else {
			parts[i] = fmt.Sprintf("%s=%v", k, v)
		}
	}
	return strings.Join(parts, " ")
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "selftest-" + hex.EncodeToString(b)
}
