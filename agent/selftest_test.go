package agent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fluksio/fluksio-worker/agent"
)

// `fluksio-worker selftest` in this process: the example nodes compiled,
// trained and evaluated on a real Python through the embedded runtime.
func TestSelftest(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	given, _ := findPython(ctx, t)
	var stdout, stderr strings.Builder
	if code := agent.SelftestCommand(ctx, []string{"--python", given, "--steps", "3"}, &stdout, &stderr); code != 0 {
		t.Fatalf("selftest exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"train and evaluate", "loss=", "lr_now=", "loaded the model back", "selftest passed", "runtime    embedded, sha256 ", "GPUs seen"} {
		if !strings.Contains(out, want) {
			t.Errorf("the selftest output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "loss="); n != 3+1 {
		t.Errorf("%d lines with a loss (3 streamed, 1 final), want 4:\n%s", n, out)
	}

	// A Python that cannot run the nodes fails the selftest, saying why.
	stdout.Reset()
	if code := agent.SelftestCommand(ctx, []string{"--python", "/nonexistent/python3"}, &stdout, &stdout); code == 0 || !strings.Contains(stdout.String(), "FAILED") {
		t.Errorf("selftest with a missing Python: exit %d\n%s", code, stdout.String())
	}
	for _, args := range [][]string{{"--steps", "0"}, {"extra"}, {"--bogus"}} {
		if code := agent.SelftestCommand(ctx, args, &stdout, &stdout); code != 2 {
			t.Errorf("selftest %q exited %d; want 2", args, code)
		}
	}
	stdout.Reset()
	if code := agent.SelftestCommand(ctx, []string{"--help"}, &stdout, &stdout); code != 0 || !strings.Contains(stdout.String(), "Usage:") {
		t.Errorf("selftest --help: exit %d\n%s", code, stdout.String())
	}
}
