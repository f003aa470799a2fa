package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// `selftest --node FILE --function NAME [--inputs JSON]`: a node of the
// user's own, run through the same built-in engine and worker as the
// example, printing what an engine would receive.

// ownNode is the node --node names, read and checked before anything starts.
type ownNode struct {
	file     string         // as given, for the messages
	source   string         // the file's text, shipped as an engine ships it
	function string         // the node to call
	inputs   map[string]any // its inputs
}

// errNodeFailed marks the node's own error answer: the self-test itself
// worked, the node did not.
var errNodeFailed = errors.New("the node answered an error")

// readOwnNode checks the --node options together and reads the file.
func readOwnNode(file, function, inputs string, stepsGiven bool) (*ownNode, error) {
	switch {
	case file == "":
		return nil, errors.New("--function and --inputs need --node FILE, the Python file that defines the node")
	case function == "":
		return nil, fmt.Errorf("--node %s needs --function NAME, the node to call", file)
	case stepsGiven:
		return nil, errors.New("--steps is the example's; with --node, give the node's inputs with --inputs")
	}
	own := &ownNode{file: file, function: function, inputs: map[string]any{}}
	if inputs != "" {
		if err := json.Unmarshal([]byte(inputs), &own.inputs); err != nil || own.inputs == nil {
			return nil, fmt.Errorf(`--inputs must be a JSON object of the node's inputs, such as '{"steps": 3}': %q is not one`, inputs)
		}
	}
	source, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading --node: %w", err)
	}
	own.source = string(source)
	return own, nil
}

// runOwn compiles the user's file, then calls its node, printing each
// message the engine receives and then the answer.
func (st *selftest) runOwn(ctx context.Context, wk *enginetest.Worker, env map[string]any) error {
	own := st.own
	node := map[string]any{"source": own.source, "filename": filepath.Base(own.file)}
	compiled, err := st.exchange(ctx, wk, map[string]any{"op": "compile", "call_id": "selftest-compile", "node": node})
	if err != nil {
		return err
	}
	if compiled["ok"] != true {
		return fmt.Errorf("%w: compile: %s", errNodeFailed, describeError(compiled))
	}
	var names []string
	nodes, _ := compiled["nodes"].([]any)
	for _, n := range nodes {
		if n, ok := n.(map[string]any); ok {
			names = append(names, fmt.Sprint(n["name"]))
		}
	}
	st.say("compile   %s defines %s", own.file, orNone(names))
	inputs, _ := json.Marshal(own.inputs)
	st.say("run       %s(%s); what the engine receives:", own.function, inputs)
	answer, err := st.exchange(ctx, wk, map[string]any{
		"op": "run", "call_id": "selftest-run", "env": env,
		"node": node, "function": own.function, "inputs": own.inputs,
	})
	if err != nil {
		return err
	}
	if answer["ok"] != true {
		return fmt.Errorf("%w: %s", errNodeFailed, describeError(answer))
	}
	return nil
}

// exchange sends one request and prints every message of its call as the
// engine receives it, the answer last with how long the call took.
func (st *selftest) exchange(ctx context.Context, wk *enginetest.Worker, req map[string]any) (map[string]any, error) {
	show := req["op"] == "run"
	answer, raw, took, err := roundTrip(ctx, wk, req, func(m enginetest.Message, took float64) {
		if show {
			st.say("  %7.2fs  %-9s %s", took, m.Event, m.Raw)
		}
	})
	if err != nil {
		return nil, err
	}
	if show {
		st.say("  %7.2fs  %-9s %s", took, "answer", raw)
		st.say("%s: answered %s in %.2fs", req["call_id"], okOrError(answer), took)
	}
	return answer, nil
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "no nodes"
	}
	return strings.Join(names, ", ")
}

func okOrError(answer map[string]any) string {
	if answer["ok"] == true {
		return "ok"
	}
	return "an error"
}
