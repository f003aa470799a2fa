"""A benchmark of one runner's own costs: request to answer, and answer to exit.

Not a test (unittest's discovery skips it): run it by hand, with the
interpreter to measure,

    python3 agent/runtime/tests/bench_runner.py [--calls 50] [--numpy] [--runtime OLD/worker_main.py]

For each way a runner starts — cold (a fresh interpreter per call, as with
`--warm 0`) and forked from a zygote (as a spare is, with `--preload numpy`
when --numpy is given) — it runs a trivial node (or, with --numpy, a node
that uses numpy) the way the worker does: the request on stdin, the node's
output on pipes at descriptors 3 and 4. The runner is ready and waiting
before its request is written, as a spare is. It prints the median and 90th
percentile of

- call: the request written to the answer read (the runtime's own work on
  the call, plus the node, plus two pipe trips);
- exit: the answer read to the process gone (what a slot waits for before
  it is handed on);
- exit CPU: the runner's CPU time after its answer (user + system, from
  wait4, less what it had used when the answer came); for a runner cold
  only: a forked runner is its zygote's child, which reaps it and reports
  only its exit status;
- USS: the memory the runner holds alone while it waits for its request.
"""

import argparse
import array
import ctypes
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.join(os.path.dirname(HERE), "worker_main.py")

TRIVIAL = "from fluksio import Port, node\n@node(provides=[Port('y', 'int')])\ndef f(x=1):\n    return x + 1\n"
NUMPY = "import numpy\nfrom fluksio import Port, node\n@node(provides=[Port('y', 'float')])\ndef f(x=1):\n    return float(numpy.float64(x) + 1)\n"
PR_SET_CHILD_SUBREAPER = 36
# Long enough for a runner (a cold interpreter on a loaded machine too) to
# be waiting on its request: the bench measures a spare's call, not its start.
READY_S = 0.3
CALL_DIR = ""


def request(source, n):
    return json.dumps({"op": "run", "call_id": "b%d" % n, "node": {"source": source, "filename": "bench.py"},
                       "function": "f", "inputs": {"x": 1}, "settings": {}}).encode() + b"\n"


def cpu_of(pid):
    """The CPU seconds a live process's threads have used so far (schedstat: nanoseconds, not ticks); NaN once it is gone.

    A forked runner is its zygote's child, which may have reaped it by now.
    """
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except FileNotFoundError:
        return float("nan")
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            pass  # a thread that ended just now
    return total / 1e9


def one_call(pid, stdin_w, stdout_r, source, n, exits=None):
    """Writes the request, reads the answer, waits for the exit; returns (call s, exit s, exit CPU s).

    exits(pid), when given, waits for the exit and returns its status (the
    runner is not this process's child).
    """
    try:
        return _one_call(pid, stdin_w, stdout_r, source, n, exits)
    finally:
        shutil.rmtree(CALL_DIR, ignore_errors=True)
        os.mkdir(CALL_DIR, 0o700)


def uss_of(pid):
    """The memory only this process holds (Private_Clean + Private_Dirty), in bytes."""
    total = 0
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def _one_call(pid, stdin_w, stdout_r, source, n, exits):
    time.sleep(READY_S)
    uss = uss_of(pid)
    start = time.perf_counter()
    os.write(stdin_w, request(source, n))
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(stdout_r, 1 << 16)
        if not chunk:
            raise SystemExit("runner exited without an answer")
        data += chunk
    answered = time.perf_counter()
    cpu_at_answer = cpu_of(pid)
    answer = json.loads(data.decode().splitlines()[-1])
    if not answer.get("ok"):
        raise SystemExit("call failed: %s" % answer)
    if exits is None:
        _, status, usage = os.wait4(pid, 0)
        exit_cpu = usage.ru_utime + usage.ru_stime - cpu_at_answer
    else:
        status, exit_cpu = exits(pid), float("nan")
    gone = time.perf_counter()
    if status != 0:
        raise SystemExit("runner exited with status %d" % status)
    os.close(stdin_w)
    os.close(stdout_r)
    return answered - start, gone - answered, exit_cpu, uss


def cold(python, source, n):
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    token_r, token_w = os.pipe()
    os.write(token_w, b"0" * 32)
    os.close(token_w)
    # The node's pipes at 3 and 4 and the mark's token at 5, as the worker
    # passes them (a runtime from before the token's pipe takes it from
    # argv, and leaves fd 5 alone).
    args = [python, RUNTIME, "--fluksio-output", "3"]
    with open(RUNTIME) as f:
        if "OUTPUT_TOKEN_AFTER" not in f.read():
            args.append("0" * 32)
    proc = subprocess.Popen(args, stdin=stdin_r, stdout=stdout_w,
                            stderr=subprocess.DEVNULL, pass_fds=(3, 4, 5),
                            preexec_fn=lambda: (os.dup2(out_w, 3), os.dup2(err_w, 4), os.dup2(token_r, 5)),
                            start_new_session=True)
    for fd in (stdin_r, stdout_w, out_w, err_w, token_r):
        os.close(fd)
    result = one_call(proc.pid, stdin_w, stdout_r, source, n)
    proc.returncode = 0  # reaped by wait4
    os.close(out_r)
    os.close(err_r)
    return result


class Zygote:
    def __init__(self, python, preload):
        report_r, report_w = os.pipe()
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = [report_w, theirs.fileno()]
        # A runtime that reaps its runners reports their exits on a pipe;
        # an older one forks twice, and its runners are adopted here.
        self.exits_r = None
        with open(RUNTIME) as f:
            if "class ExitReports" in f.read():
                self.exits_r, exits_w = os.pipe()
                fds.append(exits_w)
        self.proc = subprocess.Popen([python, RUNTIME, "--fluksio-zygote"] + [str(fd) for fd in fds] + [preload],
                                     pass_fds=fds, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in fds[:1] + fds[2:]:
            os.close(fd)
        theirs.close()
        with os.fdopen(report_r) as report:
            failed = json.load(report)["failed"]
        if failed:
            raise SystemExit("preload failed: %s" % failed)

    def exit_of(self, pid):
        """Waits for the zygote's report of pid's exit (16 bytes: pid, raw wait status, peak memory); returns the status."""
        while True:
            record = os.read(self.exits_r, 16)
            if not record:
                raise SystemExit("the zygote exited")
            if int.from_bytes(record[:4], sys.byteorder, signed=True) == pid:
                return int.from_bytes(record[4:8], sys.byteorder)

    def call(self, source, n):
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        dev_null = os.open(os.devnull, os.O_WRONLY)
        theirs = [stdin_r, stdout_w, dev_null, out_w, err_w]
        msg = json.dumps({"env": ["%s=%s" % kv for kv in os.environ.items()], "cwd": "", "token": "0" * 32}).encode()
        self.control.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))])
        pid = int(self.control.recv(32))
        for fd in theirs:
            os.close(fd)
        result = one_call(pid, stdin_w, stdout_r, source, n, self.exit_of if self.exits_r is not None else None)
        os.close(out_r)
        os.close(err_r)
        return result

    def close(self):
        self.control.close()
        self.proc.wait()


def summary(name, values):
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
    return "%s %.2f ms (p90 %.2f)" % (name, statistics.median(values) * 1000, p90 * 1000)


def main():
    global CALL_DIR, RUNTIME
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--numpy", action="store_true", help="a numpy node, and the zygote preloads numpy")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--only", choices=("cold", "forked"), help="run only this kind of runner")
    parser.add_argument("--runtime", default=RUNTIME, help="another worker_main.py to measure (an older one, to compare)")
    args = parser.parse_args()
    RUNTIME = os.path.abspath(args.runtime)
    # An older runtime's forked runners are the zygote's grandchildren: adopt them, to wait for them.
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    source = NUMPY if args.numpy else TRIVIAL
    # Each runner's call directory, as the worker gives one (emptied after
    # each call), and an artifact cache of the bench's own (the code cache).
    state = tempfile.mkdtemp(prefix="fluksio-bench-")
    os.environ["FLUKSIO_CALL_DIR"] = CALL_DIR = os.path.join(state, "call")
    os.environ["FLUKSIO_ARTIFACT_CACHE"] = os.path.join(state, "artifacts")
    os.mkdir(CALL_DIR, 0o700)
    zygote = Zygote(args.python, "numpy" if args.numpy else "")
    try:
        kinds = [("cold", lambda n: cold(args.python, source, n)), ("forked", lambda n: zygote.call(source, n))]
        print("%s, %s, %s node, %d calls each" % (RUNTIME, args.python, "numpy" if args.numpy else "trivial", args.calls))
        for name, run in kinds:
            if args.only and name != args.only:
                continue
            run(-1)  # warm-up: the page cache, the zygote's first fork
            results = [run(n) for n in range(args.calls)]
            print("%-7s %s | %s | %s | USS %.1f MiB" % (name, summary("call", [r[0] for r in results]),
                                                        summary("exit", [r[1] for r in results]),
                                                        summary("exit CPU", [r[2] for r in results]),
                                                        statistics.median(r[3] for r in results) / 2**20))
    finally:
        zygote.close()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
