package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
)

// Benchmarks of the agent against the fake engine with the compiled fake
// runner, so the agent is what is timed, not Python. Each also runs the
// reference Python agent (../shared/reference/agent.py) the same way when
// it and python3-websockets are there, for a comparison on this machine:
//
//	go test ./test/ -run '^$' -bench . -benchtime 3s
//	BENCH_WORKER_ARGS='--listen 127.0.0.1:0' go test ./test/ -run '^$' -bench 'Relay/go' -benchtime 300000x
//
// Metrics: calls/s and agent CPU µs per call (dispatch), events/s and agent CPU µs per event (relay),
// and the agent's resident memory idle and after the relay (all of it, and
// its own anonymous part without the shared pages of its executable).

type agentKind struct {
	name  string
	start func(b *testing.B, eng *enginetest.Engine, parallel int) *worker
}

func agentKinds() []agentKind {
	kinds := []agentKind{{name: "go"}}
	kinds[0].start = func(b *testing.B, eng *enginetest.Engine, parallel int) *worker {
		return startBenchWorker(b, releaseWorkerBin(b), eng, parallel)
	}
	// BENCH_BEFORE_BIN adds another build of the worker, an older one, to
	// measure a change side by side in one run.
	if before := os.Getenv("BENCH_BEFORE_BIN"); before != "" {
		kinds = append(kinds, agentKind{"before", func(b *testing.B, eng *enginetest.Engine, parallel int) *worker {
			return startBenchWorker(b, before, eng, parallel)
		}})
	}
	ref, err := filepath.Abs("../../shared/reference/agent.py")
	// Debian's python3, where python3-websockets installs.
	if err == nil && exec.Command("/usr/bin/python3", "-c", "import websockets").Run() == nil {
		if _, err := os.Stat(ref); err == nil {
			kinds = append(kinds, agentKind{"reference", func(b *testing.B, eng *enginetest.Engine, parallel int) *worker {
				dir := b.TempDir()
				src, _ := os.ReadFile(ref)
				os.WriteFile(filepath.Join(dir, "agent.py"), src, 0o644)
				os.WriteFile(filepath.Join(dir, "worker_main.py"), nil, 0o644)
				return startProgram(b, "/usr/bin/python3", []string{"FLUKSIO_WORKER_TOKEN=" + testToken},
					filepath.Join(dir, "agent.py"), "--url", eng.AttachURL(), "--python", fakeRunnerPath(b),
					"--parallel", strconv.Itoa(parallel))
			}})
		}
	}
	return kinds
}

// startBenchWorker starts the worker build bin against eng.
func startBenchWorker(b *testing.B, bin string, eng *enginetest.Engine, parallel int) *worker {
	args := []string{"run", "--url", eng.AttachURL(), "--python", fakeRunnerPath(b), "--runtime", "embedded",
		"--state-dir", b.TempDir(), "--parallel", strconv.Itoa(parallel), "--log-level", "warn"}
	// BENCH_WORKER_ARGS adds options, to measure what one costs:
	// BENCH_WORKER_ARGS='--listen 127.0.0.1:0' for metrics.
	args = append(args, strings.Fields(os.Getenv("BENCH_WORKER_ARGS"))...)
	return startProgram(b, bin, []string{"FLUKSIO_WORKER_TOKEN=" + testToken}, args...)
}

func BenchmarkDispatch(b *testing.B) {
	for _, kind := range agentKinds() {
		for _, parallel := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/parallel=%d", kind.name, parallel), func(b *testing.B) {
				eng := startEngine(b, enginetest.Options{})
				w := kind.start(b, eng, parallel)
				wk := attach(b, eng)
				// Warm up: the first call pays for page cache misses.
				wait(b, run(b, wk, "warm"))
				b.ResetTimer()
				// The agent's own CPU a call (its runners' is not in it):
				// steadier than calls/s on a machine others use.
				pid := w.cmd.Process.Pid
				cpuBefore := cpuTime(b, pid)
				defer func() {
					b.ReportMetric(float64((cpuTime(b, pid)-cpuBefore).Microseconds())/float64(b.N), "cpu-µs/call")
				}()
				callsPerSecond(b, parallel, func(i int) bool {
					c, err := wk.Run(map[string]any{"call_id": "d" + strconv.Itoa(i)})
					if err != nil {
						b.Error(err)
						return false
					}
					answer, _, err := c.WaitTimeout(60 * time.Second)
					if err != nil || !answer.OK {
						b.Errorf("call %d: %v %s", i, err, answer.Raw)
						return false
					}
					return true
				})
			})
		}
	}
}

func BenchmarkRelay(b *testing.B) {
	for _, kind := range agentKinds() {
		b.Run(kind.name, func(b *testing.B) {
			eng := startEngine(b, enginetest.Options{})
			w := kind.start(b, eng, 1)
			wk := attach(b, eng)
			wait(b, run(b, wk, "warm", step{"events": 10}))
			time.Sleep(200 * time.Millisecond)
			pid := w.cmd.Process.Pid
			idleRSS := memMiB(b, pid, "VmRSS")
			cpuBefore := cpuTime(b, pid)
			// The peak is the relay's, not start-up's: "5" resets VmHWM
			// to the present RSS (proc(5), clear_refs).
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
				b.Logf("peak-rss-MiB is since start-up: %v", err)
			}
			peakAnon := sampleMax(b, pid, "RssAnon")
			b.ResetTimer()
			start := time.Now()
			c := run(b, wk, "relay", step{"events": b.N})
			got := 0
			for {
				m, err := c.Next(timeoutCtx(b, 5*time.Minute))
				if err != nil {
					b.Fatal(err)
				}
				if m.IsAnswer() {
					break
				}
				got++
			}
			elapsed := time.Since(start)
			b.StopTimer()
			if got < b.N {
				b.Fatalf("relayed %d of %d events", got, b.N)
			}
			cpu := cpuTime(b, pid) - cpuBefore
			peak := memMiB(b, pid, "VmHWM")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/event")
			b.ReportMetric(idleRSS, "idle-rss-MiB")
			b.ReportMetric(memMiB(b, pid, "VmRSS"), "rss-MiB")
			b.ReportMetric(memMiB(b, pid, "RssAnon"), "anon-MiB")
			b.ReportMetric(peak, "peak-rss-MiB")
			b.ReportMetric(peakAnon(), "peak-anon-MiB")
		})
	}
}

// cpuTime is the user plus system CPU time a process has used.
func cpuTime(t testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

// sampleMax samples a /proc/PID/status field every 2 ms until the
// function it returns is called, which returns the largest value seen.
func sampleMax(t testing.TB, pid int, field string) func() float64 {
	stop := make(chan struct{})
	done := make(chan float64)
	peak := memMiB(t, pid, field)
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- peak
				return
			case <-tick.C:
				if v, ok := readMiB(pid, field); ok {
					peak = max(peak, v)
				}
			}
		}
	}()
	return func() float64 {
		close(stop)
		return <-done
	}
}

// memMiB reads a process's memory from /proc/PID/status: VmRSS is all it
// has resident, RssAnon the part that is its own (heap, stacks), without the
// pages of its executable and libraries that the page cache shares.
func memMiB(t testing.TB, pid int, field string) float64 {
	v, ok := readMiB(pid, field)
	if !ok {
		t.Fatalf("no %s in /proc/%d/status", field, pid)
	}
	return v
}

func readMiB(pid int, field string) (float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			kb, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			return kb / 1024, true
		}
	}
	return 0, false
}

// BenchmarkProcessBound is the floor under sequential dispatch while each
// call starts a process: start the fake runner, hand it a request, read its
// answer, reap it. No agent, no socket.
func BenchmarkProcessBound(b *testing.B) {
	request := []byte(`{"op":"run","call_id":"bound"}` + "\n")
	start := time.Now()
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(fakeRunnerPath(b), "runtime.py")
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stdin.Write(request)
		buf := make([]byte, 4096)
		if n, err := stdout.Read(buf); err != nil || n == 0 {
			b.Fatal(err)
		}
		stdin.Close()
		cmd.Wait()
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
}

// callsPerSecond makes b.N calls, parallel at a time, each numbered call
// made by one, and reports calls/s; a call that returns false stops its
// goroutine.
func callsPerSecond(b *testing.B, parallel int, call func(i int) bool) {
	var next sync.Mutex
	n := 0
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < parallel; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				i := n
				n++
				next.Unlock()
				if i >= b.N || !call(i) {
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
}
