package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// systemPython is Debian's interpreter, which the runtime's tests run on.
func systemPython(t *testing.T) string {
	t.Helper()
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("no", python)
	}
	return python
}

// countingPython is an interpreter that counts its starts in the file it
// returns, and is python otherwise.
func countingPython(t *testing.T, python string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	count := filepath.Join(dir, "starts")
	wrapper := filepath.Join(dir, "python3")
	script := "#!/bin/sh\necho start >> " + count + "\nexec " + python + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper, count
}

func starts(t *testing.T, count string) int {
	t.Helper()
	b, err := os.ReadFile(count)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), "start")
}

// failingNode runs a node that raises through the runtime started from
// script, as the reference agent starts it (the request on stdin, the
// answer on stdout), and returns the answer's traceback.
func failingNode(t *testing.T, python, script string) string {
	t.Helper()
	request := `{"op": "run", "call_id": "c1", "function": "f", "inputs": {}, "settings": {},` +
		` "node": {"source": "from fluksio import node\n@node\ndef f():\n    raise ValueError('boom')\n", "filename": "pipeline.py"}}` + "\n"
	cmd := exec.Command(python, script)
	cmd.Dir = t.TempDir()
	cmd.Stdin = strings.NewReader(request)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if _, failed := err.(*exec.ExitError); err != nil && !failed { // a node that raised exits 1
		t.Fatalf("%s %s: %v\n%s", python, script, err, stderr.Bytes())
	}
	var answer struct {
		OK    bool `json:"ok"`
		Error struct {
			Traceback string `json:"traceback"`
		} `json:"error"`
	}
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	if err := json.Unmarshal(lines[len(lines)-1], &answer); err != nil || answer.OK {
		t.Fatalf("answer %q: %v\n%s", lines[len(lines)-1], err, stderr.Bytes())
	}
	return answer.Error.Traceback
}

func TestRunnersStartFromTheCompiledRuntime(t *testing.T) {
	python := systemPython(t)
	state := t.TempDir()
	rt, err := cacheRuntime(state, embeddedRuntime, "embedded")
	if err != nil {
		t.Fatal(err)
	}
	log, logs := captureLog()
	rt = WithBytecode(context.Background(), python, rt, log)
	dir := filepath.Join(state, "runtime", "__pycache__")
	if filepath.Dir(rt.Bytecode) != dir || !strings.HasPrefix(filepath.Base(rt.Bytecode), rt.Hash+".") {
		t.Fatalf("bytecode = %q, want Python's cache file of %s in %s (log: %s)", rt.Bytecode, rt.Path, dir, logs)
	}
	for _, p := range []string{dir, rt.Bytecode} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: %v, mode %v: others may read or write what runners run", p, err, st.Mode())
		}
	}
	// Run from its bytecode, the runtime still knows its own frames: the
	// traceback a failing node gets shows the node's, not the runtime's.
	tb := failingNode(t, python, rt.Bytecode)
	if !strings.Contains(tb, `File "pipeline.py", line 4, in f`) || strings.Contains(tb, rt.Hash) {
		t.Errorf("traceback of a node run from the compiled runtime:\n%s\nwant the node's frame only, none of %s", tb, rt.Path)
	}
}

func TestCompiledRuntimeIsCheckedAgainstItsSource(t *testing.T) {
	python := systemPython(t)
	counting, count := countingPython(t, python)
	state := t.TempDir()
	rt, err := cacheRuntime(state, embeddedRuntime, "embedded")
	if err != nil {
		t.Fatal(err)
	}
	// A cache file there already, of other code: replaced, never run.
	planted := filepath.Join(t.TempDir(), "planted.py")
	os.WriteFile(planted, []byte("print('planted')\n"), 0o600)
	want := strings.TrimSpace(run(t, python, "-I", "-c", "import importlib.util, sys; print(importlib.util.cache_from_source(sys.argv[1]))", rt.Path))
	if err := os.MkdirAll(filepath.Dir(want), 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, python, "-I", "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)", planted, want)
	log, _ := captureLog()
	got := WithBytecode(context.Background(), counting, rt, log)
	if got.Bytecode != want {
		t.Fatalf("bytecode = %q, want %q", got.Bytecode, want)
	}
	if tb := failingNode(t, python, got.Bytecode); !strings.Contains(tb, "pipeline.py") {
		t.Fatalf("the cache file still runs other code: %q", tb)
	}
	// Found good once, it is not compiled again at the next attach...
	WithBytecode(context.Background(), counting, rt, log)
	if n := starts(t, count); n != 1 {
		t.Errorf("the interpreter started %d times for two attaches, want 1", n)
	}
	// ...until the file changed.
	run(t, python, "-I", "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)", planted, want)
	got = WithBytecode(context.Background(), counting, rt, log)
	if n := starts(t, count); n != 2 || got.Bytecode != want {
		t.Errorf("after the file changed: %d interpreter starts, bytecode %q; want 2 and %q", n, got.Bytecode, want)
	}
	if tb := failingNode(t, python, got.Bytecode); !strings.Contains(tb, "pipeline.py") {
		t.Errorf("a changed cache file was used as it was: %q", tb)
	}
}

// Node code of a worker without a sandbox rewrote the compiled runtime's
// body behind its intact header (and set its modification time back): a
// restart, and an attach of the same worker, compile it anew; the planted
// code never runs.
func TestCompiledRuntimeWithARewrittenBodyIsCompiledAnew(t *testing.T) {
	python := systemPython(t)
	state := t.TempDir()
	rt, err := cacheRuntime(state, embeddedRuntime, "embedded")
	if err != nil {
		t.Fatal(err)
	}
	log, _ := captureLog()
	good := WithBytecode(context.Background(), python, rt, log).Bytecode
	planted := filepath.Join(t.TempDir(), "planted.py")
	os.WriteFile(planted, []byte("print('planted')\n"), 0o600)
	body := filepath.Join(t.TempDir(), "planted.pyc")
	run(t, python, "-I", "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2])", planted, body)
	plant := func() {
		t.Helper()
		st, err := os.Stat(good)
		if err != nil {
			t.Fatal(err)
		}
		header, _ := os.ReadFile(good)
		tail, _ := os.ReadFile(body)
		// Padded to the same size: marshal reads one object, and leaves
		// what follows it.
		same := append(header[:16:16], tail[16:]...)
		same = append(same, make([]byte, max(0, len(header)-len(same)))...)
		if err := os.WriteFile(good, same, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(good, st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
		if out := says(python, good); !strings.Contains(out, "planted") {
			t.Fatalf("the planted file does not run the planted code: %q", out)
		}
	}
	plant()
	// The same worker attaching again...
	if got := WithBytecode(context.Background(), python, rt, log); got.Bytecode == "" || strings.Contains(says(python, got.Bytecode), "planted") {
		t.Errorf("after its body was rewritten and its time set back, %s still runs the planted code at the next attach", got.Bytecode)
	}
	// ...and a restart (no file found good in this process yet).
	plant()
	compiledScripts.Lock()
	clear(compiledScripts.found)
	compiledScripts.Unlock()
	got := WithBytecode(context.Background(), python, rt, log)
	if got.Bytecode == "" || strings.Contains(says(python, got.Bytecode), "planted") {
		t.Errorf("after a restart, %s still runs the planted code: its header was all that was checked", got.Bytecode)
	}
	if tb := failingNode(t, python, got.Bytecode); !strings.Contains(tb, "pipeline.py") {
		t.Errorf("the runtime compiled anew does not run nodes: %q", tb)
	}
}

// says is what python prints running file with nothing on its stdin,
// whatever its exit.
func says(python, file string) string {
	out, _ := exec.Command(python, file).CombinedOutput()
	return string(out)
}

func TestRuntimeThatCannotBeCompiledRunsFromItsSource(t *testing.T) {
	python := systemPython(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, rt Script) string // returns the interpreter
		says  string
	}{
		{"interpreter fails", func(t *testing.T, rt Script) string {
			bad := filepath.Join(t.TempDir(), "python3")
			os.WriteFile(bad, []byte("#!/bin/sh\necho 'ModuleNotFoundError: No module named py_compile' >&2\nexit 1\n"), 0o755)
			return bad
		}, "No module named py_compile"},
		{"cache directory others may write", func(t *testing.T, rt Script) string {
			dir := filepath.Join(filepath.Dir(rt.Path), "__pycache__")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			os.Chmod(dir, 0o777)
			return python
		}, "may write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			compiledScripts.Lock()
			compiledScripts.said = false
			compiledScripts.Unlock()
			rt, err := cacheRuntime(t.TempDir(), embeddedRuntime, "embedded")
			if err != nil {
				t.Fatal(err)
			}
			interpreter := tc.setup(t, rt)
			log, logs := captureLog()
			got := WithBytecode(context.Background(), interpreter, rt, log)
			if got.Bytecode != "" {
				t.Errorf("bytecode = %q, want none", got.Bytecode)
			}
			if !strings.Contains(logs.String(), "runners start from its source") || !strings.Contains(logs.String(), tc.says) {
				t.Errorf("log %q does not say the runtime could not be compiled, and why (%q)", logs, tc.says)
			}
			if tb := failingNode(t, python, got.Path); !strings.Contains(tb, `File "pipeline.py"`) {
				t.Errorf("runtime from its source: %q", tb)
			}
		})
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}
