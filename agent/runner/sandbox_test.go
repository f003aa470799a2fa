package runner

import (
	"os"
	"testing"

	"github.com/fluksio/fluksio-worker/platform"
)

// An interpreter the sandbox would replace or hide is shown read-only:
// its virtual environment, else its directory, never all of /tmp.
func TestInterpreterUnderAReplacedPathIsShown(t *testing.T) {
	hidden := []string{"/var/lib/fluksio-worker"}
	for _, c := range []struct {
		python string
		want   string // "" for nothing to show
	}{
		{"/usr/bin/python3", ""},
		{"/opt/venv/bin/python", ""},
		{"/tmp/venv/bin/python", "/tmp/venv"},
		{"/var/tmp/build-1/python3", "/var/tmp/build-1"},
		{"/tmp/python3", "/tmp/python3"},
		{"/tmp/bin/python3", "/tmp/bin/python3"},
		{"/var/lib/fluksio-worker/envs/a/bin/python", "/var/lib/fluksio-worker/envs/a"},
		{"/var/lib/fluksio-worker/python3", "/var/lib/fluksio-worker/python3"},
	} {
		b, ok := interpreterBind(c.python, hidden)
		switch {
		case c.want == "" && ok:
			t.Errorf("%s: shown as %+v, but the sandbox neither replaces nor hides it", c.python, b)
		case c.want != "" && (!ok || b != platform.SandboxBind{Path: c.want}):
			t.Errorf("%s: shown as %+v (%v), want %s read-only", c.python, b, ok, c.want)
		}
	}
}

// The worker's own PYTHONPATH, where a private /tmp would cover it, is
// shown read-only; a path that is not there, a relative one, /tmp itself
// and one under a hidden path are not.
func TestWorkersImportPathUnderTmpIsShown(t *testing.T) {
	mods := t.TempDir() // under the test's TMPDIR, /tmp here
	if !within(mods, sandboxReplaced) {
		t.Skipf("%s is not under a directory the sandbox replaces", mods)
	}
	hidden := mods + "/state"
	if err := os.Mkdir(hidden, 0o700); err != nil {
		t.Fatal(err)
	}
	c := &Config{Python: "/usr/bin/python3", BaseEnv: []string{"PYTHONPATH=" + mods + ":relative:/tmp:" + mods + "/gone:" + hidden + ":/usr/lib/python3/dist-packages"}}
	sb := &Sandbox{Hide: []string{hidden}, Binds: []platform.SandboxBind{{Path: "/data", Write: true}}}
	got := c.ownerShown(sb)
	want := []platform.SandboxBind{{Path: mods}, {Path: "/data", Write: true}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("shown %+v, want %+v", got, want)
	}
}
