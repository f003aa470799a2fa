package test

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// benchPython runs the nodes and limit_b2b.py: Debian's python3, or
// another interpreter named by BENCH_PYTHON (what a call costs depends on
// the interpreter's version; compare figures of one interpreter only).
var benchPython = cmp.Or(os.Getenv("BENCH_PYTHON"), "/usr/bin/python3")

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
	goWorker := func(bin string, given ...string) func(b *testing.B, eng *enginetest.Engine, parallel int, numpy bool) *worker {
		return func(b *testing.B, eng *enginetest.Engine, parallel int, numpy bool) *worker {
			args := []string{"run", "--url", eng.AttachURL(), "--python", benchPython, "--runtime", "embedded",
				"--state-dir", b.TempDir(), "--parallel", strconv.Itoa(parallel), "--log-level", "warn"}
			// "--sandbox off" alone keeps the defaults below: the same
			// worker without a sandbox around its calls. (A copy: the
			// closure runs once per benchmark round.)
			extra := given
			if len(extra) == 2 && extra[0] == "--sandbox" {
				args, extra = append(args, extra...), nil
			}
			args = append(args, extra...)
			if numpy && len(extra) == 0 {
				args = append(args, "--preload", "numpy")
			}
			// startProgram's environment says --warm 0; the flag wins.
			if len(extra) == 0 {
				args = append(args, "--warm", strconv.Itoa(parallel))
			}
			// BENCH_WORKER_ARGS adds options, as in bench_test.go.
			args = append(args, strings.Fields(os.Getenv("BENCH_WORKER_ARGS"))...)
			if bin == "" {
				bin = releaseWorkerBin(b)
			}
			w := startProgram(b, bin, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, args...)
			stopAtCleanup(w)
			return w
		}
	}
	kinds := []pythonKind{{"go-warm", goWorker("")}, {"go-cold", goWorker("", "--warm", "0")},
		{"go-warm-unsandboxed", goWorker("", "--sandbox", "off")}}
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
				b.ReportMetric(quantileMs(took, 0.5), "median-ms")
				b.ReportMetric(quantileMs(took, 0.9), "p90-ms")
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

// BenchmarkLimitBackToBack runs ../shared/bench/limit_b2b.py, the bound
// for a fresh process per call on this machine (a parent forking each
// call's process ahead, no engine, no runtime), for b.N calls: run it in
// the same run as BenchmarkPythonDispatch/.../parallel=1 and read the
// worker's calls/s as a share of it.
func BenchmarkLimitBackToBack(b *testing.B) {
	script, err := filepath.Abs("../../shared/bench/limit_b2b.py")
	if err == nil {
		_, err = os.Stat(script)
	}
	if err != nil {
		b.Skip("no ../shared/bench/limit_b2b.py beside the repository")
	}
	out, err := exec.Command(benchPython, script, strconv.Itoa(max(b.N, 100))).CombinedOutput()
	if err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	m := regexp.MustCompile(`([0-9.]+) calls/s`).FindSubmatch(out)
	if m == nil {
		b.Fatalf("limit_b2b.py said: %s", out)
	}
	rate, _ := strconv.ParseFloat(string(m[1]), 64)
	b.ReportMetric(rate, "calls/s")
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

// BenchmarkPythonAfterHours: trivial calls on a worker aged by mixed work
// (BENCH_AGED of it, 60s by default) and on a fresh one started beside it
// once the ageing is over, both --parallel 8. Calls go to the aged and
// the fresh worker in turn, the order swapped each round, each after
// benchPause, so that the machine's load falls on both alike:
//
//	BENCH_AGED=1300s go test ./test/ -run '^$' -bench 'PythonAfterHours' -benchtime 40x -timeout 2h
//
// The mixed work is what a few teams' pipelines send: eight environments
// (more than the pool keeps spares for), a new pipeline's sources every
// round beside older ones, plain, numpy, generator (metrics) and failing
// nodes, eight at once and one at a time. Where the worker keeps warm
// runners, it also reports what the two hold: their zygotes' private
// memory (MiB, from smaps_rollup) and the code cache's entries.
func BenchmarkPythonAfterHours(b *testing.B) {
	aged := time.Minute
	if s := os.Getenv("BENCH_AGED"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("BENCH_AGED=%q: %v (a duration, e.g. 1300s)", s, err)
		}
		aged = d
	}
	if exec.Command(benchPython, "-c", "import numpy").Run() != nil {
		b.Skip("python3-numpy is not installed")
	}
	const parallel = 8
	for _, kind := range pythonKinds(b) {
		b.Run(kind.name, func(b *testing.B) {
			oldEng := startEngine(b, enginetest.Options{})
			old := kind.start(b, oldEng, parallel, false)
			oldWk := attach(b, oldEng)
			calls := ageWorker(b, oldWk, aged)
			b.Logf("%s: %d calls of mixed work in %s", kind.name, calls, aged)
			b.ReportMetric(float64(calls)/aged.Seconds(), "mixed-calls/s")
			newEng := startEngine(b, enginetest.Options{})
			fresh := kind.start(b, newEng, parallel, false)
			newWk := attach(b, newEng)
			trivial := pythonNodes[0].source
			for i := 0; i < 3; i++ {
				time.Sleep(benchPause)
				benchCall(b, oldWk, "warm-aged"+strconv.Itoa(i), trivial)
				benchCall(b, newWk, "warm-fresh"+strconv.Itoa(i), trivial)
			}
			var tookAged, tookFresh []time.Duration
			timed := func(wk *enginetest.Worker, id string, into *[]time.Duration) {
				time.Sleep(benchPause)
				start := time.Now()
				if !benchCall(b, wk, id, trivial) {
					b.FailNow()
				}
				*into = append(*into, time.Since(start))
			}
			// b.Loop: the ageing above is done once, not again for each b.N.
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					timed(oldWk, "aged"+strconv.Itoa(i), &tookAged)
					timed(newWk, "fresh"+strconv.Itoa(i), &tookFresh)
				} else {
					timed(newWk, "fresh"+strconv.Itoa(i), &tookFresh)
					timed(oldWk, "aged"+strconv.Itoa(i), &tookAged)
				}
			}
			agedMedian, freshMedian := quantileMs(tookAged, 0.5), quantileMs(tookFresh, 0.5)
			b.ReportMetric(agedMedian, "aged-median-ms")
			b.ReportMetric(quantileMs(tookAged, 0.9), "aged-p90-ms")
			b.ReportMetric(freshMedian, "fresh-median-ms")
			b.ReportMetric(quantileMs(tookFresh, 0.9), "fresh-p90-ms")
			b.ReportMetric(agedMedian/freshMedian, "aged/fresh")
			if strings.HasPrefix(kind.name, "go-") || strings.HasPrefix(kind.name, "before-") {
				for _, w := range []struct {
					name string
					w    *worker
				}{{"aged", old}, {"fresh", fresh}} {
					zygotes, mib := zygoteMemory(w.w)
					b.ReportMetric(float64(zygotes), w.name+"-zygotes")
					b.ReportMetric(mib, w.name+"-zygote-MiB")
					b.ReportMetric(float64(codeCacheEntries(w.w)), w.name+"-code-entries")
					b.ReportMetric(float64(len(inotifyWatches(w.w.cmd.Process.Pid))), w.name+"-inotify-watches")
					logWarm(b, w.name, w.w)
					if dir := os.Getenv("BENCH_AGED_LOGS"); dir != "" {
						os.WriteFile(filepath.Join(dir, kind.name+"-"+w.name+".log"), []byte(w.w.logs.String()), 0o644)
					}
				}
			}
		})
	}
}

// quantileMs is the q quantile of took, in milliseconds.
func quantileMs(took []time.Duration, q float64) float64 {
	took = slices.Sorted(slices.Values(took))
	return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000
}

// ageWorker sends wk mixed work for d and returns how many calls it made.
// Each round is a pipeline: its own sources (a plain node, a numpy node,
// a generator yielding metrics, one that fails), run eight at once in one
// of eight environments, then one at a time in another, with an older
// pipeline's nodes and a call with the worker's own environment between.
//
// To tell causes apart: BENCH_AGED_ENVS=1 sends it all in one environment
// (8 by default), BENCH_AGED_PIPELINES=1 runs the same pipeline's sources
// every round (by default each round's are new).
func ageWorker(b *testing.B, wk *enginetest.Worker, d time.Duration) int {
	envs := make([]map[string]any, max(1, benchCount(b, "BENCH_AGED_ENVS", 8)))
	pipelines := benchCount(b, "BENCH_AGED_PIPELINES", 0)
	for i := range envs {
		envs[i] = map[string]any{"CUDA_VISIBLE_DEVICES": strconv.Itoa(i % 4), "OMP_NUM_THREADS": strconv.Itoa(1 << (i / 4))}
	}
	type node struct {
		source, function string
		ok               bool
	}
	pipeline := func(p int) []node {
		head := fmt.Sprintf("# pipeline %d\nfrom fluksio import Port, node\n", p)
		return []node{
			{head + fmt.Sprintf("@node(provides=[Port('y', 'int')])\ndef prep(x=1):\n    return x + %d\n", p), "prep", true},
			{head + fmt.Sprintf("import numpy\n@node(provides=[Port('y', 'float')])\ndef features(x=1):\n    return float(numpy.arange(%d, dtype=numpy.float64).sum() + x)\n", 100+p), "features", true},
			{head + fmt.Sprintf("@node(provides=[Port('loss', 'float', stream=True), Port('final', 'float')])\ndef train(x=1):\n    for i in range(5):\n        yield {'loss': 1.0 / (i + %d)}\n    return 0.5\n", 1+p), "train", true},
			{head + fmt.Sprintf("@node(provides=[Port('y', 'int')])\ndef check(x=1):\n    raise ValueError('pipeline %d: x out of range')\n", p), "check", false},
		}
	}
	calls := 0
	var mu sync.Mutex
	call := func(id string, n node, env map[string]any) {
		req := map[string]any{"op": "run", "call_id": id,
			"node":     map[string]any{"source": n.source, "filename": "pipeline.py"},
			"function": n.function, "inputs": map[string]any{"x": 1}, "settings": map[string]any{}}
		if env != nil {
			req["env"] = env
		}
		c, err := wk.Run(req)
		if err != nil {
			b.Fatal(err)
		}
		answer, _, err := c.WaitTimeout(120 * time.Second)
		if err != nil || answer.OK != n.ok {
			b.Errorf("ageing call %s (%s, want ok=%v): %v %s", id, n.function, n.ok, err, answer.Raw)
		}
		mu.Lock()
		calls++
		mu.Unlock()
	}
	until := time.Now().Add(d)
	for r := 0; time.Now().Before(until) && !b.Failed(); r++ {
		p := r
		if pipelines > 0 {
			p = r % pipelines
		}
		nodes := pipeline(p)
		var wg sync.WaitGroup
		for j := 0; j < 8; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				call(fmt.Sprintf("age%d-%d", r, j), nodes[j%len(nodes)], envs[r%len(envs)])
			}()
		}
		wg.Wait()
		for j, n := range nodes {
			call(fmt.Sprintf("age%d-s%d", r, j), n, envs[(3*r+1)%len(envs)])
		}
		older := pipeline(p / 2)
		call(fmt.Sprintf("age%d-old", r), older[r%len(older)], envs[(5*r+2)%len(envs)])
		call(fmt.Sprintf("age%d-own", r), node{pythonNodes[0].source, "f", true}, nil)
	}
	return calls
}

// inotifyWatches lists the inodes pid's inotify instances watch (from
// /proc/PID/fdinfo): what the worker follows its warm runners' code with.
func inotifyWatches(pid int) []uint64 {
	var inodes []uint64
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); link != "anon_inode:inotify" {
			continue
		}
		info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		for _, line := range strings.Split(string(info), "\n") {
			for _, f := range strings.Fields(line) {
				if ino, ok := strings.CutPrefix(f, "ino:"); ok && strings.HasPrefix(line, "inotify") {
					n, _ := strconv.ParseUint(ino, 16, 64)
					inodes = append(inodes, n)
				}
			}
		}
	}
	return inodes
}

// benchCount is the environment variable name's count, or def where it
// is not set.
func benchCount(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want a count", name, s)
	}
	return n
}

// zygoteMemory counts w's zygotes and sums their private memory, in MiB.
func zygoteMemory(w *worker) (int, float64) {
	n, uss := 0, int64(0)
	for _, pid := range childrenOf(w.cmd.Process.Pid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), "--fluksio-zygote") {
			n++
			uss += privateBytes(pid)
		}
	}
	return n, float64(uss) / (1 << 20)
}

// codeCacheEntries counts the entries of w's code cache (in its state
// directory's artifact cache).
func codeCacheEntries(w *worker) int {
	entries, _ := os.ReadDir(filepath.Join(stateDirOf(w), "artifacts", "code"))
	return len(entries)
}

// stateDirOf is w's --state-dir.
func stateDirOf(w *worker) string {
	for i, arg := range w.cmd.Args {
		if arg == "--state-dir" && i+1 < len(w.cmd.Args) {
			return w.cmd.Args[i+1]
		}
	}
	return ""
}

// logWarm logs w's warm processes (-v): each zygote and spare the worker
// started, with the environment it is for (CUDA_VISIBLE_DEVICES,
// OMP_NUM_THREADS), its private memory and its own children (the spares
// a zygote forked).
func logWarm(b *testing.B, name string, w *worker) {
	// The watched inodes, by where they are in the state directory.
	watched := map[uint64]bool{}
	for _, ino := range inotifyWatches(w.cmd.Process.Pid) {
		watched[ino] = true
	}
	where := map[string]int{}
	state := stateDirOf(w)
	filepath.WalkDir(state, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok && watched[st.Ino] {
				rel, _ := filepath.Rel(state, path)
				parts := strings.SplitN(rel, string(filepath.Separator), 3)
				where[strings.Join(parts[:min(2, len(parts))], "/")]++
				delete(watched, st.Ino)
			}
		}
		return nil
	})
	b.Logf("%s: inotify watches in the state directory %v, elsewhere %d", name, where, len(watched))
	for _, pid := range childrenOf(w.cmd.Process.Pid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		role := "runner"
		switch {
		case strings.Contains(string(cmdline), "--fluksio-zygote"):
			role = "zygote"
		case strings.Contains(string(cmdline), "--fluksio-spare"):
			role = "spare"
		}
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		env := []string{}
		for _, kv := range strings.Split(string(environ), "\x00") {
			if strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") || strings.HasPrefix(kv, "OMP_NUM_THREADS=") {
				env = append(env, kv)
			}
		}
		b.Logf("%s: %s %d %v: %.1f MiB private, %d children", name, role, pid, env,
			float64(privateBytes(pid))/(1<<20), len(childrenOf(pid)))
	}
}
