//go:build linux

package runner

import (
	"context"
	"strings"
	"testing"
)

// tokenSearchNode answers with every place a node would look for the
// runner's mark token: its argv as the kernel shows it, its environment,
// and what __main__ (the runtime) holds under its names, shown in full.
const tokenSearchNode = `import os, sys, __main__
def f():
    with open("/proc/self/cmdline", "rb") as c:
        cmdline = c.read().decode("latin-1")
    with open("/proc/self/environ", "rb") as e:
        environ = e.read().decode("latin-1")
    names = []
    for name, value in list(vars(__main__).items()):
        try:
            names.append("%s=%r" % (name, value))
        except Exception:
            pass
    return {"cmdline": cmdline, "environ": environ + repr(dict(os.environ)), "main": "\n".join(names), "argv": repr(sys.argv)}
`

// searchedForToken runs tokenSearchNode in the call z starts next, fails
// where the node found its runner's token, and returns the runner's pid.
func searchedForToken(t *testing.T, z *zygoteRig, id string) int {
	t.Helper()
	c, err := z.runNode(context.Background(), id, tokenSearchNode)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if c.pipes == nil || c.pipes.token == "" {
		t.Fatalf("the call has no output token")
	}
	token, pid := c.pipes.token, c.box.pid
	a := answer(t, c.output(t))
	c.end(t, true)
	outputs, ok := a["outputs"].(map[string]any)
	if !ok {
		t.Fatalf("call %s failed: %s", id, c.outputLine(a))
	}
	for _, where := range []string{"cmdline", "environ", "main", "argv"} {
		text, _ := outputs[where].(string)
		if text == "" {
			t.Errorf("the node found nothing in %s", where)
		}
		if strings.Contains(text, token) {
			t.Errorf("the node found its runner's output token in %s", where)
		}
	}
	return pid
}

// Node code finds its runner's output mark token neither in its argv,
// its environment nor the runtime's names, whether its runner was started
// cold, as a spare, or forked from a zygote.
func TestNodeCannotFindTheOutputToken(t *testing.T) {
	t.Run("cold", func(t *testing.T) {
		if !fileExists(systemPython) {
			t.Skip("runs " + systemPython)
		}
		searchedForToken(t, newZygoteRig(t, 0, nil), "cold")
	})
	t.Run("spare", func(t *testing.T) {
		if !fileExists(systemPython) {
			t.Skip("runs " + systemPython)
		}
		if containedChild {
			t.Skip("the contained test process forks spares from zygotes")
		}
		z := newZygoteRig(t, 1, nil)
		z.runPID(t, "teach")
		spare := z.waitSpare(t, z.m)
		if pid := searchedForToken(t, z, "spare"); pid != spare {
			t.Errorf("the call ran in %d, not in the spare %d", pid, spare)
		}
	})
	t.Run("forked", func(t *testing.T) {
		if !inContainedChild(t) {
			return
		}
		z := newZygoteRig(t, 1, nil)
		_, spares := z.forking(t, warmOneKeeps)
		if pid := searchedForToken(t, z, "forked"); !containsInt(spares, pid) {
			t.Errorf("the call ran in %d, not in a forked spare %v", pid, spares)
		}
	})
}
