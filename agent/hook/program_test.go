package hook

import (
	"os/exec"
	"slices"
	"testing"
)

// TestPrograms: the files a hook command runs, as the shell finds them.
func TestPrograms(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("needs sh on PATH")
	}
	for cmd, want := range map[string][]string{
		"/etc/fluksio-worker/gpu-free.sh":       {"/etc/fluksio-worker/gpu-free.sh"},
		"'/opt/my hooks/check' --gpu 0; exit 1": {"/opt/my hooks/check"},
		"FOO=1 BAR=2 /etc/hook --x":             {"/etc/hook"},
		"sh -e /etc/hook.sh | logger":           {sh, "/etc/hook.sh"},
		"sh -c 'rm -rf /scratch/*'":             {sh},
		"exit 1":                                nil,
		"$HOOK --now":                           nil,
		"./relative/hook":                       {"./relative/hook"},
		"no-such-program-anywhere arg":          nil,
		"cat>/tmp/seen;echo busy >&2":           {mustLook(t, "cat")},
	} {
		if got := Programs(cmd); !slices.Equal(got, want) {
			t.Errorf("Programs(%q) = %q, want %q", cmd, got, want)
		}
	}
}

func mustLook(t *testing.T, name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skip("needs " + name)
	}
	return p
}
