// Package runnertest is a compiled stand-in for Python and the runtime in
// the worker's tests and benchmarks, so that what is tested and measured is
// the worker. test/fakerunner is it as a program; the tests of agent and
// agent/runner run it by re-executing their own test binary (the
// helper-process pattern), with EnvVar set in the runner's environment:
//
//	func TestMain(m *testing.M) {
//		if runnertest.Enabled() {
//			runnertest.Main()
//		}
//		os.Exit(m.Run())
//	}
//
// Started as `RUNNER RUNTIME_PATH`, it reads one request line and follows
// the request's "steps", then answers ok with what it saw. Started as
// `RUNNER RUNTIME_PATH [...] --fluksio-spare FD [MODULES]` it is a spare (as the
// runtime's spare mode): it reports {"watch": [[RUNTIME_PATH, true]],
// "failed": {...}} on FD, every module whose name starts with "missing"
// failed, then waits for its request. Started as `RUNNER RUNTIME_PATH
// --fluksio-capabilities` it says it speaks spare mode, as the runtime
// does; with FAKERUNNER_NO_MODES=1 in its environment it knows no flag
// (an engine's runner from before the modes), and takes that for a call
// whose request never comes. Started as `RUNNER -c …` it answers
// the agent's Python version check; as `RUNNER -m pip freeze` it prints a
// fixed package list (after FAKERUNNER_FREEZE_MS milliseconds of CPU, when
// that is set).
//
// Steps (each an object with one key; a step it does not know ends the
// runner with status 3 and a message on stderr, so a test that misspells
// one fails instead of passing for the wrong reason):
//
//	{"events": N}         N stream events {"call_id","event":"stream","values":{"i":k}}
//	{"paced_events": N}   the same, one every 100 ms, as a generator node yields
//	{"padded_events": N}  the same, each with 4 KiB more ("pad"), as fast as the pipe takes them
//	{"raw": "text"}       a raw stdout line (garbage, or hand-written JSON)
//	{"raw_hex": "hex"}    a raw stdout line given as hex, for bytes JSON cannot carry
//	{"stderr": "text"}    a line on stderr
//	{"stderr_lines": N}   N numbered lines on stderr, as fast as the pipe takes them
//	{"sleep_ms": N}       sleep
//	{"grandchild": true}  start a child that holds stdout open and sleeps; its pid is in the answer
//	{"exit": N}           exit with status N without answering
//	{"answer_bytes": N}   make the answer carry a string of N bytes
//	{"ignore_term": true} ignore SIGTERM from now on
//	{"on_term_answer": true} on SIGTERM, answer NodeCancelled and exit
//	{"env": ["NAME"]}     report these variables in the answer
//	{"no_answer": true}   end without answering (exit 0)
//	{"announce": true}    an event {"event":"started","pid":N} with the runner's pid
//	{"pipe_size": N}      grow the stdout pipe to N bytes (Linux), so more output can wait in it
//	{"helpers": "M"}      start four processes that sleep, with M-plain, M-stubborn, M-setsid and
//	                      M-daemon in their argv: a plain child, a child that ignores SIGTERM, a
//	                      `setsid -f` daemon and a double-forked daemon in a session of its own
//	                      that ignores SIGTERM too;
//	                      then an event {"event":"helpers"}
//	{"kill_self": true}   kill itself with SIGKILL, as the OOM killer would
//	{"alloc_mb": N}       allocate and touch N MiB, and hold them
//	{"setsid": true}      start a child in a session of its own (setsid) that holds stdout and
//	                      stderr and ignores SIGTERM; its pid is in an event {"event":"setsid","pid":N}
package runnertest

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvVar, set to 1 in a process's environment, makes Enabled true.
const EnvVar = "FLUKSIO_TEST_FAKE_RUNNER"

// Enabled reports whether this process is to be the fake runner: a test
// binary re-executed as a runner, or one of the processes it started.
func Enabled() bool { return os.Getenv(EnvVar) == "1" }

// Main is the fake runner; it exits the process when it is done.
func Main() {
	run()
	os.Exit(0)
}

func run() {
	// RUNTIME [--fluksio-output FD] --fluksio-spare FD [MODULES]: the
	// node's output pipes are left alone (what the node prints is the fake
	// runner's own stderr).
	for i := 2; i+1 < len(os.Args); i++ {
		if os.Args[i] == "--fluksio-spare" {
			spare(os.Args[1], os.Args[i+1], os.Args[i+2:])
			break
		}
	}
	if len(os.Args) == 3 && os.Args[2] == "--fluksio-capabilities" && os.Getenv("FAKERUNNER_NO_MODES") != "1" {
		fmt.Println(`{"version": "fake", "modes": ["--fluksio-spare"]}`)
		return
	}
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "-c":
			fmt.Println("3.11.0")
			return
		case "-m":
			// FAKERUNNER_FREEZE_MS: pip freeze's CPU cost, spent busy, as
			// a real one spends it (a third of a second with a few dozen
			// packages), for benchmarks of what it costs a fleet.
			if ms, err := strconv.Atoi(os.Getenv("FAKERUNNER_FREEZE_MS")); err == nil {
				burnCPU(time.Duration(ms) * time.Millisecond)
			}
			fmt.Println("fakerunner==1.0")
			return
		case "--hold":
			// The grandchild: keep the inherited stdout open.
			time.Sleep(time.Hour)
			return
		case "--hold-ignore-term":
			signal.Ignore(syscall.SIGTERM)
			time.Sleep(time.Hour)
			return
		}
	}
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	line, err := in.ReadBytes('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakerunner: no request:", err)
		os.Exit(3)
	}
	var req struct {
		CallID string           `json:"call_id"`
		Op     string           `json:"op"`
		Steps  []map[string]any `json:"steps"`
	}
	if err := json.Unmarshal(line, &req); err != nil {
		fmt.Fprintln(os.Stderr, "fakerunner: bad request:", err)
		os.Exit(3)
	}
	out := bufio.NewWriterSize(os.Stdout, 64<<10)
	id, _ := json.Marshal(req.CallID)
	result := map[string]any{"request": json.RawMessage(line), "pid": os.Getpid()}
	answerBytes := 0
	var held [][]byte // what alloc_mb took
	for _, step := range req.Steps {
		for key, v := range step {
			n, _ := v.(float64)
			switch key {
			case "events":
				for i := 0; i < int(n); i++ {
					fmt.Fprintf(out, `{"call_id":%s,"event":"stream","values":{"i":%d}}`+"\n", id, i)
				}
				out.Flush()
			case "paced_events":
				for i := 0; i < int(n); i++ {
					fmt.Fprintf(out, `{"call_id":%s,"event":"stream","values":{"i":%d}}`+"\n", id, i)
					out.Flush()
					time.Sleep(100 * time.Millisecond)
				}
			case "padded_events":
				pad := strings.Repeat("x", 4096)
				for i := 0; i < int(n); i++ {
					fmt.Fprintf(out, `{"call_id":%s,"event":"stream","values":{"i":%d,"pad":"%s"}}`+"\n", id, i, pad)
				}
				out.Flush()
			case "raw":
				fmt.Fprintln(out, v)
				out.Flush()
			case "raw_hex":
				b, _ := hex.DecodeString(v.(string))
				out.Write(append(b, '\n'))
				out.Flush()
			case "stderr":
				fmt.Fprintln(os.Stderr, v)
			case "stderr_lines":
				errw := bufio.NewWriterSize(os.Stderr, 64<<10)
				for i := 0; i < int(n); i++ {
					fmt.Fprintf(errw, "node log line %d\n", i)
				}
				errw.Flush()
			case "sleep_ms":
				time.Sleep(time.Duration(n) * time.Millisecond)
			case "grandchild":
				child := exec.Command(os.Args[0], "--hold")
				child.Stdout = os.Stdout
				if err := child.Start(); err != nil {
					fmt.Fprintln(os.Stderr, "fakerunner:", err)
					os.Exit(3)
				}
				result["grandchild"] = child.Process.Pid
				fmt.Fprintf(out, `{"call_id":%s,"event":"grandchild","pid":%d}`+"\n", id, child.Process.Pid)
				out.Flush()
			case "exit":
				out.Flush()
				os.Exit(int(n))
			case "answer_bytes":
				answerBytes = int(n)
			case "ignore_term":
				signal.Ignore(syscall.SIGTERM)
			case "on_term_answer":
				term := make(chan os.Signal, 1)
				signal.Notify(term, syscall.SIGTERM)
				go func() {
					<-term
					fmt.Printf(`{"call_id":%s,"ok":false,"error":{"type":"NodeCancelled","message":"runner saw SIGTERM","short":"NodeCancelled: runner saw SIGTERM","traceback":""}}`+"\n", id)
					os.Exit(0)
				}()
			case "env":
				env := map[string]string{}
				for _, name := range v.([]any) {
					env[name.(string)] = os.Getenv(name.(string))
				}
				result["env"] = env
			case "pipe_size":
				const fSetPipeSize = 1031 // F_SETPIPE_SZ
				if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, os.Stdout.Fd(), fSetPipeSize, uintptr(n)); errno != 0 {
					fmt.Fprintln(os.Stderr, "fakerunner: F_SETPIPE_SZ:", errno)
					os.Exit(3)
				}
			case "announce":
				fmt.Fprintf(out, `{"call_id":%s,"event":"started","pid":%d}`+"\n", id, os.Getpid())
				out.Flush()
			case "helpers":
				m := v.(string)
				self := os.Args[0]
				for _, cmd := range []*exec.Cmd{
					exec.Command(self, "--hold", m+"-plain"),
					exec.Command(self, "--hold-ignore-term", m+"-stubborn"),
					exec.Command("setsid", "-f", self, "--hold", m+"-setsid"),
					exec.Command("sh", "-c", `(setsid "$0" --hold-ignore-term "$1" &)`, self, m+"-daemon"),
				} {
					cmd.Stderr = os.Stderr
					if err := cmd.Start(); err != nil {
						fmt.Fprintln(os.Stderr, "fakerunner:", err)
						os.Exit(3)
					}
					if cmd.Args[0] != self {
						cmd.Wait() // setsid -f and sh return once their daemon is off
					}
				}
				fmt.Fprintf(out, `{"call_id":%s,"event":"helpers"}`+"\n", id)
				out.Flush()
			case "setsid":
				child := exec.Command(os.Args[0], "--hold-ignore-term")
				child.Stdout, child.Stderr = os.Stdout, os.Stderr
				child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
				if err := child.Start(); err != nil {
					fmt.Fprintln(os.Stderr, "fakerunner:", err)
					os.Exit(3)
				}
				fmt.Fprintf(out, `{"call_id":%s,"event":"setsid","pid":%d}`+"\n", id, child.Process.Pid)
				out.Flush()
			case "alloc_mb":
				// Touch every page, so the memory is really used.
				out.Flush()
				mem := make([]byte, int(n)<<20)
				for i := 0; i < len(mem); i += 4096 {
					mem[i] = 1
				}
				held = append(held, mem)
			case "kill_self":
				out.Flush()
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Hour)
			case "no_answer":
				out.Flush()
				os.Exit(0)
			default:
				out.Flush()
				fmt.Fprintf(os.Stderr, "fakerunner: unknown step %q\n", key)
				os.Exit(3)
			}
		}
	}
	if answerBytes > 0 {
		result["blob"] = strings.Repeat("x", answerBytes)
	}
	if len(held) > 0 {
		result["held_mb"] = len(held) // keeps what alloc_mb took until the answer
	}
	b, _ := json.Marshal(map[string]any{"call_id": req.CallID, "ok": true, "outputs": result})
	out.Write(b)
	out.WriteByte('\n')
	out.Flush()
}

// spare reports as the runtime's spare mode does, on descriptor fd: the
// runtime file is what its code came from.
func spare(runtime, fd string, preloads []string) {
	n, err := strconv.Atoi(fd)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakerunner: bad spare descriptor:", fd)
		os.Exit(3)
	}
	failed := map[string]string{}
	for _, m := range preloads {
		for _, name := range strings.Split(m, ",") {
			if strings.HasPrefix(name, "missing") {
				failed[name] = "ModuleNotFoundError: No module named '" + name + "'"
			}
		}
	}
	report := os.NewFile(uintptr(n), "report")
	json.NewEncoder(report).Encode(map[string]any{"watch": [][2]any{{runtime, true}}, "failed": failed})
	report.Close()
}

// burnCPU spins until the process has used d of CPU time (not wall time:
// on a loaded machine a fleet's freezes take longer, as real ones do).
func burnCPU(d time.Duration) {
	for {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		if time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) >= d {
			return
		}
		for i := 0; i < 100000; i++ {
		}
	}
}
