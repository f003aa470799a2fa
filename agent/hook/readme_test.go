//go:build linux

package hook

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readmeGPUHook is docs/security.md's example pre-call hook, gpu-free.sh: the
// sh block after the sentence that introduces it.
func readmeGPUHook(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "Take a call only while its GPU is free")
	if !ok {
		t.Fatal("docs/security.md no longer introduces its GPU hook with \"Take a call only while its GPU is free\"")
	}
	_, block, ok := strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatal("docs/security.md's GPU hook has no ```sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	path := filepath.Join(t.TempDir(), "gpu-free.sh")
	if err := os.WriteFile(path, []byte(block), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestREADMEGPUHook runs the GPU hook of docs/security.md as the pre-call hook runs,
// on a PATH with the tools it uses (python3, tr) and no nvidia-smi, then
// with an nvidia-smi that reports the GPUs free or busy. It fails closed:
// a hook that cannot tell declines the call, saying why.
func TestREADMEGPUHook(t *testing.T) {
	script := readmeGPUHook(t)
	bin := t.TempDir()
	tr, err := exec.LookPath("tr")
	if err != nil {
		t.Skip("no tr here")
	}
	// The interpreter itself, not a shim (pyenv's needs bash on PATH).
	out, err := exec.Command("python3", "-c", "import os, sys; print(os.path.realpath(sys.executable))").Output()
	if err != nil {
		t.Skipf("no python3 here: %v", err)
	}
	for name, path := range map[string]string{"tr": tr, "python3": strings.TrimSpace(string(out))} {
		if err := os.Symlink(path, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=" + bin}
	call := func(cuda string) Result {
		t.Helper()
		input := `{"call_id":"c1","op":"run","cuda_visible_devices":"` + cuda + `"}`
		return Run(context.Background(), "/bin/sh "+script, []byte(input), env, time.Minute)
	}
	if r := call("0"); r.OK() || r.Reason != "nvidia-smi not found: cannot tell whether the GPU is free" {
		t.Errorf("without nvidia-smi: %+v; want it declined, saying nvidia-smi was not found", r)
	}

	// An nvidia-smi with GPUs 0 and 1, GPU 1 computing for process 4242.
	fake := "#!/bin/sh\ncase \"$*\" in\n" +
		"  *--query-gpu=index*) printf '0\\n1\\n' ;;\n" +
		"  *'-i 1') echo 4242 ;;\n" +
		"esac\n"
	if err := os.WriteFile(filepath.Join(bin, "nvidia-smi"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := call("0"); !r.OK() {
		t.Errorf("GPU 0 free: %+v; want the call taken", r)
	}
	if r := call("1"); r.OK() || r.Reason != "GPU 1 is in use by process(es) 4242" {
		t.Errorf("GPU 1 busy: %+v; want it declined, naming the process", r)
	}
	if r := call(""); r.OK() || r.Reason != "GPU 1 is in use by process(es) 4242" {
		t.Errorf("no GPU named, GPU 1 busy: %+v; want it declined", r)
	}
	os.WriteFile(filepath.Join(bin, "nvidia-smi"), []byte("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"), 0o755)
	if r := call(""); r.OK() || !strings.Contains(r.Reason, "NVIDIA-SMI has failed") {
		t.Errorf("nvidia-smi failing: %+v; want it declined", r)
	}
}
