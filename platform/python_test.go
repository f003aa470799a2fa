package platform

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run fake interpreters: shell scripts standing in for Python.
// They do not call t.Parallel: writing an executable while another test
// forks can make exec fail with "text file busy".

// writeScript writes an executable shell script named name into dir.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func wantErrorSaying(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one saying %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

func TestFindPythonWorkingInterpreter(t *testing.T) {
	dir := t.TempDir()
	py := writeScript(t, dir, "python", `[ "$1" = "-c" ] || { echo "expected -c, got $*" >&2; exit 1; }
echo 3.11.7
`)
	path, version, err := FindPython(context.Background(), py)
	if err != nil {
		t.Fatalf("FindPython(%s): %v", py, err)
	}
	if path != py || version != "3.11.7" {
		t.Errorf("FindPython = %q, %q; want %q, %q", path, version, py, "3.11.7")
	}
}

func TestFindPythonResolvesANameOnPATH(t *testing.T) {
	dir := t.TempDir()
	py := writeScript(t, dir, "python3", "echo 3.12.1\n")
	writeScript(t, dir, "mypython", "echo 3.10.0\n")
	t.Setenv("PATH", dir)

	path, version, err := FindPython(context.Background(), "")
	if err != nil || path != py || version != "3.12.1" {
		t.Errorf(`FindPython("") = %q, %q, %v; want the python3 on PATH, %q`, path, version, err, py)
	}
	path, _, err = FindPython(context.Background(), "mypython")
	if err != nil || path != filepath.Join(dir, "mypython") {
		t.Errorf(`FindPython("mypython") = %q, %v; want the absolute path in %s`, path, err, dir)
	}
	if !filepath.IsAbs(path) {
		t.Errorf("FindPython returned %q, not an absolute path", path)
	}
}

func TestFindPythonTooOld(t *testing.T) {
	py := writeScript(t, t.TempDir(), "python", "echo 3.6.9\nexit 3\n")
	path, version, err := FindPython(context.Background(), py)
	wantErrorSaying(t, err, "3.6.9", "3.8 or newer", "--python")
	if path != "" {
		t.Errorf("FindPython returned path %q for a Python too old to use", path)
	}
	if version != "3.6.9" {
		t.Errorf("version = %q, want 3.6.9 (the user should see what they have)", version)
	}
}

func TestFindPythonDoesNotRun(t *testing.T) {
	py := writeScript(t, t.TempDir(), "python", "echo 'error while loading shared libraries: libpython3.11.so.1.0' >&2\nexit 127\n")
	_, _, err := FindPython(context.Background(), py)
	wantErrorSaying(t, err, py, "libpython3.11.so", "pass --python")
}

// A Python that fails with a traceback is named by the traceback's last
// line, the one that says what went wrong, not its whole text.
func TestFindPythonDoesNotRunSaysTheLastLine(t *testing.T) {
	py := writeScript(t, t.TempDir(), "python", "printf 'Traceback (most recent call last):\\n  File \"site.py\"\\nModuleNotFoundError: No module named encodings\\n\\n' >&2\nexit 1\n")
	_, _, err := FindPython(context.Background(), py)
	wantErrorSaying(t, err, py, "(exit status 1: ModuleNotFoundError: No module named encodings)", "pass --python")
	if strings.Contains(err.Error(), "Traceback") {
		t.Errorf("the error carries the whole traceback: %v", err)
	}
}

func TestFindPythonMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "venv", "bin", "python")
	_, _, err := FindPython(context.Background(), missing)
	wantErrorSaying(t, err, "--python", missing, "not found")
}

// A virtual environment's directory given for --python: the interpreter
// inside it is named.
func TestFindPythonDirectory(t *testing.T) {
	venv := filepath.Join(t.TempDir(), "venv")
	if err := os.MkdirAll(filepath.Join(venv, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, _, err := FindPython(context.Background(), venv)
	wantErrorSaying(t, err, "--python", venv, "is a directory", "e.g. "+venv+"/bin/python3")
	if err := os.WriteFile(filepath.Join(venv, "bin", "python"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, _, err = FindPython(context.Background(), venv)
	wantErrorSaying(t, err, "did you mean "+venv+"/bin/python?")
}

func TestFindPythonNotExecutable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "python")
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho 3.11.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := FindPython(context.Background(), path)
	wantErrorSaying(t, err, "--python", path, "not executable")
}

func TestFindPythonNoPython3OnPATH(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, _, err := FindPython(context.Background(), "")
	wantErrorSaying(t, err, "no python3 on PATH", "install Python 3.8 or newer", "--python")
}

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

func TestVenvDigest(t *testing.T) {
	const freeze = "numpy==1.26.4\ntorch==2.3.0\n-e git+https://example.com/pkg.git@abc#egg=pkg\n"
	dir := t.TempDir()
	tests := []struct {
		name, body, want string
	}{
		{"pip freeze output",
			`[ "$*" = "-m pip freeze" ] || { echo "unexpected arguments: $*" >&2; exit 2; }
printf '` + freeze + `'
`, digestOf(freeze)},
		{"a failing pip still hashes its stdout",
			"printf 'partial==1.0\\n'\necho 'ERROR: something broke' >&2\nexit 1\n", digestOf("partial==1.0\n")},
		{"a Python without pip hashes empty output",
			"echo '/usr/bin/python3: No module named pip' >&2\nexit 1\n", digestOf("")},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			py := writeScript(t, dir, "python"+strconv.Itoa(i), tt.body)
			got := VenvDigest(context.Background(), py)
			if got != tt.want {
				t.Errorf("VenvDigest = %q, want %q", got, tt.want)
			}
			if len(got) != 16 {
				t.Errorf("VenvDigest = %q, want 16 hex characters", got)
			}
		})
	}
	if digestOf("") != "e3b0c44298fc1c14" {
		t.Fatal("the test's own sha256 is wrong")
	}
}

func TestVenvDigestCannotStart(t *testing.T) {
	if got := VenvDigest(context.Background(), filepath.Join(t.TempDir(), "no-such-python")); got != "" {
		t.Errorf("VenvDigest of a missing interpreter = %q, want \"\"", got)
	}
	notExec := filepath.Join(t.TempDir(), "python")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := VenvDigest(context.Background(), notExec); got != "" {
		t.Errorf("VenvDigest of a non-executable file = %q, want \"\"", got)
	}
}

func TestVenvDigestStoppedByItsContext(t *testing.T) {
	py := writeScript(t, t.TempDir(), "python", "printf 'a==1\\n'\nexec sleep 30\n")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if got := VenvDigest(ctx, py); got != "" {
		t.Errorf("VenvDigest past its deadline = %q, want \"\"", got)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("VenvDigest took %v past a 200ms deadline", took)
	}
}

// A process the interpreter started in the background (a wrapper script, a
// daemon a site-customisation launched) keeps its stdout open. The digest
// must still come back once its deadline passes, or hello never goes out
// and the worker never attaches.
func TestVenvDigestNotHeldByAGrandchild(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "grandchild.pid")
	py := writeScript(t, dir, "python", "sleep 30 &\necho $! > '"+pidFile+"'\nexec sleep 30\n")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL) // the sleep this test started
			}
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan string, 1)
	go func() { done <- VenvDigest(ctx, py) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("VenvDigest still running 5s after its 300ms deadline: a grandchild holding stdout keeps Wait blocked (set cmd.WaitDelay)")
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		<-done
	}
}

// The digest is taken once, and again (in the background, the caller
// getting the last one meanwhile) only when a package directory changed.
func TestVenvDigestsRefreshOnlyWhenTheEnvironmentChanges(t *testing.T) {
	dir := t.TempDir()
	site := filepath.Join(dir, "site-packages")
	if err := os.Mkdir(site, 0o755); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(dir, "freezes")
	py := writeScript(t, dir, "python", `case "$1" in
-c) echo '`+site+`'; echo relative; echo /no/such/dir ;;
-m) echo x >> '`+count+`'; ls '`+site+`' ;;
esac
`)
	freezes := func() int {
		b, _ := os.ReadFile(count)
		return strings.Count(string(b), "x")
	}
	v := NewVenvDigests(py)
	first := v.Get(context.Background())
	if first != digestOf("") || freezes() != 1 {
		t.Fatalf("first digest %q after %d freezes", first, freezes())
	}
	for i := 0; i < 5; i++ {
		if got := v.Get(context.Background()); got != first {
			t.Fatalf("digest changed to %q with nothing installed", got)
		}
	}
	if n := freezes(); n != 1 {
		t.Fatalf("pip freeze ran %d times for 6 hellos with nothing installed", n)
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(site, past, past) // a package installed: the directory changes
	if err := os.Mkdir(filepath.Join(site, "numpy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := v.Get(context.Background()); got != first {
		t.Fatalf("the hello waited for the new digest (%q)", got)
	}
	v.mu.Lock()
	done := v.refreshed
	v.mu.Unlock()
	<-done
	if got := v.Get(context.Background()); got != digestOf("numpy\n") || freezes() != 2 {
		t.Fatalf("after installing: digest %q after %d freezes, want %q after 2", got, freezes(), digestOf("numpy\n"))
	}
}
