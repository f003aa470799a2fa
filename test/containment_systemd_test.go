package test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// helpersNode starts the four helpers of containment_test.go from Python,
// as node code would, waits until all run, and returns how many it saw,
// its own cgroup and pid.
const helpersNode = `
import os, subprocess, time

def f(*, marker):
    sleeper = "import time; time.sleep(300)"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    py = "/usr/bin/python3"
    subprocess.Popen([py, "-c", sleeper, marker + "-plain"])
    subprocess.Popen([py, "-c", stubborn, marker + "-stubborn"])
    subprocess.run(["setsid", "-f", py, "-c", sleeper, marker + "-setsid"], check=True)
    subprocess.run(["sh", "-c", '(setsid "$0" -c "$1" "$2" &)', py, sleeper, marker + "-daemon"], check=True)
    seen = 0
    for _ in range(100):
        seen = 0
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/" + pid + "/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if len(args) > 3 and args[3].startswith(marker.encode() + b"-"):
                seen += 1
        if seen == 4:
            break
        time.sleep(0.05)
    with open("/proc/self/cgroup") as f:
        cgroup = [l.split("::", 1)[1].strip() for l in f if l.startswith("0::")][0]
    return {"seen": seen, "cgroup": cgroup, "pid": os.getpid()}
`

// checkServiceContainment runs a node that starts the four helpers in the
// installed service: the worker is in cgroup mode in a leaf of its
// delegated cgroup, the call runs in a cgroup of its own, and after the
// answer no helper is left, nor the node's process in the call's cgroup
// (removed, or kept for a later call: a spare forked since may be in it).
func checkServiceContainment(ctx context.Context, t *testing.T, w *enginetest.Worker, must func(string) string) {
	t.Helper()
	if out := must("fluksio-worker status"); !strings.Contains(out, "cgroup") {
		t.Errorf("status does not say the service contains calls by cgroup:\n%s", out)
	}
	// The short line says --warm; how the spares are kept (more of them,
	// forked ahead by a zygote) is in --json.
	// In this rig's systemd-nspawn machine Landlock's scopes are not
	// offered (the host's kernel has them), so the runners of a sandbox
	// are not forked there, which status says too.
	if out := must("fluksio-worker status --json"); !strings.Contains(out, "spare runners and a zygote") && !strings.Contains(out, "none forked from a zygote: a forked runner's sandbox needs Landlock") {
		t.Errorf("status --json does not say how spares are kept (forked ahead by a zygote, or why not):\n%s", out)
	}
	if out := must("fluksio-worker check"); !strings.Contains(out, "contain    cgroup") {
		t.Errorf("check does not say the service contains calls by cgroup:\n%s", out)
	}
	if cg := must("cat /proc/$(systemctl show --property MainPID --value fluksio-worker)/cgroup"); !regexp.MustCompile(`(?m)fluksio-worker\.service/worker-\d+\.\d+/worker$`).MatchString(cg) {
		t.Errorf("the worker is not in the leaf of its delegated cgroup:\n%s", cg)
	}
	const marker = "fluksio-svc-helper"
	call, err := w.Run(map[string]any{
		"op": "run", "call_id": "contain",
		"node":     map[string]any{"source": helpersNode, "filename": "helpers.py"},
		"function": "f", "inputs": map[string]any{"marker": marker}, "settings": map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	answer, _, err := call.Wait(wctx)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		OK      bool `json:"ok"`
		Outputs struct {
			Seen   int    `json:"seen"`
			Cgroup string `json:"cgroup"`
			PID    int    `json:"pid"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(answer.Raw, &got); err != nil || !got.OK || got.Outputs.Seen != 4 || got.Outputs.PID <= 0 {
		t.Fatalf("the helpers node answered %s; want ok with all four helpers seen and its pid", answer.Raw)
	}
	if !regexp.MustCompile(`fluksio-worker\.service/worker-\d+\.\d+/(call|spare)-`).MatchString(got.Outputs.Cgroup) {
		t.Errorf("the node ran in cgroup %s, not in a call's cgroup of the service", got.Outputs.Cgroup)
	}
	// --cancel-grace is 3 s by default; the stubborn helper needs all of it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		// (The bracket keeps this grep from matching its own command line.)
		left := strings.TrimSpace(must("grep -l 'fluksio-svc-helpe[r]' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"))
		node := strings.TrimSpace(must(fmt.Sprintf("cat /sys/fs/cgroup%[1]s/cgroup.procs /sys/fs/cgroup/unified%[1]s/cgroup.procs 2>/dev/null | grep -cx %[2]d || true", got.Outputs.Cgroup, got.Outputs.PID)))
		if left == "0" && node == "0" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the answer: %s helper processes left; the node's process %d in the call's cgroup %s: %s", left, got.Outputs.PID, got.Outputs.Cgroup, node)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Two machines booted from one cgroup share their cgroup tree, and so
// the service's cgroup, but not a PID namespace (two nspawn machines with
// --keep-unit, containers without a cgroup namespace of their own): the
// worker starting in one leaves the other's worker and its running call
// alone, though their pids mean nothing to it, or the same as its own.
func TestTwoMachinesInOneCgroup(t *testing.T) {
	nspawn.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	bin := buildStaticWorker(t)
	var r [4]byte
	rand.Read(r[:])
	shared := nspawn.Options{Cgroup: hex.EncodeToString(r[:])}
	eng := startEngine(t, enginetest.Options{Tokens: []string{serviceToken}})
	install := func(m *nspawn.Machine, name string) *enginetest.Worker {
		t.Helper()
		if err := m.CopyIn(bin, "/usr/local/bin/fluksio-worker"); err != nil {
			t.Fatal(err)
		}
		machineShell(ctx, t, m)(fmt.Sprintf("printf '%%s\\n' %s | fluksio-worker install --url http://%s --token - --name %s", serviceToken, eng.Addr(), name))
		return liveWorker(ctx, t, eng)
	}
	a := bootSharedMachine(ctx, t, shared)
	b := bootSharedMachine(ctx, t, shared)

	// Pids taken in a first, so that its worker's is none in b: where it
	// is one there, a worker of b takes it for running.
	machineShell(ctx, t, a)("i=0; while [ $i -lt 1500 ]; do (:); i=$((i+1)); done")
	wa := install(a, "machine-a")
	const seconds = 20
	call := startLongNode(ctx, t, wa, "a1", seconds)
	wb := install(b, "machine-b") // it has cleared what it took for leftovers
	runDouble(ctx, t, wb, "b1", 4)
	select {
	case <-wa.Done():
		t.Fatal("the worker in the other machine was stopped when this one started")
	default:
	}
	finishLongNode(ctx, t, call, seconds)
	runDouble(ctx, t, wa, "a2", 5)
}

// bootSharedMachine is bootMachine for a machine in a cgroup that others
// share (opts.Cgroup).
func bootSharedMachine(ctx context.Context, t *testing.T, opts nspawn.Options) *nspawn.Machine {
	t.Helper()
	m, err := nspawn.Boot(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := m.Exec(context.Background(), "systemctl status --no-pager fluksio-worker; journalctl --no-pager -n 60 -u fluksio-worker")
			t.Logf("the service in %s at the end:\n%s", m.Name, out)
		}
		m.Close()
	})
	return m
}
