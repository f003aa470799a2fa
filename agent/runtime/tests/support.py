"""Test support: the runtime as a real subprocess, and a loopback artifact store.

Standard library only, like the runtime. The interpreter that runs the
runtime is $FLUKSIO_TEST_PYTHON, else the one running the tests.
"""

import array
import atexit
import hashlib
import http.server
import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.join(os.path.dirname(HERE), "worker_main.py")
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
PYTHON = os.environ.get("FLUKSIO_TEST_PYTHON") or sys.executable
TOKEN = "test-token"


def _use_a_private_tmpdir() -> None:
    """Makes the temporary directory a new one of this test run's own, removed when it ends.

    Without a call directory the runtime keeps its SDK module and shipped
    code in the temporary directory, and a runner a test kills cannot remove
    them: every runtime started from here, and every test's own temporary
    files, use this directory, so a run leaves nothing in /tmp.
    """
    path = tempfile.mkdtemp(prefix="fluksio-runtime-tests-")
    atexit.register(shutil.rmtree, path, True)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path


_use_a_private_tmpdir()


def source(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def run_request(code, function, inputs=None, settings=None, call_id="c1", filename="pipeline.py"):
    return {
        "op": "run",
        "call_id": call_id,
        "node": {"source": source(code), "filename": filename},
        "function": function,
        "inputs": inputs or {},
        "settings": settings or {},
    }


def compile_request(code, call_id="k1", filename="pipeline.py"):
    return {"op": "compile", "call_id": call_id, "node": {"source": source(code), "filename": filename}}


class Call:
    """One runtime process, driven the way the agent drives it.

    The request goes in as one line and stdin stays open. Every stdout line
    is checked to be a JSON object carrying the call_id; lines are timed as
    they arrive so tests can tell streamed from buffered.
    """

    def __init__(self, request, env=None, raw_request=None, python=None):
        self.call_id = request.get("call_id") if isinstance(request, dict) else None
        self.tmp = tempfile.mkdtemp(prefix="fluksio-call-")
        self.stderr_path = os.path.join(self.tmp, "stderr")
        full_env = dict(os.environ)
        full_env.pop("PYTHONPATH", None)
        full_env.setdefault("FLUKSIO_ARTIFACT_CACHE", os.path.join(self.tmp, "cache"))
        full_env.update(env or {})
        self.started = time.monotonic()
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [python or PYTHON, RUNTIME],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=full_env,
                cwd=self.tmp,
                start_new_session=True,  # its own process group, as the agent does
            )
        line = raw_request if raw_request is not None else (json.dumps(request) + "\n").encode()
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
        self.lines = queue.Queue()
        self.violations = []
        self.raw_count = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            self.raw_count += 1
            try:
                obj = json.loads(raw)
            except ValueError:
                self.violations.append(raw[:200])
                continue
            if not isinstance(obj, dict) or obj.get("call_id") != self.call_id:
                self.violations.append(raw[:200])
                continue
            self.lines.put((time.monotonic() - self.started, obj))
        self.lines.put(None)

    def next(self, timeout=30.0):
        """The next protocol line as (seconds since start, object); None at EOF."""
        return self.lines.get(timeout=timeout)

    def wait(self, timeout=60.0):
        """Reads up to the answer; returns (answer, events) and ends the process group."""
        deadline = time.monotonic() + timeout
        events = []
        try:
            while True:
                item = self.next(max(0.1, deadline - time.monotonic()))
                if item is None:
                    raise AssertionError("runtime exited without an answer; stderr:\n" + self.stderr()[-3000:])
                at, obj = item
                if obj.get("event"):
                    events.append(obj)
                    continue
                self.answer_at = at
                return obj, events
        except queue.Empty:
            raise AssertionError("no answer in %.0fs; stderr:\n%s" % (timeout, self.stderr()[-3000:]))
        finally:
            self.close()

    def until_exit(self, timeout=60.0):
        """Reads to the end of stdout and waits for the runner to exit by itself; returns (answer, exit status)."""
        answer = None
        while True:
            item = self.next(timeout)
            if item is None:
                break
            if not item[1].get("event"):
                answer = item[1]
        return answer, self.proc.wait(timeout)

    def signal_group(self, signum):
        os.killpg(self.proc.pid, signum)

    def close(self):
        # The agent stops the whole group once the answer is in.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.proc.stdin.close()
        self.reader.join(5)
        self.proc.stdout.close()

    def stderr(self):
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def cleanup(self):
        self.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Zygote:
    """The runtime in zygote mode (--fluksio-zygote REPORT CONTROL EXITS MODS), asked for runners as the worker asks."""

    def __init__(self, preload="", env=None):
        read_fd, write_fd = os.pipe()
        self.exits_r, exits_w = os.pipe()
        self.exits = {}  # pid -> raw wait status, as the zygote reported it
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        args = [PYTHON, RUNTIME, "--fluksio-zygote", str(write_fd), str(theirs.fileno()), str(exits_w), preload]
        self.proc = subprocess.Popen(
            args,
            pass_fds=[write_fd, theirs.fileno(), exits_w],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, **(env or {})),
        )
        os.close(write_fd)
        os.close(exits_w)
        theirs.close()
        with os.fdopen(read_fd) as report:
            self.report = json.load(report)

    def exit_status(self, pid, timeout=30.0):
        """The raw wait status the zygote reported for its runner pid, or None at the report pipe's end."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.exits_r], [], [], left)[0]:
                raise AssertionError("the zygote did not report the exit of %d within %.0f s" % (pid, timeout))
            record = os.read(self.exits_r, 16)  # each report is one write of 16 bytes
            if not record:
                return None
            self.exits[int.from_bytes(record[:4], sys.byteorder, signed=True)] = int.from_bytes(record[4:8], sys.byteorder)
        return self.exits.pop(pid)

    def fork(self, env, cwd="", stderr_fd=None, dumps=json.dumps):
        """Asks for one runner; returns (pid, its stdin's write end, its stdout's read end, the node's output read ends).

        stderr_fd, when given, is the runner's stderr (the worker's log);
        otherwise it is /dev/null. dumps writes the request's JSON.
        """
        ends = [os.pipe(), os.pipe(), os.pipe(), os.pipe()]
        stderr = os.dup(stderr_fd) if stderr_fd is not None else os.open(os.devnull, os.O_WRONLY)
        # The runner's: stdin's read end, stdout's write end, stderr, the node's output write ends.
        theirs = [ends[0][0], ends[1][1], stderr, ends[2][1], ends[3][1]]
        msg = dumps({"env": env, "cwd": cwd, "token": "0" * 32}).encode()
        self.control.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))])
        pid = int(self.control.recv(32))
        for fd in theirs:
            os.close(fd)
        return pid, ends[0][1], ends[1][0], [ends[2][0], ends[3][0]]

    def run(self, request, env, cwd="", after=0.0, node_output=None):
        """Runs request in a forked runner, written after that many seconds; returns its answer once the runner is gone.

        node_output, a list, gets what the node wrote to its stdout and its
        stderr (the pipes the worker reads; up to a pipe's buffer each).
        """
        pid, stdin_w, stdout_r, outputs = self.fork(env, cwd)
        time.sleep(after)
        with os.fdopen(stdin_w, "wb") as stdin:
            stdin.write(json.dumps(request).encode() + b"\n")
        with os.fdopen(stdout_r, "rb") as stdout:
            lines = stdout.read().decode().splitlines()
        if node_output is not None:
            for fd in outputs:
                with os.fdopen(fd, "rb") as out:
                    node_output.append(out.read().decode())
            outputs = []
        for fd in outputs:
            os.close(fd)
        return json.loads(lines[-1]) if lines else None

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.control.close()
        os.close(self.exits_r)


class RuntimeTestCase(unittest.TestCase):
    """Runs calls and checks the protocol stayed clean in every one."""

    def call(self, request, env=None, **kwargs):
        c = Call(request, env=env, **kwargs)
        self.addCleanup(c.cleanup)
        self.addCleanup(self._check_clean, c)
        return c

    def _check_clean(self, c):
        c.close()
        self.assertEqual(c.violations, [], "stdout carried lines that are not protocol")

    def run_call(self, request, env=None, timeout=60.0, **kwargs):
        c = self.call(request, env=env, **kwargs)
        answer, events = c.wait(timeout)
        return answer, events, c

    def assertOk(self, answer):
        self.assertTrue(answer.get("ok"), "expected ok, got %s" % json.dumps(answer, indent=1)[:3000])

    def assertError(self, answer, kind, *fragments):
        self.assertIs(answer.get("ok"), False, answer)
        err = answer["error"]
        self.assertEqual(err["type"], kind, err)
        self.assertEqual(set(err), {"type", "message", "short", "traceback"})
        self.assertTrue(err["short"].startswith(kind), err)
        for fragment in fragments:
            self.assertIn(fragment, err["message"])
        self.assertNotIn("worker_main.py", err["traceback"], "runtime frames must be trimmed")
        return err


def logs(events, stream=None):
    return [e["line"] for e in events if e["event"] == "log" and (stream is None or e["stream"] == stream)]


def streams(events):
    return [e["values"] for e in events if e["event"] == "stream"]


# ---------------------------------------------------------------------------
# A content-addressed artifact store on loopback, as the engine serves it
# ---------------------------------------------------------------------------


class ArtifactStore:
    """PUT/GET <url>/sha256:<hex> with a bearer token, kept on disk.

    `fail(method, status, body, times)` makes the next requests of a method
    answer an error, to exercise the runtime's retries and messages.
    """

    PREFIX = "/api/v1/artifacts/"

    def __init__(self, token=TOKEN):
        self.token = token
        self.dir = tempfile.mkdtemp(prefix="fluksio-store-")
        self.lock = threading.Lock()
        self.failures = []
        self.requests = []
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                store._handle(self, "PUT")

            def do_GET(self):
                store._handle(self, "GET")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d/api/v1/artifacts" % self.server.server_address[1]

    def env(self):
        return {"FLUKSIO_ARTIFACT_URL": self.url, "FLUKSIO_ARTIFACT_TOKEN": self.token}

    def fail(self, method, status, body="", times=1):
        with self.lock:
            self.failures.extend([(method, status, body)] * times)

    def path(self, digest):
        return os.path.join(self.dir, digest.replace(":", "_"))

    def put_bytes(self, data, digest=None):
        """Stores bytes directly (digest given: store them under a wrong name)."""
        digest = digest or "sha256:" + hashlib.sha256(data).hexdigest()
        with open(self.path(digest), "wb") as f:
            f.write(data)
        return digest

    def has(self, digest):
        return os.path.exists(self.path(digest))

    def read(self, digest):
        with open(self.path(digest), "rb") as f:
            return f.read()

    def count(self, method):
        with self.lock:
            return sum(1 for r in self.requests if r[0] == method)

    def _reply(self, h, status, body=b"", ctype="text/plain"):
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _drain(self, h):
        left = int(h.headers.get("Content-Length") or 0)
        while left > 0:
            chunk = h.rfile.read(min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)

    def _handle(self, h, method):
        with self.lock:
            self.requests.append((method, h.path, dict(h.headers.items())))
            failure = next((f for f in self.failures if f[0] == method), None)
            if failure:
                self.failures.remove(failure)
        if h.headers.get("Authorization") != "Bearer " + self.token:
            self._drain(h)
            return self._reply(h, 401, b"unknown worker token")
        if failure:
            self._drain(h)
            return self._reply(h, failure[1], failure[2].encode())
        if not h.path.startswith(self.PREFIX + "sha256:"):
            self._drain(h)
            return self._reply(h, 404, b"no such endpoint")
        digest = h.path[len(self.PREFIX):]
        if method == "PUT":
            return self._put(h, digest)
        if not self.has(digest):
            return self._reply(h, 404, b"no artifact " + digest.encode())
        size = os.path.getsize(self.path(digest))
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(size))
        h.end_headers()
        with open(self.path(digest), "rb") as f:
            shutil.copyfileobj(f, h.wfile, 1 << 20)

    def _put(self, h, digest):
        left = int(h.headers["Content-Length"])
        sha = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=self.dir)
        with os.fdopen(fd, "wb") as out:
            while left > 0:
                chunk = h.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                sha.update(chunk)
                out.write(chunk)
                left -= len(chunk)
        if "sha256:" + sha.hexdigest() != digest:
            os.unlink(tmp)
            return self._reply(h, 400, b"digest mismatch")
        os.replace(tmp, self.path(digest))
        self._reply(h, 201, json.dumps({"digest": digest, "stored": True}).encode(), "application/json")

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)
