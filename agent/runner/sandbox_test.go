package runner

import (
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
