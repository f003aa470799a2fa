package runtime

// The embedded runtime compiled for the interpreter calls run on. An
// interpreter compiles the script it is given to run every time it starts
// (Python caches the bytecode of what it imports, never of its main
// script): 30 to 70 ms of each cold start for the runtime's 3,000 lines,
// and, in a zygote, megabytes of C heap the parser leaves behind, which
// every runner forked from it inherits and the kernel walks at each fork
// and each runner's exit. Given the compiled form instead, the
// interpreter loads it in under a millisecond.
//
// The bytecode is Python's own cache file for the script
// (__pycache__/<hash>.<tag>.pyc beside it, where the call's other
// interpreters that import the runtime as `fluksio` find it too), written
// by the interpreter itself, compiled anew at the worker's first attach and
// again whenever the file changed since (its change time, which no
// process can set back, included). Without it (a read-only state directory, an interpreter that
// cannot compile) runners start from the script, as before.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/platform"
)

// compileScript, run by the interpreter with -I (no user site, no PYTHON*
// variables), compiles the script in argv[1] to its cache file and prints
// where that is. Always anew, once per worker process: a file there whose
// 16-byte header matches the source may hold any body behind it (planted
// by node code of a worker without a sandbox), and reading the whole file
// to check it costs what compiling does. Only CPython is given its
// bytecode to run as a script; another implementation prints nothing.
const compileScript = `import importlib.util, py_compile, sys
if sys.implementation.name != "cpython":
    sys.exit(0)
src = sys.argv[1]
cfile = importlib.util.cache_from_source(src)
py_compile.compile(src, cfile=cfile, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
print(cfile)
`

// compileTimeout bounds compiling the runtime: an interpreter start and a
// compile, a second or two on a loaded machine.
const compileTimeout = time.Minute

// compiledScripts are the bytecode files found good, by interpreter and
// script, with what they and the interpreter were when found: a later
// attach checks only that both are still those files.
var compiledScripts = struct {
	sync.Mutex
	found map[[2]string]compiled
	said  bool // the fallback was logged
}{found: map[[2]string]compiled{}}

type compiled struct{ bytecode, interpreter os.FileInfo }

// unchanged reports whether path is still the file was; stat follows
// links, so a python3 link moved to another version is another file.
func unchanged(path string, was os.FileInfo, stat func(string) (os.FileInfo, error)) bool {
	now, err := stat(path)
	return err == nil && platform.Unchanged(now, was)
}

// WithBytecode sets s.Bytecode, for the embedded runtime, to the script
// compiled for python, where it can be had; otherwise s is returned as it
// is, and runners start from the script. (A runner the engine serves or a
// --runtime file is run as it is: its __file__ is what it may rely on.)
func WithBytecode(ctx context.Context, python string, s Script, log *slog.Logger) Script {
	if s.Source != "embedded" {
		return s
	}
	key := [2]string{python, s.Path}
	compiledScripts.Lock()
	defer compiledScripts.Unlock()
	if was, ok := compiledScripts.found[key]; ok {
		path := bytecodePath(s.Path, was.bytecode.Name())
		if unchanged(path, was.bytecode, os.Lstat) && unchanged(python, was.interpreter, os.Stat) {
			s.Bytecode, s.CompiledBy = path, was.interpreter
			return s
		}
		delete(compiledScripts.found, key)
	}
	interpreter, err := os.Stat(python)
	if err == nil {
		err = config.PrivateSubdir(filepath.Join(filepath.Dir(s.Path), "__pycache__"))
	}
	var path string
	var st os.FileInfo
	if err == nil {
		path, st, err = compileWith(ctx, python, s.Path)
	}
	if err == nil && path == "" {
		return s // not CPython: it starts from the source
	}
	if err != nil {
		if !compiledScripts.said {
			compiledScripts.said = true
			log.Info("the runner script could not be compiled for this Python; runners start from its source, which costs each a few tens of milliseconds more",
				"python", python, "error", err)
		}
		return s
	}
	compiledScripts.found[key] = compiled{st, interpreter}
	s.Bytecode, s.CompiledBy = path, interpreter
	return s
}

// compileWith has python compile script, and returns the bytecode's path
// and file once it checked that it is the private one it should be, in the
// private directory WithBytecode made; "" where python is not CPython.
func compileWith(ctx context.Context, python, script string) (string, os.FileInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, compileTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-I", "-c", compileScript, script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			lines := strings.Split(msg, "\n")
			return "", nil, fmt.Errorf("%v: %s", err, lines[len(lines)-1])
		}
		return "", nil, err
	}
	path := strings.TrimSpace(string(out))
	if path == "" {
		return "", nil, nil
	}
	want := filepath.Join(filepath.Dir(script), "__pycache__")
	base := strings.TrimSuffix(filepath.Base(script), ".py") + "."
	if filepath.Dir(path) != want || !strings.HasPrefix(filepath.Base(path), base) || !strings.HasSuffix(path, ".pyc") {
		return "", nil, fmt.Errorf("the interpreter wrote the bytecode to %q, not in %s", path, want)
	}
	st, err := os.Lstat(path)
	if err != nil {
		return "", nil, err
	}
	if !ownedPrivately(st) {
		return "", nil, fmt.Errorf("%s is not a plain file of this user's that only it may write (mode %v)", path, st.Mode())
	}
	return path, st, nil
}

// bytecodePath is the bytecode named name beside script.
func bytecodePath(script, name string) string {
	return filepath.Join(filepath.Dir(script), "__pycache__", name)
}
