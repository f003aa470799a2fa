package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// Benchmarks with a real Python (Debian's /usr/bin/python3 and its
// python3-numpy), where warm runners matter: the engine's `run` to the
// answer, and calls per second. Side by side: the worker with spares
// (--warm at its default, --preload numpy for the numpy node), the worker
// with --warm 0 (every runner cold), and the reference agent running the
// same embedded runtime:
//
//	go test ./test/ -run '^$' -bench 'Python' -benchtime 100x
//
// Latency calls are sequential with benchPause between them, as a
// pipeline's next node comes after the engine handled the last answer:
// time for the spare used to be replaced. Dispatch calls go back to back.

// benchPause is the gap between latency calls: longer than a spare with
// numpy preloaded takes to start on a loaded two-core machine.
const benchPause = 500 * time.Millisecond

const benchPython = "/usr/bin/python3"

var pythonNodes = []struct{ name, source string }{
	{"trivial", "from fluksio import Port, node\n@node(provides=[Port('y', 'int')])\ndef f(x=1):\n    return x + 1\n"},
	{"numpy", "import numpy\nfrom fluksio import Port, node\n@node(provides=[Port('y', 'float')])\ndef f(x=1):\n    return float(numpy.float64(x) + 1)\n"},
}

type pythonKind struct {
	name  string
	start func(b *testing.B, eng *enginetest.Engine, parallel int, numpy bool) *worker
}

func pythonKinds(b *testing.B) []pythonKind {
	if _, err := os.Stat(benchPython); err != nil {
		b.Skip("no", benchPython)
	}
	goWorker := func(bin string, extra ...string) func(b *testing.B, eng *enginetest.Engine, parallel int, numpy bool) *worker {
		return func(b *testing.B, eng *enginetest.Engine, parallel int, numpy bool) *worker {
			args := []string{"run", "--url", eng.AttachURL(), "--python", benchPython, "--runtime", "embedded",
				"--state-dir", b.TempDir(), "--parallel", strconv.Itoa(parallel), "--log-level", "warn"}
			args = append(args, extra...)
			if numpy && len(extra) == 0 {
				args = append(args, "--preload", "numpy")
			}
			// startProgram's environment says --warm 0; the flag wins.
			if len(extra) == 0 {
				args = append(args, "--warm", strconv.Itoa(parallel))
			}
			if bin == "" {
				bin = releaseWorkerBin(b)
			}
			w := startProgram(b, bin, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, args...)
			stopAtCleanup(w)
			return w
		}
	}
	kinds := []pythonKind{{"go-warm", goWorker("")}, {"go-cold", goWorker("", "--warm", "0")}}
	// BENCH_BEFORE_BIN: an older build, with spares and without, side by side.
	if before := os.Getenv("BENCH_BEFORE_BIN"); before != "" {
		kinds = append(kinds, pythonKind{"before-warm", goWorker(before)}, pythonKind{"before-cold", goWorker(before, "--warm", "0")})
	}
	ref, err := filepath.Abs("../../shared/reference/agent.py")
	if err == nil && exec.Command(benchPython, "-c", "import websockets").Run() == nil {
		if _, err := os.Stat(ref); err == nil {
			kinds = append(kinds, pythonKind{"reference", func(b *testing.B, eng *enginetest.Engine, parallel int, numpy bool) *worker {
				dir := b.TempDir()
				src, _ := os.ReadFile(ref)
				os.WriteFile(filepath.Join(dir, "agent.py"), src, 0o644)
				runtime, err := os.ReadFile(filepath.Join("..", "agent", "runtime", "worker_main.py"))
				if err != nil {
					b.Fatal(err)
				}
				os.WriteFile(filepath.Join(dir, "worker_main.py"), runtime, 0o644)
				return startProgram(b, benchPython, []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
					filepath.Join(dir, "agent.py"), "--url", eng.AttachURL(), "--python", benchPython,
					"--parallel", strconv.Itoa(parallel))
			}})
		}
	}
	return kinds
}

// benchCall runs one call of the node to its answer; safe from any goroutine.
func benchCall(b *testing.B, wk *enginetest.Worker, id, source string) bool {
	c, err := wk.Run(map[string]any{"op": "run", "call_id": id,
		"node":     map[string]any{"source": source, "filename": "bench.py"},
		"function": "f", "inputs": map[string]any{"x": 1}, "settings": map[string]any{}})
	if err != nil {
		b.Error(err)
		return false
	}
	answer, _, err := c.WaitTimeout(60 * time.Second)
	if err != nil || !answer.OK {
		b.Errorf("call %s: %v %s", id, err, answer.Raw)
		return false
	}
	return true
}

// BenchmarkPythonLatency: from the engine sending `run` to the answer,
// sequential calls after a warm-up; median and 90th percentile.
func BenchmarkPythonLatency(b *testing.B) {
	for _, node := range pythonNodes {
		for _, kind := range pythonKinds(b) {
			b.Run(node.name+"/"+kind.name, func(b *testing.B) {
				if node.name == "numpy" && exec.Command(benchPython, "-c", "import numpy").Run() != nil {
					b.Skip("python3-numpy is not installed")
				}
				eng := startEngine(b, enginetest.Options{})
				kind.start(b, eng, 1, node.name == "numpy")
				wk := attach(b, eng)
				for i := 0; i < 3; i++ {
					time.Sleep(benchPause)
					benchCall(b, wk, "warm"+strconv.Itoa(i), node.source)
				}
				took := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					time.Sleep(benchPause)
					b.StartTimer()
					start := time.Now()
					if !benchCall(b, wk, "l"+strconv.Itoa(i), node.source) {
						b.FailNow()
					}
					took = append(took, time.Since(start))
				}
				b.StopTimer()
				slices.Sort(took)
				ms := func(q float64) float64 {
					return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000
				}
				b.ReportMetric(ms(0.5), "median-ms")
				b.ReportMetric(ms(0.9), "p90-ms")
			})
		}
	}
}

// BenchmarkPythonDispatch: trivial calls back to back, one at a time and
// eight at once (--parallel 8), with a real Python.
func BenchmarkPythonDispatch(b *testing.B) {
	for _, kind := range pythonKinds(b) {
		for _, parallel := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/parallel=%d", kind.name, parallel), func(b *testing.B) {
				eng := startEngine(b, enginetest.Options{})
				kind.start(b, eng, parallel, false)
				wk := attach(b, eng)
				time.Sleep(benchPause)
				benchCall(b, wk, "warm", pythonNodes[0].source)
				time.Sleep(benchPause)
				b.ResetTimer()
				callsPerSecond(b, parallel, func(i int) bool {
					return benchCall(b, wk, "d"+strconv.Itoa(i), pythonNodes[0].source)
				})
			})
		}
	}
}

// BenchmarkPythonWarmMemory: the memory the worker's warm runners keep
// while idle, per call slot (--parallel 8, --warm at its default): their
// unique set size (private pages, from /proc/PID/smaps_rollup) summed over
// the warm processes, divided by the 8 slots. Where calls fork from a
// zygote, one interpreter per environment serves every slot; with spares,
// each slot has its own. BENCH_BEFORE_BIN: an older build's too.
func BenchmarkPythonWarmMemory(b *testing.B) {
	builds := []struct{ name, bin string }{{"go", ""}, {"before", os.Getenv("BENCH_BEFORE_BIN")}}
	for _, node := range pythonNodes {
		for _, build := range builds {
			if build.name == "before" && build.bin == "" {
				continue
			}
			b.Run(node.name+"/"+build.name, func(b *testing.B) {
				if node.name == "numpy" && exec.Command(benchPython, "-c", "import numpy").Run() != nil {
					b.Skip("python3-numpy is not installed")
				}
				const slots = 8
				eng := startEngine(b, enginetest.Options{})
				args := []string{"run", "--url", eng.AttachURL(), "--python", benchPython, "--runtime", "embedded",
					"--state-dir", b.TempDir(), "--parallel", strconv.Itoa(slots), "--warm", strconv.Itoa(slots), "--log-level", "warn"}
				if node.name == "numpy" {
					args = append(args, "--preload", "numpy")
				}
				bin := build.bin
				if bin == "" {
					bin = releaseWorkerBin(b)
				}
				w := startProgram(b, bin, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, args...)
				stopAtCleanup(w)
				wk := attach(b, eng)
				var perSlot float64
				for i := 0; i < b.N; i++ {
					// Eight at once teach the environment the demand of eight.
					done := make(chan bool, slots)
					for j := 0; j < slots; j++ {
						go func() { done <- benchCall(b, wk, fmt.Sprintf("m%d-%d", i, j), node.source) }()
					}
					for j := 0; j < slots; j++ {
						<-done
					}
					// Not a timing: time for the warm runners to be made and
					// the calls' runners to exit.
					time.Sleep(6 * benchPause)
					var uss int64
					for _, pid := range sparePids(w) {
						uss += privateBytes(pid)
					}
					perSlot = float64(uss) / slots / (1 << 20)
				}
				b.ReportMetric(perSlot, "MiB/slot")
			})
		}
	}
}

// privateBytes is pid's unique set size: its private pages.
func privateBytes(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	var total int64
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "Private_Clean:" || f[0] == "Private_Dirty:") {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}
