package agent_test

import (
	"context"
	"os"
	"path/filepath"
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
	for _, want := range []string{"train and evaluate", "loss=", "lr_now=", "loaded the model back", "selftest passed", "runtime    embedded, sha256 ", "GPUs seen", "(pip freeze"} {
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

// `selftest --node FILE --function NAME --inputs JSON`: a node file of the
// user's own through the real runtime on a real Python, every message the
// engine receives printed (its stream values and log lines), then the
// answer and how long the call took; a node that raises exits 1 with its
// traceback; options that cannot go together exit 2 before anything runs.
func TestSelftestOwnNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	given, _ := findPython(ctx, t)
	file := filepath.Join(t.TempDir(), "mine.py")
	source := `from fluksio import Port, node

@node(requires=[Port("n", "int")], provides=[Port("seen", "int", stream=True), Port("total", "int")])
def count(*, n):
    for i in range(n):
        print("counting %d of %d" % (i + 1, n), flush=True)
        yield {"seen": i + 1}
    return {"total": n * 10}

@node
def broken():
    raise ValueError("the node's own mistake")
`
	if err := os.WriteFile(file, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if code := agent.SelftestCommand(ctx, []string{"--python", given, "--node", file, "--function", "count", "--inputs", `{"n": 3}`}, &stdout, &stderr); code != 0 {
		t.Fatalf("selftest --node exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	// The messages as the runtime wrote them, spaces after separators or not.
	compact := strings.ReplaceAll(out, " ", "")
	for _, want := range []string{"mine.py defines count, broken", `count({"n":3})`, `"seen":3`, "counting 3 of 3", `"total":30`, "selftest-run: answered ok in "} {
		if !strings.Contains(out, want) && !strings.Contains(compact, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, " stream "); n != 3 {
		t.Errorf("%d stream events printed, want 3:\n%s", n, out)
	}
	if strings.Contains(out, "train") {
		t.Errorf("selftest --node ran the example too:\n%s", out)
	}

	stdout.Reset()
	if code := agent.SelftestCommand(ctx, []string{"--python", given, "--node", file, "--function", "broken"}, &stdout, &stdout); code != 1 {
		t.Errorf("selftest --node on a node that raises: exit %d, want 1\n%s", code, stdout.String())
	}
	for _, want := range []string{"the node's own mistake", "selftest-run: answered an error in ", "FAILED: the node answered an error"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the output of a node that raises lacks %q:\n%s", want, stdout.String())
		}
	}

	// A misspelt --function: the file as the user named it, what it
	// defines, said once; not the call's copy deep in the state directory.
	stdout.Reset()
	if code := agent.SelftestCommand(ctx, []string{"--python", given, "--node", file, "--function", "cuont"}, &stdout, &stdout); code != 1 {
		t.Errorf("selftest --node with a misspelt --function: exit %d, want 1\n%s", code, stdout.String())
	}
	_, failed, _ := strings.Cut(stdout.String(), "\nFAILED: ")
	if want := "the node answered an error: AttributeError: mine.py has no function 'cuont' (it defines count, broken)\n"; failed != want {
		t.Errorf("selftest --node with a misspelt --function ends %q, want %q; whole output:\n%s", failed, want, stdout.String())
	}
	if strings.Contains(stdout.String(), "fluksio-code") {
		t.Errorf("the output shows the call's copy of the file:\n%s", stdout.String())
	}

	for _, args := range [][]string{
		{"--function", "count"},
		{"--node", file},
		{"--node", file, "--function", "count", "--inputs", "[1]"},
		{"--node", file, "--function", "count", "--steps", "3"},
		{"--node", filepath.Join(t.TempDir(), "missing.py"), "--function", "count"},
	} {
		stdout.Reset()
		if code := agent.SelftestCommand(ctx, args, &stdout, &stdout); code != 2 || !strings.Contains(stdout.String(), "--") {
			t.Errorf("selftest %q exited %d, want 2 saying which option:\n%s", args, code, stdout.String())
		}
	}
}

// The example node that README.md and docs/runtime.md show beside
// `selftest --node`: the same six lines in both, and they run as shown,
// a misspelt --function answered as docs/runtime.md says.
func TestDocsExampleNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
	defer cancel()
	given, _ := findPython(ctx, t)
	var example string
	for _, doc := range []string{"../README.md", "../docs/runtime.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		_, block, ok := strings.Cut(string(b), "```python\n# mynode.py\n")
		block, _, closed := strings.Cut(block, "```")
		switch {
		case !ok || !closed:
			t.Fatalf("%s shows no example node (a ```python block starting # mynode.py)", doc)
		case example == "":
			example = block
		case block != example:
			t.Errorf("%s's example node differs from README.md's:\n%s\nwant:\n%s", doc, block, example)
		}
	}
	if n := strings.Count(example, "\n") + 1; n > 6 {
		t.Errorf("the example node has %d lines with its name; keep it to six:\n%s", n, example)
	}
	file := filepath.Join(t.TempDir(), "mynode.py")
	if err := os.WriteFile(file, []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if code := agent.SelftestCommand(ctx, []string{"--python", given, "--node", file, "--function", "hello", "--inputs", `{"name": "Ada"}`}, &out, &out); code != 0 || !strings.Contains(out.String(), `"greeting": "hello Ada"`) {
		t.Errorf("the docs' example node: exit %d, want 0 and a greeting:\n%s", code, out.String())
	}
	out.Reset()
	agent.SelftestCommand(ctx, []string{"--python", given, "--node", file, "--function", "helo"}, &out, &out)
	if want := "mynode.py has no function 'helo' (it defines hello)"; !strings.Contains(out.String(), want) {
		t.Errorf("a misspelt --function: the output lacks %q, as docs/runtime.md says:\n%s", want, out.String())
	}
}
