package runtime

import (
	"context"
	"net/http"
	"testing"

	"github.com/fluksio/fluksio-worker/agent/policy"
)

// TestEnsureRuntimeWithPolicyNeverFetches: with a code policy on, --runtime
// auto does not ask the engine for a runner, even one it serves.
func TestEnsureRuntimeWithPolicyNeverFetches(t *testing.T) {
	cfg, hits := engineServing(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("import os\n")) })
	p, err := policy.New([]string{"acme.*"}, policy.SourceNone, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Policy = p
	log, _ := captureLog()
	state := t.TempDir()
	rt, err := Ensure(context.Background(), cfg, state, log)
	if err != nil {
		t.Fatal(err)
	}
	checkRuntimeFile(t, rt, state, embeddedRuntime, "embedded")
	if hits.Load() != 0 {
		t.Errorf("the engine was asked for its runner %d times under a code policy", hits.Load())
	}
}
