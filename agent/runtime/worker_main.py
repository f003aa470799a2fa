"""The embedded Fluksio runtime: the Python side of every fluksio-worker call.

Every call runs in a runner of this file, a process of its own: one the Go
agent starts as ``PYTHON worker_main.py`` for the call (cold), one it
started ahead of the call (a spare), or one forked from a warm process of
this file (a zygote); the modes below say which. The agent writes one JSON
request line on the runner's stdin and reads JSON lines back on its stdout
(the line protocol in agent/protocol/doc.go; the request schema in
README.md here). This file owns everything on the Python side of that trip:

- the protocol channel: the process's real stdout carries protocol lines and
  nothing else; node code's fd 1 and fd 2 are pipes that become ``log``
  events (rate-bounded): the worker's, which it reads itself, or, started
  without them, this file's own, echoed on the runner's real stderr;
- loading node code (shipped source or an importable module) and the
  ``fluksio`` SDK surface when the real SDK is not installed;
- calling the node (plain, generator or async), validating every stream
  value and output against the declared ports;
- the answer, including errors with tracebacks trimmed to the user's frames,
  and ``NodeCancelled`` when the agent sends SIGTERM;
- ``save_artifact`` / ``load_artifact`` against the engine's artifact store,
  streamed in both directions so a file of any size never sits in memory.

It is shipped as this one file and uses the standard library only (Python
3.8 and later). A runner handles one request, answers, and exits; nothing
of one call passes to the next. A zygote handles none: it forks runners.

Started with no flag, it is a runner started cold. Started with
``--fluksio-capabilities`` alone, it says what it is (its version and the
modes it speaks, report_capabilities) and exits: the worker asks once per
runtime file. The worker also starts it in three modes, each a flag right
after this file's path (their constants are the block "The worker's wire"
below; agent/runner/wire.go is the worker's half, and a test there pins
each value to its twin here):

- ``--fluksio-output FD``: the node's stdout and stderr are the worker's
  pipes at FD and FD+1, which the worker reads itself; at FD+2 is a pipe
  holding the token of the output marks, read to its end and closed before
  any node code runs (take_output_pipes).
- Spare mode, ``--fluksio-spare FD [MOD,MOD]``: started before its call
  exists, with the call's exact environment; it imports the modules, reports
  on FD what it loaded (spare_prepare), then waits for its one request like
  any runner.
- Zygote mode, ``--fluksio-zygote REPORT CONTROL EXITS [MOD,MOD]``: it
  imports and reports as a spare does, then forks a runner for each request
  the worker sends on CONTROL and reports each runner's exit on EXITS
  (zygote_serve). It runs no node code; each runner it forks is a runner
  started cold with the worker's pipes, with its call's environment.

The file reads in that order: the wire, then what every call needs (the
protocol channel, the node's output, cancel, the SDK, artifacts,
validation, loading the node, the call), then the modes (spare, zygote,
the worker's output pipes) and main, which picks the mode and runs the
call.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.path:
    # Python 3.11's -P on every version: the runtime's own directory,
    # first on the path as a script's is, is the worker's, and nothing in
    # it is to be imported (a json.py planted there would run in every
    # later runner). Before any import that could look there.
    del sys.path[0]

import os


# The fork handlers registered in this process from here on, as they are
# registered: the module that registered each, and its handlers (keyword
# arguments of os.register_at_fork). A zygote forks without Python's own
# fork and runs them itself (zygote_fork); in every other mode
# zygote_serve puts os.register_at_fork back before any node code runs.
FORK_HANDLERS = []
_REGISTER_AT_FORK = getattr(os, "register_at_fork", None)


def _recorded_register_at_fork(**handlers):
    _REGISTER_AT_FORK(**handlers)
    try:
        module = sys._getframe(1).f_globals.get("__name__", "")
    except ValueError:
        module = ""  # called from C with no Python frame under it
    FORK_HANDLERS.append((module, handlers))


if _REGISTER_AT_FORK is not None:
    os.register_at_fork = _recorded_register_at_fork

import _signal
import _thread
import collections
import gc
import hashlib
import importlib
import io
import json
import linecache
import math
import numbers
import random
import re
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
import types

# asyncio and http.client are imported where they are used: every call
# starts a fresh interpreter, and most calls need neither (together they
# cost ~0.1 s of start-up).

# The runtime's source file. The worker starts runners from the bytecode it
# compiled beside it (__pycache__), where __file__ names the .pyc: the code's
# own file name is the source's either way, and is what tracebacks show.
RUNTIME_FILE = os.path.abspath(sys._getframe().f_code.co_filename)

# ---------------------------------------------------------------------------
# The worker's wire: what agent/runner/wire.go has as well, value for value
# (TestWireMatchesTheRuntime compares them). Change both, or neither.
# ---------------------------------------------------------------------------

# The modes' flags (the module docstring).
SPARE_FLAG = "--fluksio-spare"
ZYGOTE_FLAG = "--fluksio-zygote"
OUTPUT_FLAG = "--fluksio-output"
# What this runtime is, said once: started with CAPABILITIES_FLAG alone, it
# writes one JSON object on stdout and exits (report_capabilities): its
# RUNTIME_VERSION under CAPABILITY_VERSION, and under CAPABILITY_MODES the
# flags of the modes it speaks (MODES). The worker asks each runtime file
# once before it starts one in a mode; a runtime without the flag takes it
# for a call whose request never comes, and is started in none.
CAPABILITIES_FLAG = "--fluksio-capabilities"
RUNTIME_VERSION = "1"
MODES = (OUTPUT_FLAG, SPARE_FLAG, ZYGOTE_FLAG)
CAPABILITY_VERSION = "version"
CAPABILITY_MODES = "modes"
# A spare's (and a zygote's) report, one JSON object (preload_and_report):
# under SPARE_WATCH the [path, existed] pairs its code came from, under
# SPARE_FAILED the preloads that failed and why, and, in a zygote with
# threads, under SPARE_THREADS how many (SPARE_THREADS_COUNT) and the
# preload that started the first (SPARE_THREADS_MODULE).
SPARE_WATCH = "watch"
SPARE_FAILED = "failed"
SPARE_THREADS = "threads"
SPARE_THREADS_COUNT = "count"
SPARE_THREADS_MODULE = "module"
# A zygote that sandboxes its forks and cannot says why under SPARE_NO_FORKS.
SPARE_NO_FORKS = "no_forks"
# How far past --fluksio-output's FD the token's pipe is.
OUTPUT_TOKEN_AFTER = 2
# A zygote's fork request: one JSON object with these keys, and FORK_FDS
# descriptors: the runner's stdin, stdout and stderr and the node's two
# output pipes, which the runner gets at 0 to 4 (its output pipes at
# FORKED_OUTPUT_FD and the next). The answer is the runner's pid in decimal,
# FORK_FAILED where there is none.
# FORK_ENV is the runner's environment (a list of NAME=VALUE), FORK_CWD
# its working directory ("": the zygote's), FORK_TOKEN its output mark's.
# A request with other keys, or with these in another order, is refused.
FORK_ENV = "env"
FORK_CWD = "cwd"
FORK_TOKEN = "token"
FORK_REQUEST_KEYS = (FORK_ENV, FORK_CWD, FORK_TOKEN)
# A fork request's shape, which the zygote checks with this pattern, not
# by parsing it: the call's environment, a string a variable, would be
# allocated in the zygote's pages, which it then copies at the next fork
# (44 of the 150 it copies a fork). The fork parses it. A JSON string in
# the unrolled form (a run of plain characters between escapes) matches
# in linear time and keeps no backtracking state per character.
_JSON_WS = r"[ \t\n\r]*"
_JSON_STR = r'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'
_JSON_STRS = r"(?:null|\[W(?:SW(?:,WSW)*)?\])".replace("S", _JSON_STR).replace("W", _JSON_WS)
FORK_REQUEST_SHAPE = (
    r"\{"
    + ",".join(_JSON_WS + '"%s"' % key + _JSON_WS + ":" + _JSON_WS + value + _JSON_WS for key, value in zip(FORK_REQUEST_KEYS, (_JSON_STRS, _JSON_STR, _JSON_STR)))
    + r"\}"
)
FORK_FDS = 5
FORKED_OUTPUT_FD = 3
FORK_FAILED = b"0"
# In a zygote's environment where the worker sandboxes calls, a JSON list:
# the directory of the call directories, which each fork hides but for its
# own, and the owner's paths, which it shows above its own /tmp
# (sandbox_fork). Its report says, under "no_forks", why forks cannot be
# sandboxed where they cannot.
SANDBOX_FORKS_ENV = "FLUKSIO_SANDBOX_FORKS"
# In a zygote's environment, "1" where its forks' memory is not held to a
# per-call limit: the zygote may then pin the pages its forks write, which
# each fork then copies at once, charged to the zygote's cgroup
# (PINNED_FOR_FORKS).
PIN_FORKS_ENV = "FLUKSIO_PIN_FORKS"
# One exit report of a zygote (ExitReports), in one write, in native byte
# order: the runner's pid, its raw wait status, its peak memory in KiB.
EXIT_RECORD_FORMAT = "=iIQ"
EXIT_RECORD_SIZE = 16
# The output mark written into the worker's pipes before each stream event:
# MARK_PREFIX, the token (MARK_TOKEN_SIZE hex digits), MARK_SUFFIX.
MARK_PREFIX = b"\x00fluksio:"
MARK_SUFFIX = b"\x00"
MARK_TOKEN_SIZE = 32

# Log events are bounded so a node printing in a tight loop cannot flood the
# engine: a burst of LOG_BURST lines, then LOG_RATE lines per second. Under a
# flood the beginning and the end are kept and the middle goes: the newest
# LOG_TAIL lines over the budget are held back, sent as the budget refills
# and all of them before the answer (the end of a run, `FINAL accuracy=...`,
# is what matters most), and a "lines dropped here" note stands where lines
# went missing. The runner's stderr still gets every line (that is the local
# log, and its reader provides back-pressure).
LOG_BURST = 1000
LOG_RATE = 200.0
LOG_TAIL = 100
# One log line longer than this is cut: a progress bar without newlines or a
# dumped array must not become one event of hundreds of MiB.
LOG_LINE_MAX = 8192
# The environment the worker gives every runner, beyond the call's: the
# call's directory (removed once the call's processes are gone), its
# --cancel-grace in seconds (cancel_grace), the artifact store's URL and
# token, and the artifact cache (the code cache in it).
CALL_DIR_ENV = "FLUKSIO_CALL_DIR"
CANCEL_GRACE_ENV = "FLUKSIO_CANCEL_GRACE"
ARTIFACT_URL_ENV = "FLUKSIO_ARTIFACT_URL"
ARTIFACT_TOKEN_ENV = "FLUKSIO_ARTIFACT_TOKEN"
ARTIFACT_CACHE_ENV = "FLUKSIO_ARTIFACT_CACHE"
# In a sandbox: the worker's artifact cache, whose entries a call may
# load by name from its shown/ directory, read-only (the call caches what
# it fetches in its own FLUKSIO_ARTIFACT_CACHE, which the worker takes
# into this one once the call is gone, if its bytes have their digest:
# agent/artifacts Adopt).
ARTIFACT_SHARED_ENV = "FLUKSIO_ARTIFACT_SHARED"
# (The end of the worker's wire.)

# Artifact transfers: chunk size for hashing and streaming, and the retry
# policy for connection errors and 5xx answers.
CHUNK = 1 << 20
HTTP_TRIES = 4
HTTP_BACKOFF_S = 0.5
HTTP_TIMEOUT_S = 120.0

# After SIGTERM the node gets this long to unwind through its finally blocks
# (a checkpoint saved in `finally:`) before the runtime answers on its own.
# The worker hands its --cancel-grace over as FLUKSIO_CANCEL_GRACE (seconds)
# and sends SIGKILL only a moment after it, so the answer still goes out.
# Without the variable (an older agent, the unit tests) the runtime keeps a
# short grace that any agent's SIGKILL leaves room for.
DEFAULT_CANCEL_GRACE_S = 1.0


def cancel_grace() -> float:
    try:
        grace = float(os.environ.get(CANCEL_GRACE_ENV, ""))
    except ValueError:
        return DEFAULT_CANCEL_GRACE_S
    return grace if math.isfinite(grace) and grace >= 0 else DEFAULT_CANCEL_GRACE_S

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

# What the protocol is written with, bound here at import, before any node
# code runs: node code may patch the standard library (json.dumps made to
# indent, os.write wrapped, print or sys.stdout replaced), and none of that
# may reach the protocol. ASCII-only JSON: any string (lone surrogates from
# odd file names included) travels as valid UTF-8.
_ENCODE = json.JSONEncoder(ensure_ascii=True, allow_nan=False).encode
_WRITE = os.write
_SIGTERM, _SIG_IGN = int(signal.SIGTERM), int(signal.SIG_IGN)
# The real os._exit; in the runner, node code's goes through exit_after_output.
_EXIT = os._exit


class NodeCancelled(BaseException):
    """Raised in the node's thread when the agent cancels the call.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` in node
    code does not swallow a cancel.
    """


class BadRequest(Exception):
    """The request line is not a request this runtime understands."""


# ---------------------------------------------------------------------------
# The protocol channel
# ---------------------------------------------------------------------------


class Channel:
    """Writes protocol lines to the runner's real stdout, one whole line at a time.

    Two threads write here (the node's thread: stream events and the answer;
    the log pump: log events), so a lock keeps lines whole. After the answer
    nothing else is written: the agent stops reading at the answer.
    """

    def __init__(self, fd: int, call_id: str = ""):
        self.fd = fd
        self.call_id = call_id
        self.lock = threading.Lock()
        self.answered = False
        self.pid = os.getpid()  # only this process speaks the protocol

    def close_in_child(self) -> None:
        """In a forked child: the protocol is the runner's alone.

        The child's copy of the descriptor is closed and every later write
        is dropped, so a forked worker can neither answer nor send events
        (the lock is new too: the thread holding the runner's may not exist
        here).
        """
        self.lock = threading.Lock()
        self.answered = True
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def _write(self, obj: dict) -> None:
        if self.pid != os.getpid():
            return
        view = memoryview((_ENCODE(obj) + "\n").encode("ascii"))
        if self.fd < 0:
            return  # a forked child's, or a rehearsal's
        while view:
            n = _WRITE(self.fd, view)
            view = view[n:]

    def event(self, kind: str, **fields) -> None:
        obj = {"call_id": self.call_id, "event": kind}
        obj.update(fields)
        with self.lock:
            if not self.answered:
                self._write(obj)

    def answer(self, obj: dict) -> bool:
        """Writes the answer unless one was written; True if this one was."""
        full = {"call_id": self.call_id}
        full.update(obj)
        with self.lock:
            if self.answered:
                return False
            try:
                self._write(full)
            except (TypeError, ValueError) as exc:
                # The validators should have caught this; never leave the
                # agent without an answer because of it.
                self._write(error_answer_fields(exc, self.call_id))
            self.answered = True
            return True


def error_answer_fields(exc: BaseException, call_id: str = "", where: str = "") -> dict:
    kind, message = describe_exception(exc)
    if where and not re.search(r"\bline \d+", message):
        message = "%s (%s)" % (message, where) if message else where
    return {
        "call_id": call_id,
        "ok": False,
        "error": {
            "type": kind,
            "message": message,
            "short": "%s: %s" % (kind, message) if message else kind,
            "traceback": user_traceback(exc),
        },
    }


def describe_exception(exc: BaseException):
    kind = type(exc).__name__
    if isinstance(exc, SystemExit):
        return kind, "the node called sys.exit(%r)" % (exc.code,)
    if isinstance(exc, KeyboardInterrupt) and not str(exc):
        return kind, "the node was interrupted (SIGINT)"
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the answer
        message = "<unprintable %s>" % kind
    return kind, message


def _is_runtime_frame(frame: traceback.FrameSummary) -> bool:
    # The runtime's own frames and importlib's machinery tell the user
    # nothing about their node; the frames of their code (and of the
    # libraries it called) stay.
    name = frame.filename
    return name == RUNTIME_FILE or name.startswith("<frozen importlib")


def _trim(te: traceback.TracebackException, seen: set) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if not _is_runtime_frame(f)])
    for f in te.stack:
        f.filename = SHIPPED_AS.get(f.filename, f.filename)  # the engine's name for shipped source
    for nested in (te.__cause__, te.__context__):
        if nested is not None:
            _trim(nested, seen)


def user_traceback(exc: BaseException) -> str:
    try:
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        _trim(te, set())
        return "".join(te.format())
    except Exception:  # formatting must never cost the answer
        return "".join(traceback.format_exception_only(type(exc), exc))


# ---------------------------------------------------------------------------
# Node output capture: fd 1 and fd 2 become pipes read by one pump thread
# ---------------------------------------------------------------------------


# \r ends a line too: progress bars redraw with \r and no \n.
LINE_END = re.compile(b"\r\n|\n|\r")
CUT_MARK = " … [line cut at %d bytes]" % LOG_LINE_MAX


class Captured:
    """One captured descriptor: its name and the line being assembled.

    A line longer than LOG_LINE_MAX is sent cut, with a mark, and the rest of
    it is skipped up to its end: one dumped array must not become megabytes
    of log.
    """

    def __init__(self, name: str):
        self.name = name
        self.pending = b""
        self.cutting = False

    def feed(self, data: bytes) -> list:
        """The complete lines data finishes (blank ones left out)."""
        lines = []
        parts = LINE_END.split(data)
        for part in parts[:-1]:
            if self.cutting:
                self.cutting = False  # the end of a line already sent cut
            else:
                self._take(lines, self.pending + part)
            self.pending = b""
        if not self.cutting:
            self.pending += parts[-1]
            if len(self.pending) > LOG_LINE_MAX:
                self._take(lines, self.pending)
                self.pending = b""
                self.cutting = True
        return lines

    def rest(self) -> list:
        """The unfinished line, at the end of the call."""
        lines = []
        if not self.cutting:
            self._take(lines, self.pending)
        self.pending, self.cutting = b"", False
        return lines

    @staticmethod
    def _take(lines: list, line: bytes) -> None:
        if not line.strip():
            return  # empty, or what a progress bar clears itself with ("\r" + spaces)
        if len(line) > LOG_LINE_MAX:
            line = line[:LOG_LINE_MAX] + CUT_MARK.encode("utf-8")
        lines.append(line)


class LogPump:
    """Turns what the node writes on fd 1 and fd 2 into bounded log events.

    For a runtime started without the worker's pipes (its unit tests, a
    worker older than --fluksio-output); the worker reads them itself with
    the same rules (agent/runner/nodeout.go).

    Redirecting the file descriptors (not just sys.stdout) catches C-level
    writes and child processes too. One thread selects over both pipes so
    the node never blocks on a full pipe while the runtime is busy.
    """

    def __init__(self, channel: Channel, echo_fd: int):
        self.channel = channel
        self.echo_fd = echo_fd
        self.streams = {}  # read fd -> Captured
        self.tokens = float(LOG_BURST)
        self.refilled = time.monotonic()
        self.held = collections.deque()  # (name, raw) over the budget, oldest first
        self.dropped = 0  # lines dropped since the last one sent
        # The node's thread wakes the pump through this pipe to ask for a
        # drain (sync) or the final drain (finish); `drained` counts answers.
        self.wake_r, self.wake_w = os.pipe()
        self.cond = threading.Condition()
        self.asked = 0
        self.drained = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="fluksio-log-pump", daemon=True)

    def capture(self, target_fd: int, name: str) -> None:
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, target_fd)  # inheritable: child processes log too
        os.close(write_fd)
        self.streams[read_fd] = Captured(name)

    def start(self) -> None:
        self.thread.start()

    def sync(self, timeout: float = 0.5) -> None:
        """Waits until everything written so far went out as log events.

        Called before each stream event, so a line printed before a yield
        arrives before that yield's values. Bounded: a pump stuck on a slow
        stderr reader must not stall the node.
        """
        with self.cond:
            self.asked += 1
            target = self.asked
            _WRITE(self.wake_w, b"s")
            self.cond.wait_for(lambda: self.drained >= target or not self.thread.is_alive(), timeout)

    def finish(self, timeout: float = 2.0) -> None:
        """Drains what was written so far, then stops the pump.

        Waiting for EOF is not enough: a grandchild the node left running may
        hold the pipe open forever. So the pump reads until nothing is
        immediately readable, which covers every write that already returned.
        """
        with self.cond:
            self.stopping = True
        _WRITE(self.wake_w, b"f")
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.wake_r] + list(self.streams), [], [])
                if self.wake_r in ready:
                    os.read(self.wake_r, 4096)
                    with self.cond:
                        target, stopping = self.asked, self.stopping
                    self._drain()
                    if stopping:
                        for fd in list(self.streams):
                            self._flush_partial(fd)
                    self._release(final=stopping)
                    with self.cond:
                        self.drained = target
                        self.cond.notify_all()
                    if stopping:
                        break
                    continue
                for fd in ready:
                    self._read(fd)
        except Exception as exc:  # the pump must not die silently
            self._echo(("fluksio runtime: log pump failed: %r\n" % (exc,)).encode())
        finally:
            with self.cond:
                self.cond.notify_all()

    def _drain(self) -> None:
        """Reads until no captured pipe has anything waiting (briefly, if it keeps coming)."""
        deadline = time.monotonic() + 0.25
        while self.streams and time.monotonic() < deadline:
            ready, _, _ = select.select(list(self.streams), [], [], 0)
            if not ready:
                return
            for fd in ready:
                self._read(fd)

    def _read(self, fd: int) -> None:
        stream = self.streams[fd]
        data = os.read(fd, 65536)
        if not data:
            self._send(stream.name, stream.rest())
            del self.streams[fd]
            os.close(fd)
            return
        self._send(stream.name, stream.feed(data))

    def _flush_partial(self, fd: int) -> None:
        stream = self.streams[fd]
        self._send(stream.name, stream.rest())

    def _send(self, name: str, lines: list) -> None:
        if lines:
            self._echo(b"\n".join(lines) + b"\n")
            for line in lines:
                self._log(name, line)

    def _echo(self, data: bytes) -> None:
        try:
            while data:
                data = data[_WRITE(self.echo_fd, data):]
        except OSError:
            pass  # nobody reads our stderr any more; the events still go

    def _log(self, name: str, raw: bytes) -> None:
        now = time.monotonic()
        self.tokens = min(float(LOG_BURST), self.tokens + (now - self.refilled) * LOG_RATE)
        self.refilled = now
        self.held.append((name, raw))
        if len(self.held) > LOG_TAIL:
            self.held.popleft()
            self.dropped += 1
        while self.held and self.tokens >= 1:
            self.tokens -= 1
            self._emit(*self.held.popleft())

    def _release(self, final: bool) -> None:
        """Settles the held lines: all sent at the end of the call, dropped before a stream event.

        Before a stream event they cannot wait (they would arrive after
        values the node yielded later), and sending them past the budget at
        every yield would let a chatty generator flood the engine.
        """
        if not final:
            self.dropped += len(self.held)
            self.held.clear()
        self._note_dropped()
        while self.held:
            self._emit(*self.held.popleft())

    def _emit(self, name: str, raw: bytes) -> None:
        self._note_dropped()
        self.channel.event("log", stream=name, line=raw.decode("utf-8", "replace"))

    def _note_dropped(self) -> None:
        if self.dropped:
            count, self.dropped = self.dropped, 0
            self.channel.event(
                "log",
                stream="stderr",
                line="… %d lines dropped here (a call's log events are limited to %d lines, then %d a second; the runner's stderr has them all)"
                % (count, LOG_BURST, int(LOG_RATE)),
            )


_FFLUSH = []


def flush_node_output() -> None:
    """Pushes what node code buffered (Python and C stdio) into the pipes."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if not _FFLUSH:
        try:
            import ctypes

            _FFLUSH.append(ctypes.CDLL(None).fflush)
        except Exception:
            _FFLUSH.append(None)
    if _FFLUSH[0] is not None:
        _FFLUSH[0](None)  # printf output of C extensions


def flush_logging() -> None:
    """Flushes the node's logging handlers, before the answer: what they hold goes out as the call's output.

    A logging.handlers.MemoryHandler keeps records until it is flushed,
    which logging does at exit, after the answer, when the engine no
    longer takes the call's output. Only flushed: closing them is the
    exit's (logging.shutdown). A handler whose lock another thread holds
    is left, rather than hold up the answer.
    """
    logging = sys.modules.get("logging")
    if logging is None:
        return
    for ref in list(getattr(logging, "_handlerList", ())):
        handler = ref()
        lock = getattr(handler, "lock", None)
        if handler is None or lock is None or not lock.acquire(timeout=0.05):
            continue
        try:
            handler.flush()
        except Exception:
            pass  # a handler that fails to flush fails at exit as it would in a script
        finally:
            lock.release()


# ---------------------------------------------------------------------------
# Cancel: SIGTERM from the agent
# ---------------------------------------------------------------------------


class Cancel:
    """SIGTERM turns into NodeCancelled in the node's thread.

    The exception is held back while the runtime writes a protocol line (an
    exception in the middle of a write would leave half a line), and a
    watcher thread answers on its own if the node does not unwind within
    the cancel grace (code stuck in C, or code that swallowed the exception).
    """

    def __init__(self):
        self.requested = False
        self.shield = 0
        self.on_timeout = None  # set by the call: writes the answer and exits
        self.wakeup = ()  # the wakeup pipe's (read, write) descriptors
        # Set once a SIGTERM is read off the wakeup pipe, which the C-level
        # handler writes to whatever Python handler node code installed.
        # The lock makes reading the pipe and setting the flag one step, so
        # cancelled() never misses a SIGTERM the watcher is taking.
        self.signalled = False
        self.pipe_lock = threading.Lock()
        # The watcher thread's life, and the exit's watchdog it becomes
        # once the call answered (watch_exit).
        self.watching = False
        self.at_exit = None

    def install(self) -> None:
        _signal.signal(_SIGTERM, self._handler)  # not signal's: its enums cost a fork pages
        try:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            os.set_blocking(read_fd, False)
            # The C-level handler writes the signal number here at once, even
            # while the main thread is busy in C code and cannot run Python.
            signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            self.wakeup = (read_fd, write_fd)
            self.poller = select.poll()
            self.poller.register(read_fd, select.POLLIN)
            # A bare thread: threading's would make this one wait until it
            # runs (on a busy machine, a spare ready that much later), and
            # node code never waits for it (as threading does not for a
            # daemon thread).
            self.watching = True
            _thread.start_new_thread(self._watch, (read_fd,))
        except (ValueError, OSError, RuntimeError):
            self.watching = False

    def forget_in_child(self) -> None:
        """In a forked child: SIGTERM is the child's business again.

        A pool's terminate() sends its workers SIGTERM; with the runner's
        handler and wakeup pipe inherited, a worker would raise
        NodeCancelled and, worse, write to the pipe the runner watches, so
        the runner would take it as its own cancel.
        """
        try:
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            pass
        try:
            if signal.getsignal(signal.SIGTERM) == self._handler:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        if self.wakeup:
            read_fd, write_fd = self.wakeup
            try:
                # Should the C handler still write there, it writes nowhere:
                # the number stays taken, by /dev/null.
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, write_fd)
                os.close(devnull)
                os.close(read_fd)
            except OSError:
                pass
        self.wakeup = ()
        self.requested = False
        self.on_timeout = None

    def _handler(self, signum, frame) -> None:
        if os.getpid() != RUNNER_PID[0]:
            # A forked child got SIGTERM before forget_in_child could run
            # (fork hooks block it, so this is for forks that skip them):
            # what SIGTERM does to a child is end it.
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            except (OSError, ValueError):
                pass
            _EXIT(128 + signal.SIGTERM)
        self.requested = True
        if not self.shield:
            raise NodeCancelled("the call was cancelled")

    def check(self) -> None:
        if self.requested and not self.shield:
            raise NodeCancelled("the call was cancelled")

    def cancelled(self) -> bool:
        """Whether the runner got SIGTERM, even if node code's own handler took it."""
        if self.wakeup:
            # Polled first: reading an empty pipe raises, which costs a
            # call's path more than the poll. Under the lock: the watcher
            # may have read the signal and not yet set the flag.
            with self.pipe_lock:
                pending = self.poller.poll(0)
            if pending:
                self._take_signals(self.wakeup[0])
        return self.signalled

    def _take_signals(self, read_fd: int) -> bool:
        with self.pipe_lock:
            try:
                data = os.read(read_fd, 64)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if signal.SIGTERM in data:
                self.signalled = True
            return bool(data)

    def watch_exit(self, watchdog) -> bool:
        """Makes the watcher thread run watchdog, as the runner's exit begins; False if it cannot.

        One thread fewer to start after the answer, and to end at the
        exit. It cannot when there is none, or when a cancel already took
        it (SIGTERM is the default action by now: no other is coming).
        """
        with self.pipe_lock:
            if not self.watching or self.signalled:
                return False
            self.at_exit = watchdog
        try:
            _WRITE(self.wakeup[1], b"\0")  # not a signal number: wakes the watcher only
        except OSError:
            return False
        return True

    def _watch(self, read_fd: int) -> None:
        try:
            while True:
                try:
                    select.select([read_fd], [], [])
                except (OSError, ValueError):
                    return
                if not self._take_signals(read_fd):
                    return
                if self.at_exit is not None:
                    self.at_exit()
                    return
                if self.signalled:
                    time.sleep(cancel_grace())
                    if self.on_timeout is not None:
                        self.on_timeout()
                    return
        finally:
            self.watching = False


CANCEL = Cancel()
# The runner's pid, set by main(): forked children see another one.
RUNNER_PID = [os.getpid()]


class Shielded:
    """Holds back NodeCancelled while a protocol line is being written."""

    def __enter__(self):
        CANCEL.shield += 1

    def __exit__(self, *exc):
        CANCEL.shield -= 1
        if exc[0] is None:
            CANCEL.check()
        return False


# ---------------------------------------------------------------------------
# The fluksio SDK surface
# ---------------------------------------------------------------------------


class Port:
    """A node input or output: name, type, default, stream flag, list item type."""

    def __init__(self, name, type="json", initial=None, stream=False, item=None):
        self.name = name
        self.type = type
        self.initial = initial
        self.stream = stream
        self.item = item

    def __repr__(self):
        return "Port(%r, %r)" % (self.name, self.type)


class NodeSpec:
    """What @node recorded about one function."""

    def __init__(self, requires=None, provides=None, timeout=None, cache=True, device=None, **extra):
        self.requires = [port_dict(p) for p in as_list(requires)]
        self.provides = [port_dict(p) for p in as_list(provides)]
        self.timeout = timeout
        self.cache = cache
        self.device = device
        self.extra = extra


# Functions decorated while this runtime runs, keyed by id(function): filled
# by our own @node and by the observer around the real SDK's @node.
SPECS = {}


NODE_ARGS = ("requires", "provides", "timeout", "cache", "device")


def node(*args, **kwargs):
    """@node(requires=[...], provides=[...], timeout=, cache=, device=).

    Records the metadata and returns the function unchanged, so it stays
    callable in plain tests. Bare @node works too.
    """
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return _record(args[0], NodeSpec())
    spec = NodeSpec(**_node_kwargs(args, kwargs))
    return lambda fn: _record(fn, spec)


def _node_kwargs(args, kwargs) -> dict:
    if len(args) > len(NODE_ARGS):
        raise TypeError("node() takes at most %d positional arguments" % len(NODE_ARGS))
    merged = dict(zip(NODE_ARGS, args))
    merged.update(kwargs)
    return merged


def _record(fn, spec):
    SPECS[id(fn)] = (fn, spec)
    try:
        fn.__fluksio_node__ = spec
    except (AttributeError, TypeError):
        pass
    return fn


class Flow:
    """Inert on a worker: pipelines are assembled by the engine.

    Node files often build their Flow at module level; here that must import
    cleanly, so any method call is accepted and ignored (and chains).
    """

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: self


def use(*args, **kwargs):
    """Inert on a worker, like Flow: returns a record of its arguments."""
    return Flow(*args, **kwargs)


def as_list(ports):
    if ports is None:
        return []
    if isinstance(ports, (list, tuple)):
        return list(ports)
    return [ports]


def port_dict(port) -> dict:
    """Normalizes a Port from our SDK, the real SDK, a dict or a bare name."""
    if isinstance(port, str):
        fields = {"name": port}
    elif isinstance(port, dict):
        fields = dict(port)
    else:
        fields = {k: getattr(port, k, None) for k in ("name", "type", "initial", "stream", "item")}
    kind = fields.get("type") or "json"
    if isinstance(kind, type):
        kind = {dict: "json", tuple: "list"}.get(kind, kind.__name__)
    item = fields.get("item")
    if isinstance(item, type):
        item = item.__name__
    initial = fields.get("initial")
    if initial is not None and type(initial) not in (str, int, bool):
        try:
            json.dumps(initial, allow_nan=False)
        except (TypeError, ValueError):
            initial = repr(initial)
    return {
        "name": str(fields.get("name")),
        "type": str(kind),
        "initial": initial,
        "stream": bool(fields.get("stream")),
        "item": item,
    }


def spec_of(fn):
    """The node metadata of fn, from @node as recorded here or attributes."""
    hit = SPECS.get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1]
    spec = getattr(fn, "__fluksio_node__", None)
    if isinstance(spec, NodeSpec):
        return spec
    # The real SDK may keep its own record; read the common shapes.
    for attr in ("__fluksio_node__", "__fluksio__", "_fluksio_node", "__node__", "node_spec", "spec"):
        found = getattr(fn, attr, None)
        if found is None:
            continue
        get = found.get if isinstance(found, dict) else (lambda k, d=None, o=found: getattr(o, k, d))
        if get("requires") is not None or get("provides") is not None:
            return NodeSpec(
                requires=get("requires"),
                provides=get("provides"),
                timeout=get("timeout"),
                cache=get("cache", True),
                device=get("device"),
            )
    return None


def observe_real_node(sdk) -> None:
    """Wraps the real SDK's @node so this runtime learns each node's ports.

    The wrapper passes every call through and returns what the real
    decorator returns; it only records the arguments on the side.
    """
    real = getattr(sdk, "node", None)
    if real is None or getattr(real, "__fluksio_observer__", False):
        return

    def observed(*args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            result = real(*args)
            SPECS[id(result)] = (result, NodeSpec())
            return result
        inner = real(*args, **kwargs)
        spec = NodeSpec(**_node_kwargs(args, kwargs))

        def decorate(fn):
            result = inner(fn)
            SPECS[id(result)] = (result, spec)
            return result

        return decorate

    observed.__fluksio_observer__ = True
    observed.__doc__ = getattr(real, "__doc__", None)
    sdk.node = observed


# What `fluksio` offers node code when the real SDK is not installed.
SDK_NAMES = ("node", "Port", "Flow", "use", "save_artifact", "load_artifact")

# The SDK this process installed, once it did (a spare installs it before
# its preloads, and its call finds it there).
SDK = []

# The module other interpreters of the call import as `fluksio`: it loads
# this very file, under another name, and takes its SDK surface. There,
# artifacts raise RuntimeError as they do outside any call (a child has no
# call of its own).
SDK_MODULE = """\
\"\"\"The Fluksio SDK surface for the processes a node call starts, written by fluksio-worker's runtime.\"\"\"
import importlib.util as _util

_spec = _util.spec_from_file_location("_fluksio_worker_runtime", %r)
_runtime = _util.module_from_spec(_spec)
_spec.loader.exec_module(_runtime)
globals().update({_name: getattr(_runtime, _name) for _name in _runtime.SDK_NAMES})
__fluksio_runtime__ = _runtime.RUNTIME_VERSION
""" % (RUNTIME_FILE,)


def install_sdk(for_children: bool = True):
    """Makes `import fluksio` work for node code and binds artifacts to this call.

    Where the real SDK is not installed, the runner's own `fluksio` is a
    module made here, and a `fluksio` module for any other interpreter the
    call starts (a joblib/loky worker unpickling a node's function, a
    `subprocess.run([sys.executable, ...])`) is written into a directory of
    this call, last on sys.path and PYTHONPATH, which they inherit.
    """
    if SDK:
        return SDK[0]
    try:
        sdk = importlib.import_module("fluksio")
    except ImportError:
        sdk = None
    if sdk is not None and not hasattr(sdk, "__fluksio_runtime__"):
        observe_real_node(sdk)
    else:
        sdk = types.ModuleType("fluksio", "The Fluksio SDK surface, as provided by fluksio-worker's runtime.")
        for name, value in (("node", node), ("Port", Port), ("Flow", Flow), ("use", use)):
            setattr(sdk, name, value)
        sdk.__fluksio_runtime__ = RUNTIME_VERSION
        sys.modules["fluksio"] = sdk
        if for_children:
            sys.path.append(write_sdk_module())
    # Only these two are bound to this runtime, even with the real SDK: the
    # store and its token are this call's.
    sdk.save_artifact = save_artifact
    sdk.load_artifact = load_artifact
    SDK.append(sdk)
    return sdk


def write_sdk_module() -> str:
    """Writes the `fluksio` module for the call's other interpreters; returns its directory.

    It goes last on PYTHONPATH here, and the caller puts it on sys.path:
    spawn, forkserver and loky children take the runner's sys.path rather
    than reading PYTHONPATH. One file (a package would cost a directory
    more, a tenth of a millisecond on each call's path), written with
    plain descriptor calls (a file object would cost a forked runner
    dozens of pages copied from its zygote).
    """
    sdk_dir = call_dir("fluksio-sdk-")
    fd = os.open(os.path.join(sdk_dir, "fluksio.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(SDK_MODULE.encode("utf-8"))
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = (inherited + os.pathsep if inherited else "") + sdk_dir
    return sdk_dir


# ---------------------------------------------------------------------------
# Artifacts
# ---------------------------------------------------------------------------


class ArtifactCall:
    """Set while a node runs: artifacts are this call's, and only then."""

    active = False


def _store():
    if not ArtifactCall.active:
        raise RuntimeError("artifacts can only be saved or loaded while a node runs on a worker")
    base = os.environ.get(ARTIFACT_URL_ENV, "")
    if not base:
        raise RuntimeError("%s is not set: this worker has no artifact store" % ARTIFACT_URL_ENV)
    return base.rstrip("/"), os.environ.get(ARTIFACT_TOKEN_ENV, "")


def _connection(url: str):
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S)
    elif parts.scheme == "http":
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S)
    else:
        raise RuntimeError("FLUKSIO_ARTIFACT_URL must be http or https, not %r" % url)
    path = parts.path + ("?" + parts.query if parts.query else "")
    return conn, path


class _Retry(Exception):
    """A transient failure (connection trouble or 5xx): try again."""


def _with_retries(what: str, attempt):
    import http.client

    delay = HTTP_BACKOFF_S
    for n in range(1, HTTP_TRIES + 1):
        try:
            return attempt()
        except (_Retry, OSError, http.client.HTTPException) as exc:
            if n == HTTP_TRIES:
                raise RuntimeError("%s failed after %d tries: %s" % (what, n, exc)) from None
            # On the node's log, so a slow save is explained.
            sys.stderr.write("fluksio: %s: %s; retrying in %.1fs\n" % (what, exc, delay))
            time.sleep(delay * (0.75 + random.random() / 2))
            delay *= 2


def _check_status(what: str, resp) -> None:
    if 200 <= resp.status < 300:
        return
    body = resp.read(2000).decode("utf-8", "replace").strip()
    detail = "HTTP %d %s%s" % (resp.status, resp.reason, ": " + body if body else "")
    if resp.status >= 500:
        raise _Retry(detail)
    raise RuntimeError("%s was refused by the artifact store: %s" % (what, detail))


def _hash_file(path: str):
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def save_artifact(data, name="", media_type="application/octet-stream"):
    """Stores bytes, a file or a directory in the engine's artifact store; returns its reference.

    A file is hashed in one pass and streamed in a second, so its size does
    not matter. A directory is stored as a tar archive and loads back as a
    directory. The reference is a JSON-able dict with digest, name, size and
    media_type (and directory: true for a directory).
    """
    base, token = _store()
    if isinstance(data, (bytes, bytearray, memoryview)):
        body = bytes(data)
        hexdigest, size, path = hashlib.sha256(body).hexdigest(), len(body), None
    elif isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if os.path.isdir(path):
            return _save_directory(path, name, media_type)
        if not os.path.isfile(path):
            raise FileNotFoundError("save_artifact: no such file or directory: %s" % path)
        hexdigest, size = _hash_file(path)
        name = name or os.path.basename(path)
        body = None
    else:
        raise TypeError("save_artifact takes bytes or a file or directory path, not %s" % type(data).__name__)
    digest = "sha256:" + hexdigest
    what = "saving artifact %s (%s)" % (name or digest, digest)

    def attempt():
        conn, path_prefix = _connection(base)
        try:
            conn.putrequest("PUT", "%s/%s" % (path_prefix, digest))
            conn.putheader("Authorization", "Bearer " + token)
            conn.putheader("X-Artifact-Name", _header_safe(name))
            conn.putheader("Content-Type", media_type)
            conn.putheader("Content-Length", str(size))
            conn.endheaders()
            if body is not None:
                conn.send(body)
            else:
                _send_file(conn, path, hexdigest)
            resp = conn.getresponse()
            _check_status(what, resp)
            reply = resp.read(1 << 20)
        finally:
            conn.close()
        return reply

    reply = _with_retries(what, attempt)
    ref = {"digest": digest, "name": name, "size": size, "media_type": media_type}
    try:
        extra = json.loads(reply) if reply.strip() else {}
    except ValueError:
        extra = {}
    if isinstance(extra, dict):
        for key, value in extra.items():
            ref.setdefault(key, value)
    return ref


def _save_directory(path: str, name: str, media_type: str) -> dict:
    """Saves a directory as a tar archive (see pack_directory); loads give back a directory.

    The archive is built in the artifact cache, where it then stays as this
    digest's verified copy: loading it back on this worker fetches nothing.
    """
    cache = private_dir(os.path.join(private_dir(artifact_cache_dir()), "sha256"))
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".pack-")
    try:
        with os.fdopen(fd, "wb") as out:
            pack_directory(path, out)
        if media_type == "application/octet-stream":
            media_type = DIRECTORY_MEDIA_TYPE
        ref = save_artifact(tmp, name=name or os.path.basename(os.path.normpath(path)), media_type=media_type)
        ref["directory"] = True
        hexdigest = ref["digest"].split(":", 1)[1]
        final = os.path.join(cache, hexdigest)
        with _digest_lock(final):
            if not _verified_file(final, hexdigest):
                os.chmod(tmp, 0o444)
                os.replace(tmp, final)
                tmp = None
                _write_stamp(final, _stat_stamp(os.lstat(final)))
        return ref
    finally:
        if tmp is not None:
            _discard(tmp)


def _header_safe(name: str) -> str:
    """The name as a header value: non-ASCII and control characters escaped."""
    import urllib.parse

    return urllib.parse.quote(name, safe=" /._-()[]")


def _send_file(conn, path: str, hexdigest: str) -> None:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            conn.send(chunk)
    if h.hexdigest() != hexdigest:
        # The store would keep bytes under the wrong name; fail loudly.
        raise RuntimeError("save_artifact: %s changed while it was being saved" % path)


def artifact_cache_dir() -> str:
    configured = os.environ.get(ARTIFACT_CACHE_ENV)
    if configured:
        return configured
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "fluksio-worker", "artifacts")


def private_dir(path: str) -> str:
    """path as a directory only this user may write: created 0700, or checked.

    The cache is trusted (what is in it, with its stamp, is handed out as
    verified), so a directory someone else owns or may write to is refused
    rather than used. One of ours that others may merely read is tightened.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:
        raise RuntimeError(
            "cannot create the artifact cache %s: %s (set FLUKSIO_ARTIFACT_CACHE to a writable directory)" % (path, exc)
        ) from None
    if st.st_uid != os.getuid():
        raise RuntimeError(
            "the artifact cache %s belongs to uid %d, not to this worker (uid %d); refusing to trust it "
            "(remove it or set FLUKSIO_ARTIFACT_CACHE to a directory of this user's)" % (path, st.st_uid, os.getuid())
        )
    if st.st_mode & 0o022:
        raise RuntimeError(
            "the artifact cache %s may be written by others (mode %03o); refusing to trust it "
            "(chmod 700 it and remove what is in it, or set FLUKSIO_ARTIFACT_CACHE)" % (path, st.st_mode & 0o777)
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


# Cached artifacts are read-only files (directories: read-only trees), each
# with a stamp written when its content was last verified against the
# digest: inode, size, mtime and ctime. Any write, chmod or replacement
# changes the ctime, which nobody can set back, so a file whose stamp still
# matches holds the verified bytes and is handed out for the price of a
# stat. A file whose stamp does not match is hashed again, and fetched again
# if it no longer has its digest.
STAMP_SUFFIX = ".ok"


def _stat_stamp(st) -> str:
    return "%d %d %d %d %o" % (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):
        return ""


def _write_stamp(path: str, stamp: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".stamp-")
    with os.fdopen(fd, "w") as f:
        f.write(stamp)
    os.replace(tmp, path + STAMP_SUFFIX)


def _verified_file(path: str, hexdigest: str) -> bool:
    """True if path holds the digest's bytes (re-hashing only when its stamp is off)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if (st.st_mode & 0o170000) != 0o100000:  # not a regular file
        _discard(path)
        return False
    if _read_text(path + STAMP_SUFFIX) == _stat_stamp(st):
        return True
    # Changed since it was verified (or cached by an older runtime): hash it.
    try:
        good = _hash_file(path)[0] == hexdigest
    except OSError:
        good = False
    if not good:
        _discard(path)
        return False
    os.chmod(path, 0o444)
    _write_stamp(path, _stat_stamp(os.lstat(path)))
    return True


def _discard(path: str) -> None:
    """Removes a cached file or tree (read-only ones included) and its stamp."""
    import shutil

    for target in (path + STAMP_SUFFIX, path):
        if os.path.isdir(target) and not os.path.islink(target):
            for root, _, _ in os.walk(target):
                try:
                    os.chmod(root, 0o700)
                except OSError:
                    pass
            shutil.rmtree(target, ignore_errors=True)
        else:
            try:
                os.unlink(target)
            except OSError:
                pass


def _cache_file(cache: str, final: str, write) -> None:
    """Puts a verified file in place read-only, with its stamp; write(fileobj) fills it."""
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            os.fchmod(out.fileno(), 0o444)
        _discard(final)
        os.replace(tmp, final)
        tmp = None
        _write_stamp(final, _stat_stamp(os.lstat(final)))
    finally:
        if tmp is not None:
            _discard(tmp)


def load_artifact(ref):
    """Returns a local path holding the artifact's content, fetched once and verified.

    The path is read-only and shared by every call that loads the same
    digest: copy it to modify it. An artifact saved from a directory is
    returned as a (read-only) directory.
    """
    digest = ref.get("digest") if isinstance(ref, dict) else ref
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise ValueError("load_artifact takes a reference dict or a 'sha256:<64 hex>' digest, not %r" % (ref,))
    base, token = _store()
    hexdigest = digest.split(":", 1)[1]
    shared = _shared_artifact(hexdigest)
    if shared is not None and not is_directory_archive(shared):
        return shared
    cache = private_dir(os.path.join(private_dir(artifact_cache_dir()), "sha256"))
    final = os.path.join(cache, hexdigest)
    # Calls loading one digest at once (N evaluations of one saved model)
    # take turns: the first fetches and unpacks, the others find it done.
    with _digest_lock(final):
        if shared is not None:
            # A directory's archive in the worker's cache: unpacked here.
            _hold_in_use(final)
            return unpacked_directory(cache, shared, final + ".d")
        if not _verified_file(final, hexdigest):
            _fetch(base, token, digest, cache, final)
        _hold_in_use(final)
        if is_directory_archive(final):
            return unpacked_directory(cache, final)
        return final


def _shared_artifact(hexdigest: str):
    """The worker's verified file of the digest, where the sandbox shows its cache read-only; else None.

    The file is the one its stamp was written for (the worker verified its
    bytes, and nothing node code can reach may write there). A shared lock
    on its use file, held until this call's processes are gone, keeps the
    worker from removing it meanwhile; the use file in this call's own
    cache (_hold_in_use) tells the worker it was used.
    """
    top = os.environ.get(ARTIFACT_SHARED_ENV)
    if not top:
        return None
    import fcntl

    # Its entries' names in the directory shown (agent/artifacts Adopt),
    # which a call may open by name but not list.
    final = os.path.join(top, "shown", hexdigest)
    use = os.path.join(top, "shown", "." + hexdigest + ".use")
    try:
        if use not in IN_USE:
            fd = os.open(use, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                if not os.path.samestat(os.fstat(fd), os.stat(use)):
                    raise FileNotFoundError(use)  # removed while we waited for it
            except BaseException:
                os.close(fd)
                raise
            IN_USE[use] = fd
        st = os.lstat(final)
    except OSError:
        return None
    if (st.st_mode & 0o170000) != 0o100000 or _read_text(final + STAMP_SUFFIX) != _stat_stamp(st):
        return None
    try:
        own = private_dir(os.path.join(private_dir(artifact_cache_dir()), "sha256"))
        _hold_in_use(os.path.join(own, hexdigest))
    except (OSError, RuntimeError):
        pass  # only the worker's record of its last use is missed
    return final


class _digest_lock:
    """An exclusive lock on one cache entry, across processes: a lock file beside it.

    Everything that checks, fetches, unpacks or replaces an entry holds it,
    so two calls never unpack one archive at once, and none replaces a tree
    or file another has just verified. The kernel lets go of a lock whose
    process dies, so a killed call leaves none held. The worker removes a
    whole entry, lock file last, while it holds this lock (agent/artifacts):
    so once the lock is ours, the file locked must still be the one of that
    name, or it is locked again, anew.
    """

    def __init__(self, final: str):
        self.path = os.path.join(os.path.dirname(final), "." + os.path.basename(final) + ".lock")
        self.fd = -1

    def __enter__(self):
        import fcntl

        while True:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            try:
                if os.path.samestat(os.fstat(self.fd), os.stat(self.path)):
                    return self
            except FileNotFoundError:
                pass  # removed with its entry while we waited
            os.close(self.fd)

    def __exit__(self, *exc):
        os.close(self.fd)  # lets go of the lock
        return False


# The entries this process loaded: a shared lock on each one's use file,
# held until the process ends, by path.
IN_USE = {}


def _hold_in_use(final: str) -> None:
    """Keeps the entry from the worker's pruning while this call lives, and marks it used now.

    The caller holds the digest's lock. The path load_artifact returns may
    be opened any time until the call ends, so the entry stays until then:
    the worker removes an entry only when it can lock its use file
    exclusively (agent/artifacts), which this shared lock, held until this
    process and those it forked are gone, prevents. The file's modification
    time is the entry's last use, which the worker removes the least recent
    of first (access times are no use: relatime updates them once a day).
    """
    import fcntl

    path = os.path.join(os.path.dirname(final), "." + os.path.basename(final) + ".use")
    fd = IN_USE.get(path)
    if fd is None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        IN_USE[path] = fd
    os.utime(fd)


def _fetch(base: str, token: str, digest: str, cache: str, final: str) -> None:
    hexdigest = digest.split(":", 1)[1]
    what = "loading artifact %s" % digest

    def attempt():
        conn, path_prefix = _connection(base)
        try:
            conn.request("GET", "%s/%s" % (path_prefix, digest), headers={"Authorization": "Bearer " + token})
            resp = conn.getresponse()
            _check_status(what, resp)

            def write(out):
                h = hashlib.sha256()
                while True:
                    chunk = resp.read(CHUNK)
                    if not chunk:
                        break
                    h.update(chunk)
                    out.write(chunk)
                if h.hexdigest() != hexdigest:
                    raise _Retry("the store sent bytes whose digest is sha256:%s" % h.hexdigest())

            _cache_file(cache, final, write)
        finally:
            conn.close()

    _with_retries(what, attempt)


# ---------------------------------------------------------------------------
# Directories as artifacts: a POSIX (pax) tar archive with a marker
# ---------------------------------------------------------------------------

# A directory travels as an uncompressed pax tar whose global header carries
# this keyword; load_artifact recognises it and hands out the unpacked
# directory. The archive holds regular files and directories only (symlinks
# are followed when saving, so a Hugging Face snapshot of links to blobs
# keeps its content), with owners, times and write bits normalised, so the
# same content always has the same digest.
DIRECTORY_MARK = "FLUKSIO.directory"
DIRECTORY_MEDIA_TYPE = "application/x-tar"


def pack_directory(src: str, out) -> None:
    import tarfile

    seen = set()

    def info(path, arcname, is_dir):
        st = os.stat(path)
        ti = tarfile.TarInfo(arcname)
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.mtime = 0
        if is_dir:
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        else:
            ti.size, ti.mode = st.st_size, 0o755 if st.st_mode & 0o111 else 0o644
        return ti

    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={DIRECTORY_MARK: "1"}) as tf:
        for root, dirs, files in os.walk(src, followlinks=True):
            st = os.stat(root)
            if (st.st_dev, st.st_ino) in seen:  # a link back up the tree
                dirs[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            dirs.sort()
            rel = os.path.relpath(root, src)
            for name in dirs:
                arc = name if rel == "." else rel + "/" + name
                tf.addfile(info(os.path.join(root, name), arc, True))
            for name in sorted(files):
                path = os.path.join(root, name)
                arc = name if rel == "." else rel + "/" + name
                if not os.path.isfile(path):
                    raise ValueError(
                        "save_artifact: %s is neither a file nor a directory (a broken link, a socket or a pipe); "
                        "remove it from %s or save the files you mean" % (path, src)
                    )
                with open(path, "rb") as f:
                    tf.addfile(info(path, arc, False), f)


def is_directory_archive(path: str) -> bool:
    """True if the cached file is a directory saved by save_artifact."""
    try:
        with open(path, "rb") as f:
            head = f.read(2048)
    except OSError:
        return False
    # A pax global header first (type 'g'), with our keyword in its records.
    return (
        len(head) >= 1024
        and head[257:262] == b"ustar"
        and head[156:157] == b"g"
        and (" %s=1\n" % DIRECTORY_MARK).encode() in head[512:]
    )


def _tree_stamp(top: str) -> str:
    h = hashlib.sha256()
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in [""] + sorted(dirs + files):
            path = os.path.join(root, name) if name else root
            h.update(("%s\0%s\n" % (os.path.relpath(path, top), _stat_stamp(os.lstat(path)))).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def unpacked_directory(cache: str, archive: str, target: str = "") -> str:
    """The archive unpacked beside it (or at target, in cache) as a read-only tree, re-unpacked if it was touched.

    The caller holds the digest's lock (_digest_lock). A tree that no longer
    matches its stamp is not removed in place (a call may still be reading
    it): it is moved aside, the fresh one put in its place, and only then is
    the old one removed.
    """
    target = target or archive + ".d"
    if os.path.isdir(target) and _read_text(target + STAMP_SUFFIX) == _tree_stamp(target):
        return target
    tmp = tempfile.mkdtemp(dir=cache, prefix=".unpack-")
    stale = None
    try:
        _unpack(archive, tmp)
        if os.path.lexists(target):
            stale = tempfile.mkdtemp(dir=cache, prefix=".stale-")
            os.rename(target, os.path.join(stale, "d"))
        os.rename(tmp, target)
        tmp = None
        os.chmod(target, 0o555)
        _write_stamp(target, _tree_stamp(target))
    finally:
        for leftover in (tmp, stale):
            if leftover is not None:
                _discard(leftover)
    return target


def _unpack(archive: str, dest_dir: str) -> None:
    """Unpacks a directory archive into dest_dir, read-only.

    Only what pack_directory writes is taken: directories and plain regular
    files. A sparse member (whose holes would be written out densely, so a
    few KiB of archive could fill the disk every user of the machine
    shares), a link, a device or anything else is refused, and the bytes
    unpacked may not exceed the archive's own size.
    """
    import shutil
    import tarfile

    budget = os.path.getsize(archive)
    dirs = []
    with tarfile.open(archive, "r:") as tf:
        for member in tf:
            parts = member.name.split("/")
            if member.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise RuntimeError("load_artifact: the archive has the unsafe entry %r" % member.name)
            dest = os.path.join(dest_dir, *parts)
            if member.isdir():
                os.makedirs(dest, exist_ok=True)
                dirs.append(dest)
                continue
            if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.issparse():
                raise RuntimeError(
                    "load_artifact: the archive has %r, which is not a plain file or a directory "
                    "(save_artifact never writes one: the archive was not made by it)" % member.name
                )
            budget -= member.size
            if budget < 0:
                raise RuntimeError(
                    "load_artifact: the archive's files add up to more than the archive itself (at %r); "
                    "it was not made by save_artifact" % member.name
                )
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "xb") as out:
                shutil.copyfileobj(tf.extractfile(member), out, CHUNK)
            os.chmod(dest, 0o555 if member.mode & 0o111 else 0o444)
    for path in reversed(dirs):
        os.chmod(path, 0o555)


# ---------------------------------------------------------------------------
# Validation of stream values and outputs
# ---------------------------------------------------------------------------


def _type_name(value) -> str:
    return type(value).__name__


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def exact_bool(value):
    """value as a bool when it is one exactly (numpy.bool_ included), else None.

    By type, so numpy is never imported here: `arr.mean() > 0.5` gives a
    numpy.bool_ (numpy.bool from numpy 2), which is not a bool subclass.
    """
    if isinstance(value, bool):
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool"):
        return bool(value)
    return None


def check_json(value, where: str):
    """Returns value as plain JSON types, or raises TypeError/ValueError naming where."""
    if value is None or isinstance(value, str):
        return value
    flag = exact_bool(value)
    if flag is not None:
        return flag
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError("%s is %s; JSON has no NaN or infinity" % (where, number))
        return number
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError("%s has the key %s (%s); JSON object keys must be strings" % (where, _short(key), _type_name(key)))
            out[key] = check_json(item, "%s[%r]" % (where, key))
        return out
    if isinstance(value, (list, tuple)):
        return [check_json(item, "%s[%d]" % (where, i)) for i, item in enumerate(value)]
    raise TypeError("%s is a %s, which cannot travel as JSON" % (where, _type_name(value)))


def check_port_value(port: dict, value, kind=None, where=None):
    """Checks value against the port's type; returns the value to send."""
    kind = kind or port["type"]
    where = where or "port %r" % port["name"]
    label = "%s (%s)" % (where, kind)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError("%s got %s (%s); it takes a finite number" % (label, _short(value), _type_name(value)))
        number = float(value)
        if not math.isfinite(number):
            raise ValueError("%s got %s; it takes a finite number" % (label, number))
        return number
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError("%s got %s (%s); it takes an int" % (label, _short(value), _type_name(value)))
        return int(value)
    if kind == "bool":
        flag = exact_bool(value)
        if flag is None:
            raise TypeError("%s got %s (%s); it takes a bool" % (label, _short(value), _type_name(value)))
        return flag
    if kind == "str":
        if not isinstance(value, str):
            raise TypeError("%s got %s (%s); it takes a str" % (label, _short(value), _type_name(value)))
        return value
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise TypeError("%s got %s (%s); it takes a list" % (label, _short(value), _type_name(value)))
        item = port.get("item")
        if item:
            return [check_port_value(port, v, item, "%s[%d]" % (where, i)) for i, v in enumerate(value)]
        return check_json(value, where)
    if kind == "artifact":
        if not isinstance(value, dict) or not isinstance(value.get("digest"), str):
            raise TypeError("%s got %s; it takes the dict save_artifact returned" % (label, _short(value)))
        return check_json(value, where)
    return check_json(value, where)


def check_stream(fname: str, spec, values) -> dict:
    if not isinstance(values, dict):
        raise TypeError("%s yielded %s (%s); a generator node yields dicts of stream ports" % (fname, _short(values), _type_name(values)))
    if spec is None:  # not a declared node: any key, JSON values
        return {str(k): check_json(v, "stream value %r" % (k,)) for k, v in values.items()}
    streams = {p["name"]: p for p in spec.provides if p["stream"]}
    outputs = {p["name"] for p in spec.provides if not p["stream"]}
    checked = {}
    for key, value in values.items():
        if key not in streams:
            if key in outputs:
                raise ValueError("%s yielded %r, which is not a stream port; return it instead" % (fname, key))
            declared = ", ".join(streams) or "none"
            raise ValueError("%s yielded the undeclared stream port %r (declared stream ports: %s)" % (fname, key, declared))
        checked[key] = check_port_value(streams[key], value)
    return checked


def check_outputs(fname: str, spec, result) -> dict:
    if spec is None:
        if result is None:
            return {}
        if isinstance(result, dict):
            return check_json(result, "%s's outputs" % fname)
        raise TypeError("%s returned %s; a function without @node must return a dict of outputs" % (fname, _type_name(result)))
    outputs = [p for p in spec.provides if not p["stream"]]
    names = [p["name"] for p in outputs]
    if not outputs:
        if result is None or result == {}:
            return {}
        raise ValueError("%s returned %s but declares no outputs" % (fname, _short(result)))
    declared = {p["name"] for p in spec.provides}
    keyed = isinstance(result, dict) and names[0] in result and set(result) <= declared
    if len(outputs) == 1 and not keyed:
        # The bare value of a single output (a json output's dict included,
        # unless it is keyed by the node's own port names).
        result = {names[0]: result}
    if not isinstance(result, dict):
        raise TypeError("%s returned %s (%s); it provides %s, so it returns a dict" % (fname, _short(result), _type_name(result), ", ".join(names)))
    streams = {p["name"] for p in spec.provides if p["stream"]}
    for key in result:
        if key not in names:
            if key in streams:
                raise ValueError("%s returned %r, which is a stream port; yield it instead" % (fname, key))
            raise ValueError("%s returned the undeclared output %r (outputs: %s)" % (fname, key, ", ".join(names)))
    missing = [n for n in names if n not in result]
    if missing:
        raise ValueError("%s returned no value for the output %s" % (fname, ", ".join(repr(m) for m in missing)))
    return {p["name"]: check_port_value(p, result[p["name"]]) for p in outputs}


# ---------------------------------------------------------------------------
# Loading node code
# ---------------------------------------------------------------------------


class ImportFailed(Exception):
    """Wraps an exception raised while importing node code, with where it happened."""

    def __init__(self, cause: BaseException, where: str):
        super().__init__(str(cause))
        self.cause = cause
        self.where = where


def _where(exc: BaseException, filename: str = "") -> str:
    """'pipeline.py, line 4': the deepest frame of the node's file (or of any user file)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name == filename or (not filename and name != RUNTIME_FILE and not name.startswith("<frozen")):
            found = (name, tb.tb_lineno)
        tb = tb.tb_next
    return "%s, line %d" % (SHIPPED_AS.get(found[0], found[0]), found[1]) if found else ""


def module_name_for(filename: str) -> str:
    stem = os.path.splitext(os.path.basename(filename))[0]
    # Registering under the file's own name keeps pickle, dataclasses and
    # multiprocessing working; never shadow a module that is already loaded
    # (a node file called json.py must not replace json).
    if stem.isidentifier() and stem not in sys.modules and stem not in sys.builtin_module_names:
        return stem
    return "fluksio_node"


# Directories this call created for itself; those outside the worker's
# call directory (FLUKSIO_CALL_DIR, which the worker removes once the
# call's processes are gone) are removed before it answers.
CALL_DIRS = []
TEMP_DIRS = []


def ship_source(name: str, data: bytes) -> str:
    """Writes shipped source (UTF-8) where child interpreters can import it by name.

    spawn and forkserver workers import the module a pickled function
    belongs to; shipped source exists nowhere on disk, so it is written as
    <name>.py into a private directory of this call, which goes first on
    sys.path (spawn and forkserver hand that to their children) and on
    PYTHONPATH (any other Python the node starts). The directory is under
    the agent's per-call directory (FLUKSIO_CALL_DIR) when there is one,
    made before the request (prepare_code), already first on sys.path and
    PYTHONPATH, with an empty file in it that takes the source and then
    the module's name: renaming a file costs a fraction of creating one,
    which the call's path then does not pay.
    """
    path = None
    if SHIP_DIR:
        code_dir, fd = SHIP_DIR.pop()
        path = os.path.join(code_dir, name + ".py")
        del SHIP_AHEAD[:]  # the directory on the paths is this call's now
    else:
        code_dir = call_dir("fluksio-code-")
        put_code_dir_first(code_dir)
    if path is None or fd < 0:
        path = None
        fd = os.open(os.path.join(code_dir, name + ".py"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    if path is not None:
        os.rename(os.path.join(code_dir, SHIP_PLACEHOLDER), path)
    return code_dir


def put_code_dir_first(code_dir: str):
    """Puts the directory of shipped source first on sys.path and PYTHONPATH; returns PYTHONPATH before."""
    sys.path.insert(0, code_dir)
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = code_dir + (os.pathsep + inherited if inherited else "")
    return inherited


def take_back_code_dir() -> None:
    """Takes the directory prepare_code put on the paths off them: the call ships no source."""
    for code_dir, inherited in SHIP_AHEAD:
        if code_dir in sys.path:
            sys.path.remove(code_dir)
        sys.path_importer_cache.pop(code_dir, None)
        if inherited is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = inherited
    del SHIP_AHEAD[:]


# Made by prepare_code, before the request: the directory shipped source
# goes to (with the descriptor of its placeholder, or -1), and the code
# cache's directory with the bytecode's magic number. SHIP_AHEAD holds the
# directory prepare_code put first on the paths, with the PYTHONPATH before
# it, until a call ships source into it.
SHIP_DIR = []
SHIP_AHEAD = []
SHIP_PLACEHOLDER = ".fluksio-source"
CODE_CACHE = []


def prepare_code() -> None:
    """Makes ahead what loading shipped source needs, off the call's path."""
    # The code cache is the worker's (FLUKSIO_ARTIFACT_CACHE is set by it):
    # a runtime run by other means leaves no cache behind. A spare only
    # checks it here; the first call that compiles makes it (cache_code).
    # (Its imports come first: an import that listed the directory for
    # shipped source before the source is in it could keep that listing,
    # within a tick of the file system's clock. Nothing on the way to
    # ship_source, the rehearsal included, imports from a file.)
    if os.environ.get(ARTIFACT_CACHE_ENV) and not within_call_dir(artifact_cache_dir()):
        try:
            import importlib.util
            import zlib

            cache = os.path.join(artifact_cache_dir(), "code")
            there = os.path.isdir(cache)
            if there:
                private_dir(cache)
            CODE_CACHE.append((cache, importlib.util.MAGIC_NUMBER.hex(), zlib.crc32, there))
        except Exception:
            pass  # no cache: shipped source is compiled
    if os.environ.get(CALL_DIR_ENV):
        try:
            code_dir = call_dir("fluksio-code-")
        except OSError:
            code_dir = None  # the call makes one when it ships source, or says why it could not
        if code_dir is not None:
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                fd = os.open(os.path.join(code_dir, SHIP_PLACEHOLDER), flags, 0o666)
            except OSError:
                fd = -1
            SHIP_DIR.append((code_dir, fd))
            # On the paths now, as the call will have it: writing os.environ
            # costs a forked runner pages copied from its zygote.
            SHIP_AHEAD.append((code_dir, put_code_dir_first(code_dir)))


def within_call_dir(path: str) -> bool:
    """Whether path is in this call's directory: a cache there (a sandboxed call's own) ends with the call."""
    base = os.environ.get(CALL_DIR_ENV)
    return bool(base) and (path + os.sep).startswith(base.rstrip(os.sep) + os.sep)


def call_dir(prefix: str) -> str:
    """A new private directory of this call, under FLUKSIO_CALL_DIR when there is one.

    The call directory is the call's alone, so there it has a fixed name
    (prefix without its dash) when that is free; elsewhere a random one.
    """
    base = os.environ.get(CALL_DIR_ENV) or None
    path = None
    if base is not None:
        try:
            path = os.path.join(base, prefix.rstrip("-"))
            os.mkdir(path, 0o700)
        except FileExistsError:
            path = tempfile.mkdtemp(prefix=prefix, dir=base)
        except OSError:
            base = path = None  # no usable call directory: a temporary one
    if path is None:
        path = tempfile.mkdtemp(prefix=prefix)
        TEMP_DIRS.append(path)
    CALL_DIRS.append(path)
    return path


def remove_call_dirs() -> None:
    """Removes the call's directories that the worker does not remove with its call directory."""
    if not TEMP_DIRS:
        return
    import shutil

    for path in TEMP_DIRS:
        shutil.rmtree(path, ignore_errors=True)
    del TEMP_DIRS[:]


def load_node_code(spec: dict):
    """Imports the request's node code; returns its module."""
    if not isinstance(spec, dict):
        raise BadRequest("'node' must be an object with 'source' or 'module'")
    if "source" in spec:
        source = spec["source"]
        filename = spec.get("filename") or "node.py"
        if not isinstance(source, str) or not isinstance(filename, str):
            raise BadRequest("'node.source' and 'node.filename' must be strings")
        data = source.encode("utf-8", "surrogatepass")
        # The engine's file does not exist here: give tracebacks its lines
        # directly (a file of the same name in the cwd must not be shown
        # instead).
        lines = source.splitlines(True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        name = module_name_for(filename)
        shipped = None
        if not REHEARSING:
            shipped = os.path.join(ship_source(name, data), name + ".py")
            linecache.cache[shipped] = (len(source), None, lines, shipped)
            SHIPPED_AS[shipped] = filename
        module = types.ModuleType(name)
        module.__file__ = shipped or filename
        sys.modules[name] = module
        NODE_MODULES.append(module)
        try:
            code = compiled(source, data, filename)
            if shipped is not None:
                code = with_filename(code, shipped)
            exec(code, module.__dict__)
        except SyntaxError as exc:
            raise ImportFailed(exc, "") from exc
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise ImportFailed(exc, _where(exc, shipped or filename)) from exc
        return module
    if "module" in spec:
        target = spec["module"]
        if not isinstance(target, str) or not target:
            raise BadRequest("'node.module' must be a module name")
        for _, fd in SHIP_DIR:
            if fd >= 0:
                os.close(fd)  # no source to ship: the placeholder stays empty
        del SHIP_DIR[:]
        take_back_code_dir()
        try:
            module = importlib.import_module(target)
        except SyntaxError as exc:
            raise ImportFailed(exc, "") from exc
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise ImportFailed(exc, _where(exc)) from exc
        NODE_MODULES.append(module)
        return module
    raise BadRequest("'node' must have 'source' (with 'filename') or 'module'")


# The files shipped source was written to (ship_source), each with the
# file name the engine gave it: the code's own file name is the shipped
# file's, which exists (inspect, linecache and numba's cache=True look it
# up); what the engine is answered names the engine's.
SHIPPED_AS = {}


def with_filename(code, filename: str):
    """code, and every code object in it, with co_filename set to filename.

    Compiled under the engine's file name, which the code cache keys,
    and renamed here: 0.03 ms for a small node, 0.6 ms for 3,000 lines,
    where compiling costs 1.4 and 18.
    """
    consts = code.co_consts
    if any(isinstance(c, types.CodeType) for c in consts):
        consts = tuple(with_filename(c, filename) if isinstance(c, types.CodeType) else c for c in consts)
    return code.replace(co_filename=filename, co_consts=consts)


# Code compiled on this call, for the code cache: (path, what to store).
CODE_TO_CACHE = []


def compiled(source: str, data: bytes, filename: str):
    """The code of shipped source: compiled by the zygote ahead, else here (and cached after the answer).

    The cache (a directory of the artifact cache, ours and private) keeps
    each source in a file named by the bytecode's magic number, the
    optimization level, and the source's CRC-32 and length; the file holds
    the source and its file name (code_entry), never code: node code runs
    as the worker's account and can write the cache, so whatever is read
    from it is only ever a source to compile, never code to run. The
    zygote compiles the entries it finds before it forks
    (remember_cached_code, off the call's path), so a forked call whose
    source is there skips compiling (a millisecond for a small node, 18 ms
    for 3,000 lines); a cold runner compiles. Any problem with the cache
    only means compiling.
    """
    path = None
    if CODE_CACHE:
        cache, magic, crc32, there = CODE_CACHE[0]
        path = os.path.join(cache, "%s-%d-%08x-%d" % (magic, sys.flags.optimize, crc32(data), len(data)))
        # A runner forked from a zygote finds what the zygote compiled (remember_cached_code).
        memo = CODE_MEMO.get(path)
        if memo is not None and memo[0] == filename and memo[1] == source:
            if time.time() - memo[3] >= CODE_USED_EVERY_S:
                CODE_USED.append(path)
            return memo[2]
        entry = code_entry(filename, data)
        if there and read_code_entry(path, used=True) == entry:
            path = None  # cached already
    code = compile(source, filename, "exec", dont_inherit=True)
    if path is not None and not REHEARSING:
        CODE_TO_CACHE.append((path, entry))
    return code


def code_entry(filename: str, data: bytes) -> bytes:
    """A code cache entry: the length of the file name's UTF-8, a newline, the file name, then the source."""
    name = filename.encode("utf-8", "surrogatepass")
    return b"%d\n" % len(name) + name + data


def code_entry_source(entry: bytes):
    """The (file name, source) of a code cache entry; ValueError if it is not one."""
    head, _, rest = entry.partition(b"\n")
    if not head.isdigit() or int(head) > len(rest):
        raise ValueError("not a code cache entry")
    n = int(head)
    return rest[:n].decode("utf-8", "surrogatepass"), rest[n:].decode("utf-8", "surrogatepass")


# Code cache entries read on this call that were last marked used a day
# ago or more: marked again after the answer (their modification time),
# so that pruning (prune_code_cache) keeps what is used.
CODE_USED = []
CODE_USED_EVERY_S = 86400
# The code cache keeps this many entries, those used last (a few KiB each
# for a small node): a worker that runs every variant a sweep generates
# would otherwise fill its disk with them.
CODE_CACHE_KEEP = 256


def read_code_entry(path: str, used: bool = False):
    """What a code cache entry holds (bytes), or None if it cannot be read; used: mark it used if it is due."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if used and time.time() - os.fstat(fd).st_mtime >= CODE_USED_EVERY_S:
                CODE_USED.append(path)
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks)
    except OSError:
        return None  # not there yet, or unreadable: compile


# The code cache's sources a zygote compiled, by path, for the runners it
# forks: (file name, source, code, the entry's modification time).
CODE_MEMO = {}
CODE_MEMO_MAX = 64
# The code cache directory a zygote reads (None: there is none), found
# once, and its (inode, modification time) when the zygote last read it.
CODE_MEMO_DIR = []
CODE_MEMO_STAMP = []
# How long the zygote compiles cached sources before one fork: a call may
# be waiting for it (it is taken for wedged after 250 ms: zygote.go's
# callForkTimeout); what is left, the next fork goes on with. Before its
# first fork, while it starts, it takes up to CODE_MEMO_START_S.
CODE_MEMO_FORK_S = 0.02
CODE_MEMO_START_S = 1.0


def remember_cached_code(budget_s: float = CODE_MEMO_FORK_S) -> None:
    """In the zygote, before a fork: compiles the code cache's new sources, which the fork then finds in memory.

    One stat when nothing changed: what the zygote allocates between two
    forks is written to pages it shares with the runners alive, and each
    such page is copied, in the zygote, at every fork (the directory's
    path, computed each time, cost it 30 pages a fork). The directory is
    checked as the runner's own use of it is (private_dir), and entries
    of another Python (their name starts with the bytecode's magic number)
    are left. The zygote compiles each source itself: an entry is a
    source and a file name any call could have written, so the code a
    fork runs is always what its request's source compiles to. At most
    CODE_MEMO_MAX entries are kept: the zygote is replaced when it goes
    stale or old, and a runner that finds nothing here compiles.
    """
    if not CODE_MEMO_DIR:
        cached = os.environ.get(ARTIFACT_CACHE_ENV)
        CODE_MEMO_DIR.append(os.path.join(artifact_cache_dir(), "code") if cached else None)
    cache = CODE_MEMO_DIR[0]
    if cache is None:
        return
    try:
        st = os.stat(cache)
        stamp = (st.st_ino, st.st_mtime_ns)
        if CODE_MEMO_STAMP and CODE_MEMO_STAMP[0] == stamp:
            return
        import importlib.util
        import warnings

        private_dir(cache)
        prefix = "%s-%d-" % (importlib.util.MAGIC_NUMBER.hex(), sys.flags.optimize)
        until = time.monotonic() + budget_s
        compiled_one = False
        for name in sorted(os.listdir(cache)):
            path = os.path.join(cache, name)
            if len(CODE_MEMO) >= CODE_MEMO_MAX:
                break
            if compiled_one and time.monotonic() > until:
                return  # the next fork goes on from here (one entry a fork at least, however slow the machine)
            if name.startswith(prefix) and path not in CODE_MEMO:
                compiled_one = True
                try:
                    mtime = os.stat(path).st_mtime
                    filename, source = code_entry_source(read_code_entry(path) or b"")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # the call that compiles it shows them
                        code = compile(source, filename, "exec", dont_inherit=True)
                except (OSError, ValueError, SyntaxError, RecursionError, MemoryError, OverflowError):
                    CODE_MEMO[path] = None  # not an entry (or not one this Python compiles): the call compiles
                    continue
                CODE_MEMO[path] = (filename, source, code, mtime)
        CODE_MEMO_STAMP[:] = [stamp]
    except (OSError, RuntimeError):
        pass  # no cache yet, or one not to trust: the runners compile


def cache_code() -> None:
    """Writes the sources compiled on this call into the code cache (after the answer), and bounds the cache."""
    for path in CODE_USED:
        try:
            os.utime(path)
        except OSError:
            pass  # removed meanwhile: the next call that needs it compiles it
    for path, entry in CODE_TO_CACHE:
        try:
            private_dir(os.path.dirname(path))
            fd, partial = tempfile.mkstemp(prefix=".part-", dir=os.path.dirname(path))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(entry)
                os.replace(partial, path)
            except BaseException:
                _discard(partial)
                raise
        except Exception:
            pass  # the next call compiles again
    if CODE_TO_CACHE:
        prune_code_cache(os.path.dirname(CODE_TO_CACHE[0][0]))
    del CODE_TO_CACHE[:], CODE_USED[:]


def prune_code_cache(cache: str) -> None:
    """Keeps the CODE_CACHE_KEEP entries used last; removes the rest, and leftovers of writes cut short.

    Run after a call wrote an entry (the answer is out): listing the
    directory once, and only past the bound a stat of each entry.
    """
    try:
        names = os.listdir(cache)
    except OSError:
        return
    if len(names) <= CODE_CACHE_KEEP:
        return
    # A write cut short (its runner killed) left a part: an hour is more
    # than any write takes.
    stale_part = time.time() - 3600
    entries = []
    for name in names:
        path = os.path.join(cache, name)
        try:
            mtime = os.lstat(path).st_mtime
        except OSError:
            continue
        if not name.startswith(".part-"):
            entries.append((mtime, path))
        elif mtime < stale_part:
            _discard(path)
    entries.sort(reverse=True)
    for _, path in entries[CODE_CACHE_KEEP:]:
        _discard(path)


def node_digest(spec: dict, module) -> str:
    """The digest a compile answers: of the shipped source, or of the module's file."""
    if "source" in spec:
        return "sha256:" + hashlib.sha256(spec["source"].encode("utf-8", "surrogatepass")).hexdigest()
    return _module_digest(module, spec["module"])


def _module_digest(module, target: str) -> str:
    path = getattr(module, "__file__", None)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (OSError, TypeError):
        data = target.encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def node_functions(module):
    """The @node functions a module defines or imports, in definition order."""
    found = []
    for attr, value in list(vars(module).items()):
        if callable(value) and not isinstance(value, type):
            spec = spec_of(value)
            if spec is not None:
                found.append((attr, value, spec))
    return found


# ---------------------------------------------------------------------------
# The call
# ---------------------------------------------------------------------------


def do_compile(channel: Channel, request: dict) -> int:
    module = load_node_code(request.get("node"))
    digest = node_digest(request["node"], module)
    nodes = [
        {
            "name": attr,
            "requires": spec.requires,
            "provides": spec.provides,
            "timeout": spec.timeout,
            "device": spec.device,
        }
        for attr, _, spec in node_functions(module)
    ]
    return finish_then_answer(channel, {"ok": True, "nodes": nodes, "digest": digest})


def call_arguments(fn, spec, request: dict) -> dict:
    inputs = request.get("inputs") or {}
    settings = request.get("settings") or {}
    if not isinstance(inputs, dict) or not isinstance(settings, dict):
        raise BadRequest("'inputs' and 'settings' must be objects")
    both = sorted(set(inputs) & set(settings))
    if both:
        raise TypeError("%s() got multiple values for %s (in both inputs and settings)" % (fn.__name__, ", ".join(both)))
    kwargs = {}
    if spec is not None:
        for port in spec.requires:
            if port["initial"] is not None and port["name"] not in inputs:
                kwargs[port["name"]] = port["initial"]
    kwargs.update(inputs)
    kwargs.update(settings)
    return kwargs


def emit_stream(channel: Channel, values: dict) -> None:
    # Shielded as a whole: a cancel landing inside the pump's condition
    # variable or the channel's lock would leave them broken.
    with Shielded():
        flush_node_output()
        if PUMP is not None:
            PUMP.sync()
        mark_node_output()
        channel.event("stream", values=values)


def run_generator(channel: Channel, fname: str, spec, gen):
    """Drives a generator node: each yield is validated and sent at once."""
    try:
        while True:
            try:
                values = next(gen)
            except StopIteration as stop:
                return stop.value
            emit_stream(channel, check_stream(fname, spec, values))
    except BaseException as exc:
        if gen.gi_frame is None:
            raise  # the node itself failed; its generator is already done
        # A refused value, or a cancel that landed in the runtime between
        # two yields: point at the yield, and close the generator so the
        # node's finally blocks run.
        at_yield = _traceback_at(gen.gi_frame)
        try:
            gen.close()
        except BaseException:
            pass  # the first failure is the one to report
        raise exc.with_traceback(at_yield)


def run_async_generator(channel: Channel, fname: str, spec, agen):
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                values = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return None  # async generators cannot return a value
            emit_stream(channel, check_stream(fname, spec, values))
    except BaseException as exc:
        if agen.ag_frame is None:
            raise
        at_yield = _traceback_at(agen.ag_frame)
        try:
            loop.run_until_complete(agen.aclose())
        except BaseException:
            pass
        raise exc.with_traceback(at_yield)
    finally:
        loop.close()


def _traceback_at(frame):
    """A traceback of the suspended generator frame: the line of its yield."""
    if frame is None:
        return None
    return types.TracebackType(None, frame, frame.f_lasti, frame.f_lineno)


def do_run(channel: Channel, request: dict) -> int:
    module = load_node_code(request.get("node"))
    return finish_then_answer(channel, call_node(channel, module, request))


def node_code_name(module) -> str:
    """The node code as its author knows it: the engine's filename (not the
    call's copy of it, deep in the state directory), or the module's name."""
    shipped = getattr(module, "__file__", None)
    return SHIPPED_AS.get(shipped) or shipped or module.__name__


def defined_functions(module) -> str:
    """What a misspelt function name could have meant: the public functions
    the node code defines itself (not those it imports), in its order."""
    names = [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and callable(value)
        and not isinstance(value, type)
        and getattr(value, "__module__", None) == module.__name__
    ]
    return "it defines " + ", ".join(names) if names else "it defines no functions"


def call_node(channel: Channel, module, request: dict) -> dict:
    """Calls the request's function of the loaded node module; returns the answer's fields."""
    fname = request.get("function")
    if not isinstance(fname, str) or not fname:
        raise BadRequest("'function' must name a function in the node code")
    fn = getattr(module, fname, None)
    if fn is None or not callable(fn):
        raise AttributeError("%s has no function %r (%s)" % (node_code_name(module), fname, defined_functions(module)))
    spec = spec_of(fn)
    kwargs = call_arguments(fn, spec, request)
    ArtifactCall.active = True
    try:
        result = fn(**kwargs)
        if isinstance(result, types.GeneratorType):
            result = run_generator(channel, fname, spec, result)
        elif isinstance(result, types.AsyncGeneratorType):
            result = run_async_generator(channel, fname, spec, result)
        elif isinstance(result, types.CoroutineType):
            import asyncio

            result = asyncio.run(result)
    finally:
        ArtifactCall.active = False
    return {"ok": True, "outputs": check_outputs(fname, spec, result)}


# Set up in main(): the pump whose events must all go out before the answer.
PUMP = None


# A call rehearsed on a node of the runtime's own, by rehearse_call: its
# outputs are of each common type, whose checks and encoding a call runs.
REHEARSAL = json.dumps(
    {
        "op": "run",
        "call_id": "fluksio-rehearsal",
        "node": {
            "source": "from fluksio import Port, node\n\n"
            "@node(requires=[Port('x', 'int', 1)], provides=[Port('y', 'int'), Port('f', 'float'), Port('b', 'bool'),"
            " Port('s', 'str'), Port('j', 'json')])\n"
            "def rehearsal(x):\n"
            "    return {'y': x + 1, 'f': x / 2, 'b': x > 0, 's': str(x), 'j': {'l': [x, 0.5, 'a', False, None]}}\n",
            "filename": "fluksio_rehearsal.py",
        },
        "function": "rehearsal",
        "inputs": {},
        "settings": {},
    }
).encode("ascii")


# A forked spare rehearses its call (rehearse_call) once it has waited this
# long for it: a spare is forked as the call before it starts, and its
# rehearsal must not take the CPU that call answers with; a call that
# arrives sooner pays the pages it writes itself, as without a rehearsal.
REHEARSE_AFTER_S = 0.05


def request_waiting(timeout: float) -> bool:
    """Whether the request (or the end of stdin) arrives within timeout seconds."""
    try:
        return bool(select.select([0], [], [], timeout)[0])
    except (OSError, ValueError):
        return True  # read_request says what is wrong with stdin


def rehearse_call() -> None:
    """Goes through a call's path on a node of its own, and leaves nothing of it behind.

    What a call does first in a process costs more than doing it again:
    caches filled on first use (the checks of isinstance against
    numbers.Integral, the json encoder's), and, in a runner forked from a
    zygote, every page the path writes to, which the kernel copies then
    (copy-on-write, a few microseconds a page, a hundred pages). The
    zygote rehearses once, so its forks start with the caches filled; a
    forked spare rehearses while it waits, so the copies are made before
    its request, not while the engine waits for the answer. It runs the
    call's own functions (do_run and what it calls: a function first run
    in a fork writes to its code object's page, and to the pages of the
    frames it pushes), but nothing is written to disk, nothing is left
    registered (sys.modules, linecache, the code cache), nothing is
    printed, and the answer is encoded, not written.
    """
    request = json.loads(REHEARSAL.decode("utf-8"))
    spec = request["node"]
    source, filename = spec["source"], spec["filename"]
    try:
        # A code cache hit in a spare started cold loads the code with marshal.
        import marshal

        marshal.loads(marshal.dumps((filename, source, compile(source, filename, "exec", dont_inherit=True))))
    except Exception:
        pass
    name = module_name_for(filename)
    REHEARSING.append(True)
    try:
        do_run(Channel(-1, request["call_id"]), request)
    except Exception:
        pass  # a rehearsal only saves time; the call itself says what fails
    finally:
        del REHEARSING[:]
        module = sys.modules.pop(name, None)
        if module is not None:
            SPECS.pop(id(module.__dict__.get(request["function"])), None)
            NODE_MODULES.remove(module)
            module.__dict__.clear()
        linecache.cache.pop(filename, None)


# Set while rehearse_call goes through a call: nothing is written to disk,
# the answer is only encoded, and SIGTERM's handler stays.
REHEARSING = []


def finish_then_answer(channel: Channel, answer: dict) -> int:
    """Sends what the node logged, then the answer; returns the exit status.

    A cancel is answered NodeCancelled whatever ended the node's code: its
    own SIGTERM handler may have swallowed the signal or raised something
    else (a handler that prints can fail inside print's own write).
    """
    # From here on a late SIGTERM must not interrupt the answer. (signal's
    # own signal() would make an enum of the handler it replaces: a
    # ValueError raised and caught for a Python handler.)
    _signal.signal(_SIGTERM, _signal.getsignal(_SIGTERM) if REHEARSING else _SIG_IGN)
    flush_logging()
    flush_node_output()
    status = 0 if answer.get("ok") else 1
    if channel.pid != os.getpid():
        _EXIT(status)  # a forked child that returned here: only the runner answers
    if CANCEL.cancelled() and answer.get("error", {}).get("type") != NodeCancelled.__name__:
        answer, status = error_answer_fields(NodeCancelled("the call was cancelled"), channel.call_id), 1
    if not REHEARSING:
        remove_call_dirs()
        if PUMP is not None:
            PUMP.finish()
    try:
        channel.answer(answer)
    except OSError:
        pass  # the agent is gone; there is nobody left to answer
    return status


def fail(channel: Channel, exc: BaseException) -> int:
    where = ""
    if isinstance(exc, ImportFailed):
        exc, where = exc.cause, exc.where
    return finish_then_answer(channel, error_answer_fields(exc, channel.call_id, where))


def exit_after_output(status):
    """os._exit as node code sees it in the runner: what it wrote goes out first.

    Python's buffers and C stdio's are flushed into the node's pipes, and
    without the worker the log pump (a thread of this process, which the
    exit would end) sends what it had not yet. Forked children (a fork
    pool's workers end this way) and the runtime itself exit at once.
    """
    if os.getpid() == RUNNER_PID[0]:
        try:
            flush_node_output()
            if PUMP is not None:
                PUMP.finish()
        except BaseException:
            pass
    _EXIT(status)


def exit_like_a_script(status: int, echo_fd: int) -> None:
    """Ends the runner after its answer as `python train.py` ends, within the cancel grace.

    What interpreter shutdown does that node code can notice is done here
    (see shut_down_as_python_does), and then the process ends with
    os._exit: tearing down every module, as a full shutdown does, costs
    milliseconds of CPU (tens with numpy, in a runner forked from a zygote,
    which copies every page it touches), and the call's slot waits for it.
    What exit handlers print goes to the runner's stderr, the worker's log:
    the engine has its answer. A watchdog ends the process with os._exit
    once the cancel grace is over, so neither a handler nor a thread that
    never ends holds the call; after it, SIGTERM ends the process at once.
    """
    for fd in (1, 2):
        os.dup2(echo_fd, fd)
    CANCEL.on_timeout = None
    _signal.signal(_SIGTERM, _signal.SIG_DFL)
    grace = cancel_grace()

    def watchdog():
        time.sleep(grace)
        try:
            _WRITE(echo_fd, b"fluksio runtime: exit handlers and threads did not finish within %.1fs; exiting now\n" % grace)
        finally:
            _EXIT(status)

    if not CANCEL.watch_exit(watchdog):
        # A bare thread: threading's would make this one wait until it
        # runs, and threading does not join it.
        _thread.start_new_thread(watchdog, ())
    try:
        shut_down_as_python_does()
        cache_code()
    finally:
        remove_call_dirs()
        _EXIT(status)


# The modules of the call's node code (torn down at exit, as a script's
# __main__ is).
NODE_MODULES = []


def shut_down_as_python_does() -> None:
    """Does, in Python's order, what its shutdown does that node code can notice.

    Non-daemon threads are joined and threading's exit callbacks run
    (concurrent.futures' pools); atexit handlers run, logging.shutdown
    among them; sys.stdout and sys.stderr are flushed. Then the node's
    module is cleared as a script's __main__ is, so the objects only it
    held are freed (their __del__ runs: a ZipFile writes its directory, a
    NamedTemporaryFile is removed, a file is flushed and closed); the files
    still open are flushed and closed, each before the file it wraps (a
    gzip stream's trailer is written), which Python's own shutdown does not
    promise for files in reference cycles; then C stdio's buffers are
    flushed. What is not done: other modules are not torn down and
    reference cycles are not collected, so __del__ of objects they still
    hold does not run (Python does not promise it either), and a collection
    over what a node imported (tens of milliseconds for numpy's objects in
    a runner that imported it itself) is not paid.
    """
    try:
        threading._shutdown()
    except BaseException as exc:  # Python reports these as unraisable, and goes on
        _report_ignored(exc, threading)
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass  # atexit printed each handler's error itself
    flush_node_output()
    quiet_daemon_threads()
    SPECS.clear()  # the runtime's own references to node code
    for module in NODE_MODULES:
        _clear_module(module)
    del NODE_MODULES[:]
    close_open_files(gc.get_objects())
    flush_node_output()


def quiet_daemon_threads() -> None:
    """From here on, an exception ends a daemon thread without a word, as at an interpreter's shutdown.

    Python's own shutdown stops daemon threads before it clears modules.
    The fast exit clears the node's module while they still run, and one
    that then reads a cleared global (None now) would print a NameError or
    AttributeError traceback into the worker's log. Non-daemon threads were
    joined before this, so what they raised was printed as usual; so is
    what a finalizer raises (an `Exception ignored in` line).
    """
    thread_hook = threading.excepthook
    unraisable_hook = sys.unraisablehook

    def excepthook(args):
        if args.thread is None or not args.thread.daemon:
            thread_hook(args)

    def unraisablehook(unraisable):
        # What a bare thread (_thread.start_new_thread) raises: it is a
        # daemon thread, never joined.
        if not (unraisable.err_msg or "").startswith("Exception ignored in thread started by"):
            unraisable_hook(unraisable)

    threading.excepthook = excepthook
    sys.unraisablehook = unraisablehook


def _report_ignored(exc: BaseException, where) -> None:
    try:
        print("Exception ignored in: %r" % (where,), file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    except BaseException:
        pass


def _clear_module(module) -> None:
    """Empties a module's namespace as Python's shutdown does: names with an underscore first."""
    namespace = vars(module)
    for private in (True, False):
        for name in list(namespace):
            if name != "__builtins__" and name.startswith("_") == private:
                namespace[name] = None


def close_open_files(objects) -> None:
    """Closes the open file objects among objects, each before any file it wraps.

    A TextIOWrapper is closed before its buffer, a GzipFile before the file
    under it: closing writes what the outer one holds into the inner one.
    The standard streams and the runtime's own stay open (Python's exit
    flushes the standard streams, and so does the caller).
    """
    kept = {id(f) for f in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)}
    kept.update(id(f) for f in KEPT_STREAMS + STD_STREAMS)
    # The files Python closes when they are freed: those of io's own base
    # class (not the ABC, which other classes may register with).
    # Iterated in C: a call that imported numpy itself has 100,000 objects.
    import _io
    import itertools

    kinds = {kind for kind in set(map(type, objects)) if issubclass(kind, _io._IOBase)}
    found = itertools.compress(objects, map(kinds.__contains__, map(type, objects)))
    files = {id(f): f for f in found if id(f) not in kept}
    del objects, found
    # What each file wraps: what it refers to, or its attributes do.
    inner = {}
    wrappers = dict.fromkeys(files, 0)
    for key, f in files.items():
        wrapped = set()
        for ref in gc.get_referents(f):
            for obj in gc.get_referents(ref) if isinstance(ref, dict) else (ref,):
                if id(obj) in files and id(obj) != key:
                    wrapped.add(id(obj))
        inner[key] = wrapped
        for other in wrapped:
            wrappers[other] += 1
    ready = [key for key, count in wrappers.items() if count == 0]
    order = []
    while ready:
        key = ready.pop()
        order.append(key)
        for other in inner[key]:
            wrappers[other] -= 1
            if wrappers[other] == 0:
                ready.append(other)
    done = set(order)
    order.extend(key for key in files if key not in done)  # files wrapping each other: any order
    for key in order:
        try:
            files[key].close()
        except BaseException:
            pass  # as a file's finalizer does: a file that cannot close stays as it is


def read_request(channel: Channel) -> dict:
    # The agent writes exactly one line and nothing after it (stdin then
    # only stays open), so reading past the newline loses nothing.
    chunks = []
    while True:
        chunk = os.read(0, 65536)  # what a pipe holds: a bigger buffer is allocated for nothing
        if not chunk:
            break
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            break
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise BadRequest("no request line on stdin")
    try:
        request = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise BadRequest("the request line is not JSON: %s" % exc) from None
    except RecursionError:
        raise BadRequest("the request line is nested deeper than Python's json reads") from None
    if not isinstance(request, dict):
        raise BadRequest("the request line must be a JSON object")
    call_id = request.get("call_id")
    channel.call_id = call_id if isinstance(call_id, str) else ("" if call_id is None else str(call_id))
    return request


# The stdout and stderr objects main() set up, so a forked child can tell
# them from streams node code put in their place.
STD_STREAMS = []
# Stream objects replaced by new ones, kept referenced: freeing one would
# close the file under its replacement, or, in a forked child, try to flush
# through a lock that a thread lost in the fork holds.
KEPT_STREAMS = []


def line_buffered_std_streams() -> None:
    """Makes sys.stdout and sys.stderr (and sys.__stdout__, sys.__stderr__) line_buffered.

    A zygote does it once before it forks: the streams' descriptors are
    numbers (1 and 2), which each fork then points at its call's pipes,
    and a fork that finds them done writes nothing to the objects it
    shares with the zygote.
    """
    for name in ("stdout", "stderr"):
        stream = line_buffered(getattr(sys, name))
        if getattr(sys, name) is not stream or getattr(sys, "__%s__" % name) is not stream:
            setattr(sys, name, stream)
            setattr(sys, "__%s__" % name, stream)


def line_buffered(stream):
    """stream, or a replacement for it, that writes each whole line in one write.

    Line buffering with the text layer's own buffer keeps a line together
    until its newline, so threads printing at once never interleave inside
    a line. PYTHONUNBUFFERED=1 (or -u) gives a stream that writes every
    piece through at once (print's text and its newline are two writes):
    that one is rebuilt over a buffered writer.
    """
    try:
        if not isinstance(stream.buffer, io.BufferedIOBase):
            stream.flush()
            stream = reopened(stream)
        if not stream.line_buffering or stream.write_through:
            stream.reconfigure(line_buffering=True, write_through=False)
    except (AttributeError, ValueError, OSError):
        pass  # not a standard stream: leave it as node code's environment made it
    return stream


def reopened(stream):
    """A new line-buffered text stream on stream's descriptor; stream is kept, unused."""
    raw = io.FileIO(stream.fileno(), "w", closefd=False)
    raw.name = stream.name  # '<stdout>', as node code may expect
    fresh = io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors, line_buffering=True)
    KEPT_STREAMS.append(stream)
    return fresh


# The signal mask the forking thread had before block_sigterm_for_fork.
FORK_MASK = threading.local()


def block_sigterm_for_fork() -> None:
    """Holds SIGTERM back across a fork, in the forking thread.

    A pool's terminate() can signal a worker it has only just forked. Until
    after_fork_in_child has run, that child still has the runner's handler
    and wakeup pipe: the signal would be written to the pipe the runner
    watches (a cancel nobody sent) and turned into an exception in the
    child. Blocked, it stays pending until the child is ready for it.
    """
    try:
        FORK_MASK.old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    except (AttributeError, OSError, ValueError):
        FORK_MASK.old = None


def restore_sigmask_after_fork() -> None:
    old = getattr(FORK_MASK, "old", None)
    FORK_MASK.old = None
    if old is not None:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        except (OSError, ValueError):
            pass


def after_fork_in_child(channel: Channel) -> None:
    """Runs in every child forked from the runner (a fork pool's workers).

    Only the runner answers and sends events, and SIGTERM to a child is
    the child's business. The child also gets fresh stdout and stderr
    objects: one of the runner's threads may have held the old ones' lock
    at the moment of the fork, and that lock would never be released here
    (the fork-with-threads hazard), so a child printing would hang.
    """
    global PUMP
    CANCEL.forget_in_child()
    channel.close_in_child()
    PUMP = None
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        if old not in STD_STREAMS:
            continue  # node code replaced it; it knows what it holds
        try:
            fresh = reopened(old)
        except (OSError, ValueError, AttributeError):
            continue
        setattr(sys, name, fresh)
        setattr(sys, "__%s__" % name, fresh)
    STD_STREAMS[:] = [sys.stdout, sys.stderr]
    restore_sigmask_after_fork()  # a SIGTERM held back now ends the child


# ---------------------------------------------------------------------------
# Spare mode: started ahead of its call
# ---------------------------------------------------------------------------

# `worker_main.py --fluksio-spare FD [MOD,MOD]` is a spare runner: the worker
# starts it before its call exists, with the exact environment the call will
# get. It imports the preloads, tells the worker on FD what it loaded, then
# waits for its one request like any runner.


# Process titles: what a runner is now, in its comm (/proc/PID/comm, which
# ps -e, top and pstree show), so that an operator tells a zygote, a spare
# waiting for its call and a call's runner apart at a glance. Their command
# lines do not: a spare keeps its command line when it serves its call, and
# a runner forked from a zygote has the zygote's. The comm is at most 15
# bytes; writing it is one system call and imports nothing.
TITLE_ZYGOTE = "fluksio-zygote"
TITLE_SPARE = "fluksio-spare"
TITLE_CALL = "fluksio-call"


def set_title(title: str) -> None:
    """Sets this process's comm to title (Linux only: elsewhere it does nothing)."""
    try:
        fd = os.open("/proc/self/comm", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, title.encode("ascii"))
    except OSError:
        pass
    finally:
        os.close(fd)


def spare_prepare() -> None:
    """In spare mode, preloads and reports; otherwise does nothing.

    The report is one JSON object on the worker's descriptor, then it is
    closed: {SPARE_WATCH: [[path, existed], ...], SPARE_FAILED: {module: reason}}.
    watch is every file and directory the code this process holds came
    from or would import from: the interpreter, each sys.path entry, the
    user site directory, and each loaded module's file and directory. The
    worker does not hand this spare a call once any of them changed (a
    package installed or upgraded, the runtime replaced): it would run
    older code than a fresh interpreter. Preloads never touch CUDA: only
    their import runs, and importing numpy or torch does not initialize it.
    """
    if len(sys.argv) < 3 or sys.argv[1] != SPARE_FLAG:
        return
    fd = int(sys.argv[2])
    preloads = [m for m in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if m]
    del sys.argv[1:]  # node code sees the argv of a runner started cold
    set_title(TITLE_SPARE)
    preload_and_report(fd, preloads)


def preload_and_report(fd: int, preloads: list, forks: bool = False, no_forks: str = "") -> bool:
    """Imports the SDK and the preloads, and reports as spare_prepare says; True if this process has threads a fork cannot keep.

    A process that forks (a zygote) also says in the report, under
    SPARE_THREADS, how many threads it has once the preloads are imported and
    a fork's prepare handlers ran (threads_past_a_fork), and which preload
    started the first of them, when it has more than one.
    """
    # What every call needs (ctypes, for C stdio; the code cache's modules;
    # faulthandler; atexit, for the exit; for a zygote's forks, fcntl) is
    # loaded now, not while the engine waits for the answer or in each
    # fork (an import a fork makes costs it 0.2 ms or more and dozens of
    # pages copied, even of a module built into the interpreter).
    flush_node_output()
    import atexit  # noqa: F401
    import faulthandler  # noqa: F401
    import fcntl  # noqa: F401
    import importlib.util
    import marshal
    import zlib
    failed = {}
    # What a preload prints at import goes to the log, never to the
    # protocol channel (fd 1).
    saved = os.dup(1)
    os.dup2(2, 1)
    started_by = ""  # the preload that started the first thread
    try:
        # Node modules start with `from fluksio import ...`: preloading the
        # user's own package needs the SDK in place.
        try:
            install_sdk()
        except BaseException as exc:  # the call will try again, and answer why
            failed["fluksio"] = "%s: %s" % (type(exc).__name__, exc)
        for name in preloads:
            try:
                importlib.import_module(name)
            except BaseException as exc:  # a failed preload is reported, the spare goes on
                failed[name] = "%s: %s" % (type(exc).__name__, exc)
            if not started_by and forks and threads_past_a_fork() > 1:
                started_by = name
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        os.dup2(saved, 1)
        os.close(saved)
    # The call's own directories (the SDK module for child interpreters)
    # are this spare's, made just now: not code that can go stale.
    paths = [sys.executable] + [p or os.getcwd() for p in sys.path if p not in CALL_DIRS]
    try:
        import site

        if site.ENABLE_USER_SITE:
            paths.append(site.getusersitepackages())
    except Exception:
        pass
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path:
            paths.append(os.path.abspath(path))
            paths.append(os.path.dirname(os.path.abspath(path)))
    seen = set()
    watch = []
    for path in paths:
        if path not in seen:
            seen.add(path)
            watch.append([path, os.path.exists(path)])
    report = {SPARE_WATCH: watch, SPARE_FAILED: failed}
    threads = threads_past_a_fork() if forks else 1
    if threads > 1:
        # A fork keeps only the thread that forks: a zygote that forks now
        # gives each call a library whose threads are gone (its next
        # parallel op hangs, or aborts). The worker starts spares cold.
        report[SPARE_THREADS] = {SPARE_THREADS_COUNT: threads, SPARE_THREADS_MODULE: started_by}
    if no_forks:
        report[SPARE_NO_FORKS] = no_forks
    with os.fdopen(fd, "w") as out:
        json.dump(report, out)
    return threads > 1


def threads_past_a_fork() -> int:
    """The threads of this process once a fork's prepare handlers ran: those no fork can keep.

    A library that knows forks shuts its threads down before one
    (OpenBLAS, numpy's, does, and starts them again on first use): one
    fork of a child that exits at once tells such threads from those of
    a library that does not (libgomp's, torch's and numba's OpenMP).
    """
    if thread_count() <= 1:
        return 1
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forking with threads
            pid = os.fork()
    except OSError:
        return thread_count()
    if pid == 0:
        os._exit(0)
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass
    return thread_count()


def thread_count() -> int:
    """The threads of this process, those a library started in C included (threading sees only its own)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# ---------------------------------------------------------------------------
# Zygote mode: a warm interpreter that forks each call's runner
# ---------------------------------------------------------------------------

# `worker_main.py --fluksio-zygote REPORT CONTROL EXITS [MOD,MOD]` is a warm
# interpreter that forks each call's runner (agent/runner/zygote.go). It
# preloads and reports on REPORT as a spare does, then serves requests on
# CONTROL, a unix socket: one JSON message {FORK_ENV: [...], FORK_CWD: DIR or
# "", FORK_TOKEN: TOKEN} with five descriptors (the call's stdin, stdout, stderr and
# the node's two output pipes). For each it forks once: the runner is its
# child, in a process group of its own, and the zygote answers with the
# runner's pid. The zygote reaps its runners and reports each one's exit to
# the worker on EXITS, a pipe (ExitReports); should the zygote die first,
# its runners are re-parented to the worker (a child subreaper), which
# then waits for them itself. The runner continues in main() as a runner
# started cold with that environment would: the worker moves it into its
# call's cgroup before it writes the request, so no node code runs outside
# it. The zygote runs no thread and no node code.

# Set in a runner forked from the zygote (zygote_child).
FORKED = []


class ExitReports:
    """Reaps the zygote's runners and reports each exit to the worker.

    A report is 16 bytes in one write (atomic on a pipe, being under
    PIPE_BUF), in native byte order: the runner's pid and its raw wait
    status (32-bit integers), and its peak resident memory in KiB (64 bits,
    from wait4: where the call's cgroup has no memory controller, this is
    all the worker learns of it). The worker always reads the pipe, so a
    write does not block for long; one that fails (the worker is gone) is
    given up.

    SIGCHLD only wakes the zygote's loop: its handler does nothing, and
    Python writes a byte for it to a pipe (signal.set_wakeup_fd), which the
    loop polls with the control socket. A handler that reaped would miss a
    signal that came just before the loop blocked in recvmsg (no EINTR
    then), and the exit would wait for the next fork. Reaping only in the
    loop, a runner is always recorded (forked) before it can be reaped; a
    child that is no runner (one a preload started) is reaped, not
    reported.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self.runners = set()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self.poller = select.poll()
        self.poller.register(self.wake_r, select.POLLIN)
        self.watched = set()

    def wait_for(self, fd: int) -> None:
        """Returns once fd is readable; reaps and reports exits meanwhile.

        Between two forks the zygote writes to as few of its pages as it
        can (each is copied in it at the next fork): it reaps only once
        SIGCHLD came, and reads the pipe only when it holds something.
        """
        if fd not in self.watched:
            self.poller.register(fd, select.POLLIN)
            self.watched.add(fd)
        while True:
            readable = False
            for ready, _ in self.poller.poll():
                if ready == self.wake_r:
                    try:
                        while len(os.read(self.wake_r, 512)) == 512:
                            pass  # a shorter read emptied it
                    except BlockingIOError:
                        pass  # emptied by a read of 512
                    self.reap()  # after the pipe is emptied: a later exit wakes the poll
                elif ready == fd:
                    readable = True
            if readable:
                return

    def reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.runners:
                self.runners.discard(pid)
                self.report(pid, status, usage.ru_maxrss)

    def report(self, pid: int, status: int, maxrss: int) -> None:
        import struct  # loaded with the preloads, before any fork (a builtin)

        record = struct.pack(EXIT_RECORD_FORMAT, pid, status, max(maxrss, 0))
        try:
            os.write(self.fd, record)
        except OSError:
            pass  # the worker is gone: nobody is left to tell

    def in_child(self) -> None:
        """In a forked runner: SIGCHLD's default, as a cold start has it, and none of this."""
        _signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
        for fd in (self.fd, self.wake_r, self.wake_w):
            os.close(fd)


# ---------------------------------------------------------------------------
# A forked runner's sandbox. A zygote in a sandbox (platform/sandbox.go:
# the file system read-only, the worker's state hidden but for the call
# directories, no capability) forks runners that must be kept from each
# other and from it as runners started cold are by namespaces of their
# own. Each makes, off its call's path (forks wait for their request): a
# mount namespace of its own, with a private /tmp, /var/tmp and
# /dev/shm, and the call directories hidden but for its own; then it drops
# the capability to mount, the zygote's last, and Landlock's scopes (Linux 6.12) keep it from
# signalling, tracing or connecting to what is outside it (the zygote, the
# worker, the other calls), which a PID namespace does for a cold runner:
# a fork keeps the worker's PID namespace, whose pids the worker watches.
# ---------------------------------------------------------------------------

SANDBOX_CALLS = []  # the call directories' directory, in a zygote that sandboxes its forks
SANDBOX_EXIT_SETUP = 125  # as the worker's helper: nothing of the call ran

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC = 32, 4096, 16384
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
# System call numbers the C library has no wrapper for everywhere.
_SYSCALLS = {"x86_64": {"capset": 126}, "aarch64": {"capset": 91}}
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_RESTRICT_SELF = 444, 446
_LANDLOCK_SCOPES = 1 | 2  # abstract unix sockets, signals


_LIBC = []  # what sandbox_fork calls, made once in the zygote (_libc)


def _libc():
    """The C functions and types sandbox_fork uses, made once in the zygote.

    Made here, not in each fork: a ctypes function's first look-up and an
    array type are objects the fork would make anew, writing to pages it
    shares with the zygote, each of which is then copied.
    """
    if _LIBC:
        return _LIBC[0]
    import ctypes
    import platform as _platform

    libc = ctypes.CDLL(None, use_errno=True)
    numbers = _SYSCALLS.get(_platform.machine())
    if numbers is None:
        raise OSError("no system call numbers known for %s" % _platform.machine())

    def check(ret, what):
        if ret < 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))
        return ret

    mount = libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    c = types.SimpleNamespace(
        ctypes=ctypes,
        unshare=libc.unshare,
        mount=mount,
        prctl=prctl,
        syscall=syscall,
        check=check,
        capset=ctypes.c_long(numbers["capset"]),
        cap_header=ctypes.c_uint32 * 2,  # struct __user_cap_header_struct
        cap_data=ctypes.c_uint32 * 6,  # three struct __user_cap_data_struct
        ruleset_attr=ctypes.c_uint64 * 3,  # struct landlock_ruleset_attr
    )
    _LIBC.append(c)
    return c


def sandbox_fork(shown: list, call_dir) -> None:
    """Puts this forked runner in a sandbox of its own (the section's comment); raises if it cannot.

    shown: the call directories' directory, then the owner's paths.
    """
    c = _libc()
    ctypes, check = c.ctypes, c.check
    calls_dir = shown[0]
    # The zygote's user namespace, in which it kept the capability to
    # mount for this (platform/sandbox_linux.go's zygoteCaps).
    check(c.unshare(_CLONE_NEWNS), "unshare")
    # Opened in the new namespace, before anything hides them: a bind's
    # source must be a mount of the namespace it is made in.
    kept = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in ([call_dir] if call_dir else []) + shown[1:] if os.path.exists(p)]

    def mnt(source, target, fstype, flags, data=None):
        enc = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
        check(c.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount %s" % target)

    # The private temporary directories first: a state directory under
    # /tmp is gone with them, and the call's directory is bound in anew.
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            mnt("tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    hide = os.path.isdir(calls_dir)
    if hide:
        mnt("tmpfs", calls_dir, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=0755,size=64k")
    for path, fd in kept:
        if path == call_dir or not os.path.exists(path):
            if os.path.isdir("/proc/self/fd/%d" % fd):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
            mnt("/proc/self/fd/%d" % fd, path, None, _MS_BIND | _MS_REC)
        os.close(fd)
    if hide:
        mnt(None, calls_dir, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    # No capability left, none to gain back: the mounts stay as they are.
    prctl = c.prctl
    check(prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    cap = 0
    while prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    header = c.cap_header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    check(c.syscall(c.capset, header, c.cap_data()), "capset")
    check(prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # struct landlock_ruleset_attr: handled_access_fs, handled_access_net, scoped.
    attr = c.ruleset_attr(0, 0, _LANDLOCK_SCOPES)
    ruleset = check(c.syscall(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), attr, ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0)), "landlock")
    try:
        check(c.syscall(ctypes.c_long(_SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)), "landlock")
    finally:
        os.close(ruleset)


def sandbox_fork_tried() -> str:
    """In a zygote, at its start: a fork that sandboxes itself and exits; why forks cannot be sandboxed, or ""."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            sandbox_fork(SANDBOX_CALLS, None)
            os._exit(0)
        except BaseException as exc:
            try:
                os.write(w, ("%s: %s" % (type(exc).__name__, exc)).encode()[:1000])
            finally:
                os._exit(1)
    os.close(w)
    why = b""
    while True:
        chunk = os.read(r, 1024)
        if not chunk:
            break
        why += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status == 0:
        return ""
    return why.decode("utf-8", "replace") or "the trial fork ended with status %d" % status


# ---------------------------------------------------------------------------
# Pages a fork copies at once. A runner forked from a zygote writes to some
# 700 pages it shares with it (reference counts in shared objects, the
# allocator's pools, the interpreter's own data), and the kernel copies
# each at its first write: a fault, a copy, and a flush of the page's old
# mapping from the TLB. On a virtual machine that is some 30 us a page, most
# of what a call costs back to back. Where the parent holds a page pinned
# (as a device's DMA buffer is held), the kernel copies it at the fork
# instead, in one pass and without a fault. So a zygote learns from its
# first runner which pages its forks write: that runner, once ready for its
# call and before any node code runs, lists the pages it holds alone
# (/proc/self/pagemap), and the zygote pins those of them that are its own
# with io_uring's registered buffers, on a ring that is never enabled (it
# can run nothing) and that no runner keeps. Every later fork starts with
# its own copy of them, and the zygote no longer copies them either when it
# writes there itself. Where io_uring, the memory-lock limit or the call
# limits do not allow it, forks copy pages on write, as before.
# ---------------------------------------------------------------------------

# The zygote's descriptors no runner keeps: the ring holding the pinned
# pages, and the pipe the learning runner writes to (read end).
PIN_FDS = []
# In the runner the zygote learns from: its end of that pipe.
LEARN_FD = [-1]
# What became of the pinning: None while the zygote learns, "" once its
# pages are pinned, else why they are not (for a debugger: nothing reports
# it yet).
PINNED_FOR_FORKS = [None]
# At most this many pages are pinned (16 MiB of 4 KiB pages): what a runner
# writes of its zygote's is a few MiB; the memory-lock limit is often 8 MiB
# in all.
PIN_MAX_PAGES = 4096
# A mapping this large is not read for pages to pin (a reserve, not a heap).
PIN_MAPPING_MAX_PAGES = 1 << 16
_PM_PRESENT, _PM_FILE_OR_SHARED, _PM_EXCLUSIVE = 1 << 63, 1 << 61, 1 << 56
_SYS_IO_URING_SETUP, _SYS_IO_URING_REGISTER = 425, 427  # the same on every architecture
_IORING_SETUP_R_DISABLED = 1 << 6
_IORING_REGISTER_BUFFERS = 0


def page_shift() -> int:
    """log2 of the system's page size (4 KiB on most machines, 16 or 64 KiB on some arm64 ones)."""
    return os.sysconf("SC_PAGE_SIZE").bit_length() - 1


def private_pages(mask: int, want: int) -> list:
    """Page numbers of this process's private writable memory whose pagemap entry e has e & mask == want."""
    import array

    shift = page_shift()
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    pages = []
    try:
        for line in maps:
            fields = line.split()
            if fields[1][1] != "w" or fields[1][3] != "p" or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) >> shift for x in fields[0].split("-"))
            if end - start > PIN_MAPPING_MAX_PAGES:
                continue
            entries = array.array("Q", os.pread(fd, (end - start) * 8, start * 8))
            pages.extend(start + i for i, e in enumerate(entries) if e & mask == want)
    finally:
        os.close(fd)
    return pages


def list_copied_pages() -> None:
    """In the runner its zygote learns from: writes the pages it copied (those it holds alone) to the zygote, once."""
    fd, LEARN_FD[0] = LEARN_FD[0], -1
    try:
        import array

        pages = private_pages(_PM_PRESENT | _PM_EXCLUSIVE | _PM_FILE_OR_SHARED, _PM_PRESENT | _PM_EXCLUSIVE)
        data = array.array("Q", pages[: 2 * PIN_MAX_PAGES]).tobytes()
        os.set_blocking(fd, False)  # a full pipe loses the list, never the call
        while data:
            data = data[os.write(fd, data) :]
    except Exception:
        pass  # the zygote pins nothing: forks copy on write
    finally:
        os.close(fd)


def pin_for_forks(pages) -> None:
    """Pins those of pages that are this process's own anonymous pages, so that each fork copies them at once; raises OSError if it cannot."""
    wanted = sorted(set(private_pages(_PM_PRESENT | _PM_FILE_OR_SHARED, _PM_PRESENT)).intersection(pages))[:PIN_MAX_PAGES]
    if not wanted:
        raise OSError("no page of the zygote's to pin")
    runs = []  # [first page, count]
    for page in wanted:
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1][1] += 1
        else:
            runs.append([page, 1])
    c = _libc()
    ctypes, shift = c.ctypes, page_shift()
    params = (ctypes.c_uint32 * 30)()  # struct io_uring_params
    params[2] = _IORING_SETUP_R_DISABLED  # its flags: no request runs until enabled, which it never is
    ring = c.check(c.syscall(ctypes.c_long(_SYS_IO_URING_SETUP), ctypes.c_uint32(1), params), "io_uring_setup")
    iovecs = (ctypes.c_uint64 * (2 * len(runs)))(*[v for page, n in runs for v in (page << shift, n << shift)])
    try:
        c.check(
            c.syscall(ctypes.c_long(_SYS_IO_URING_REGISTER), ctypes.c_int(ring), ctypes.c_uint(_IORING_REGISTER_BUFFERS), iovecs, ctypes.c_uint(len(runs))),
            "registering %d pages with io_uring (the memory-lock limit, ulimit -l, may be lower)" % len(wanted),
        )
    except OSError:
        os.close(ring)
        raise
    os.set_inheritable(ring, False)
    PIN_FDS.append(ring)


class ForkPinning:
    """The zygote's side: makes one runner list the pages it copied, then pins them (PINNED_FOR_FORKS)."""

    def __init__(self, allowed: bool):
        self.learn = -1  # the pipe's read end while a runner learns
        self.listed = b""
        if not allowed:
            PINNED_FOR_FORKS[0] = "not asked for (per-call memory limits, or not Linux)"

    def before_fork(self) -> None:
        """Takes in a list that came, and, while none did, readies the next fork to list its pages."""
        if PINNED_FOR_FORKS[0] is not None:
            return
        if self.learn >= 0:
            if self._read():
                self._pin()
            return  # the next fork learns again where its runner ended unlisted
        try:
            r, w = self._pipe()
        except OSError as exc:
            PINNED_FOR_FORKS[0] = "no pipe to learn on: %s" % exc  # forks copy on write
            return
        self.learn = r
        PIN_FDS.append(r)
        LEARN_FD[0] = w

    @staticmethod
    def _pipe():
        """A pipe whose ends are above the descriptors a runner takes its call's into (0 to 4); its read end does not block."""
        ends = []
        for fd in os.pipe():
            try:
                ends.append(fcntl_dup_high(fd))
            finally:
                os.close(fd)
        os.set_blocking(ends[0], False)
        return ends

    def after_fork(self) -> None:
        """In the zygote: its end of the learning runner's pipe is closed."""
        fd, LEARN_FD[0] = LEARN_FD[0], -1
        if fd >= 0:
            os.close(fd)

    def _read(self) -> bool:
        """Reads what the learning runner wrote; True once it closed its end."""
        while True:
            try:
                chunk = os.read(self.learn, 65536)
            except BlockingIOError:
                return False
            except OSError:
                chunk = b""
            if not chunk:
                return True
            self.listed += chunk

    def _pin(self) -> None:
        import array

        PIN_FDS.remove(self.learn)
        os.close(self.learn)
        self.learn = -1
        listed, self.listed = self.listed, b""
        if not listed:
            return  # that runner ended before it listed them: the next fork learns
        pages = array.array("Q")
        pages.frombytes(listed[: len(listed) // 8 * 8])
        try:
            pin_for_forks(pages)
            PINNED_FOR_FORKS[0] = ""
        except Exception as exc:
            PINNED_FOR_FORKS[0] = "%s: %s" % (type(exc).__name__, exc)


def in_fork_child() -> None:
    """In a runner just forked: the zygote's pinning descriptors are not its own."""
    for fd in PIN_FDS:
        try:
            os.close(fd)
        except OSError:
            pass
    del PIN_FDS[:]


# ---------------------------------------------------------------------------
# Zygote mode: the forks it serves, and the runner each becomes
# ---------------------------------------------------------------------------


def zygote_serve():
    """In zygote mode, serves forks and returns only in a forked runner, with its output pipes (take_output_pipes)."""
    if len(sys.argv) < 5 or sys.argv[1] != ZYGOTE_FLAG:
        if _REGISTER_AT_FORK is not None:
            os.register_at_fork = _REGISTER_AT_FORK  # node code's own forks are Python's
        return None
    import gc
    import socket

    report_fd, control_fd, exits_fd = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    preloads = [m for m in (sys.argv[5] if len(sys.argv) > 5 else "").split(",") if m]
    del sys.argv[1:]
    set_title(TITLE_ZYGOTE)
    os.set_inheritable(exits_fd, False)  # the zygote's own: no runner holds it
    # The code cache's sources compiled now, not while a call waits for a
    # fork, and frozen below with the rest.
    remember_cached_code(CODE_MEMO_START_S)
    sandbox = os.environ.pop(SANDBOX_FORKS_ENV, "")
    pin = os.environ.pop(PIN_FORKS_ENV, "") == "1" and sys.platform.startswith("linux")
    no_forks = ""
    if sandbox:
        # The call directories' directory, then the paths the machine's
        # owner showed, which a fork's own /tmp would hide.
        SANDBOX_CALLS[:] = json.loads(sandbox)
        try:
            _libc()  # here, not in each fork
            no_forks = sandbox_fork_tried()
        except Exception as exc:
            no_forks = "%s: %s" % (type(exc).__name__, exc)
    threaded = preload_and_report(report_fd, preloads, forks=True, no_forks=no_forks) or bool(no_forks)
    FORK_WITH[:] = [libc_fork()]
    # What each fork would otherwise do first, to objects it shares with
    # this process (every page it writes there is copied).
    line_buffered_std_streams()
    rehearse_call()
    remember_environ()
    # What is loaded now stays out of the collector's way in the forks: a
    # collection there would touch every object, and copy every page.
    if hasattr(gc, "freeze"):
        gc.collect()
        gc.freeze()
    trim_heap()
    # A zygote with threads forks no call (preload_and_report): it answers
    # every fork 0, and the worker, told by the report, starts spares cold.
    threaded = threaded or threads_past_a_fork() > 1
    exits = ExitReports(exits_fd)
    control = socket.socket(fileno=control_fd)
    shape = re.compile(FORK_REQUEST_SHAPE)
    pinning = ForkPinning(pin)
    while True:
        exits.wait_for(control_fd)
        try:
            msg, ancdata, _, _ = control.recvmsg(1 << 20, socket.CMSG_SPACE(8 * 4))
        except OSError:
            os._exit(0)
        fds = []
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(memoryview(data).cast("i")[: len(data) // 4])
        if not msg:
            os._exit(0)  # the worker closed its end: nothing more to serve
        try:
            request = msg.decode("utf-8")
        except ValueError:
            request = ""
        if shape.fullmatch(request) is None or len(fds) != FORK_FDS or threaded:
            for fd in fds:
                os.close(fd)
            control.send(FORK_FAILED)
            continue
        remember_cached_code()
        pinning.before_fork()
        try:
            runner = zygote_fork()
        except OSError:
            runner = -1
        if runner == 0:
            in_fork_child()
            try:
                if _REGISTER_AT_FORK is not None:
                    os.register_at_fork = _REGISTER_AT_FORK  # node code's own forks are Python's
                exits.in_child()
                control.detach()
                return zygote_child(json.loads(request), fds, control_fd)
            except BaseException:
                os._exit(70)  # the worker answers for a runner that died unanswered
        pinning.after_fork()
        if runner > 0:
            exits.runners.add(runner)
            try:
                os.setpgid(runner, runner)  # before the worker can signal its group
            except OSError:
                pass  # it set its own group, or it has exited already
        for fd in fds:
            os.close(fd)
        control.send(b"%d" % runner if runner > 0 else FORK_FAILED)


# The modules whose fork handlers only make their locks usable again in a
# child of a process with threads. A zygote forks with one thread (it
# forks no call otherwise): none of its locks is held by a thread the
# fork leaves behind. zygote_fork does not run them; Python's fork would,
# and in each child they write to pages it then copies (threading's
# alone to 135 of the 250 a child copies before its first line).
LOCKS_ONLY_FORK_HANDLERS = ("threading", "logging", "concurrent.futures.thread")

# How the zygote forks (zygote_serve): libc's fork from libc_fork, or None
# for Python's own.
FORK_WITH = [None]


def libc_fork():
    """C's fork, called with the GIL held, where zygote_fork can use it in place of os.fork; else None.

    os.fork also readies the child's interpreter for a fork taken while
    other threads ran (the GIL, the import lock, the runtime's own locks)
    and runs the fork handlers of every module: a zygote needs neither
    of the first (it has one thread, which holds the GIL across the
    fork), and runs the handlers it has seen registered itself. Only
    CPython with a GIL, on Linux, where each handler a child would run is
    one FORK_HANDLERS recorded (_fork_handlers_all_seen).
    """
    if _REGISTER_AT_FORK is None or not _fork_handlers_all_seen():
        return None
    if sys.implementation.name != "cpython" or "t" in getattr(sys, "abiflags", "") or not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fork = ctypes.PyDLL(None, use_errno=True).fork
    except (ImportError, OSError, AttributeError):
        return None
    fork.restype = ctypes.c_int
    fork.argtypes = []
    return fork


def _fork_handlers_all_seen() -> bool:
    """Whether the handlers Python runs in a forked child are those FORK_HANDLERS recorded, and no other.

    A module imported before this file's first line (a site's .pth or
    sitecustomize) may have registered one unseen. Python keeps a child's
    handlers in a list of its own, which the collector tracks: one holding
    exactly the recorded handlers, in their order, is that list.
    """
    import gc

    ours = [h["after_in_child"] for _, h in FORK_HANDLERS if "after_in_child" in h]
    if not ours:
        return False  # nothing to find Python's list by
    return any(
        type(obj) is list and obj is not ours and len(obj) == len(ours) and all(a is b for a, b in zip(obj, ours))
        for obj in gc.get_objects()
    )


def zygote_fork() -> int:
    """Forks a runner as os.fork does, for a zygote with one thread: 0 in the runner, its pid in the zygote.

    The handlers of os.register_at_fork run as Python runs them (before
    in the reverse of their order, the others in it; what one raises is
    reported and ignored), but for those of LOCKS_ONLY_FORK_HANDLERS.
    """
    fork = FORK_WITH[0]
    if fork is None:
        import warnings

        with warnings.catch_warnings():
            # Python 3.12+ warns about forking with threads (a preloaded
            # library's pool): in the zygote, never in the call.
            warnings.simplefilter("ignore", DeprecationWarning)
            return os.fork()
    _, before, in_parent, in_child = fork_handlers()
    for handler in before:
        _run_fork_handler(handler)
    pid = fork()
    if pid < 0:
        import ctypes  # loaded by libc_fork

        err = ctypes.get_errno()
    for handler in in_child if pid == 0 else in_parent:
        _run_fork_handler(handler)
    if pid < 0:
        raise OSError(err, os.strerror(err))
    return pid


# What fork_handlers returned, and for how many of FORK_HANDLERS.
FORK_PLAN = [-1, (), (), ()]


def fork_handlers() -> list:
    """[n, before, after_in_parent, after_in_child]: the handlers zygote_fork runs, in their order, of the first n of FORK_HANDLERS.

    Made again only when a module registered another: a fork's zygote
    writes nothing it need not.
    """
    if FORK_PLAN[0] != len(FORK_HANDLERS):
        kept = [h for module, h in FORK_HANDLERS if module not in LOCKS_ONLY_FORK_HANDLERS]
        plan = [[h[when] for h in kept if h.get(when) is not None] for when in ("before", "after_in_parent", "after_in_child")]
        plan[0].reverse()
        FORK_PLAN[:] = [len(FORK_HANDLERS)] + plan
    return FORK_PLAN


def _run_fork_handler(handler) -> None:
    try:
        handler()
    except BaseException as exc:
        _report_ignored(exc, handler)


def trim_heap() -> None:
    """Gives the C heap's free pages back to the system (glibc's malloc_trim).

    Importing leaves megabytes of freed memory in the heap (a third of a
    zygote's own memory without numpy). Every page the zygote holds is
    mapped into each fork, and the kernel copies its page table entry at
    the fork and drops it again at the runner's exit: fewer pages held,
    faster both.
    """
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except Exception:
        pass  # not glibc: nothing to trim


def zygote_child(request: dict, fds: list, control_fd: int):
    """Makes a forked runner what a runner started cold with its call's environment is.

    Returns its output pipes and mark as take_output_pipes does: the token
    came in the request, on the worker's socket, and is kept nowhere else.
    """
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    set_title(TITLE_SPARE)  # until its request comes
    # The call's descriptors take the places a cold start gives them:
    # stdin, stdout, stderr, then the node's output pipes at 3 and 4.
    high = [fcntl_dup_high(fd) for fd in fds]
    for fd in fds:
        os.close(fd)
    for target, fd in enumerate(high):
        os.dup2(fd, target)
        os.close(fd)
    if control_fd > 4:
        try:
            os.close(control_fd)
        except OSError:
            pass
    if SANDBOX_CALLS:
        # Its stderr is the call's now: the worker logs why.
        env = dict(e.split("=", 1) for e in request[FORK_ENV] or [] if "=" in e)
        try:
            sandbox_fork(SANDBOX_CALLS, env.get(CALL_DIR_ENV))
        except Exception as exc:
            os.write(2, ("fluksio-worker sandbox: the forked runner could not sandbox itself: %s: %s\n" % (type(exc).__name__, exc)).encode())
            os._exit(SANDBOX_EXIT_SETUP)
    reset_environ(request[FORK_ENV] or [])
    if request[FORK_CWD]:
        os.chdir(request[FORK_CWD])
    # The zygote's own directories (the SDK module for other interpreters)
    # are not this call's: the call writes its own, in its place on sys.path.
    zygote_dirs = list(CALL_DIRS)
    del CALL_DIRS[:], TEMP_DIRS[:]
    if zygote_dirs:
        fresh = write_sdk_module()
        sys.path[:] = [fresh if p in zygote_dirs else p for p in sys.path]
    reseed_after_fork()
    FORKED.append(True)
    for fd in (FORKED_OUTPUT_FD, FORKED_OUTPUT_FD + 1):
        os.set_inheritable(fd, False)  # the node's children get them as fd 1 and 2 only
    mark = MARK_PREFIX + str(request[FORK_TOKEN]).encode("ascii") + MARK_SUFFIX
    return (FORKED_OUTPUT_FD, FORKED_OUTPUT_FD + 1), mark


def reseed_after_fork() -> None:
    """Reseeds, in a forked runner, the generators a cold start seeds from the system's entropy.

    A fork copies the zygote's random state, so every call forked from one
    zygote would draw the same numbers. Python's random reseeds itself in
    every fork (an at-fork hook of its own) and numpy.random.default_rng()
    seeds each new generator from the system; numpy's global RandomState
    and torch's default generators do not: those that are loaded are
    reseeded here. torch.seed() reseeds the CPU generator and queues the
    seed for CUDA's, which CUDA takes when a call first uses it (it never
    initialises CUDA here).
    """
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.seed()
        except Exception:
            pass


# The zygote's environment as it forks (remember_environ): its names in
# os.environ's order, each name's place in it, and each entry's name.
ZYGOTE_ENVIRON = []


def remember_environ() -> None:
    """Notes the zygote's environment, before it forks, for reset_environ."""
    names = tuple(os.environ)
    places = {name: i for i, name in enumerate(names)}
    entry_names = {"%s=%s" % (name, os.environ[name]): name for name in names}
    ZYGOTE_ENVIRON[:] = [(names, places, entry_names)]


def reset_environ(entries: list) -> None:
    """Makes a forked runner's environment exactly entries, as a cold start's is.

    A call's environment is its zygote's but for a few values (its call
    directory), so only what differs is set or unset: os.environ and the
    strings in it are the zygote's, shared with it until written, and
    clearing and refilling them cost a fork a hundred pages copied and
    half a millisecond. Where entries are not the zygote's names in its
    order (less some, a few values changed), os.environ is rebuilt whole,
    in the order of entries, as a cold start has it.
    """
    if ZYGOTE_ENVIRON:
        names, places, entry_names = ZYGOTE_ENVIRON[0]
        changed, dropped = [], []
        last = -1
        for entry in entries:
            name = entry_names.get(entry)
            if name is None:
                name, _, value = entry.partition("=")
                changed.append((name, value))
            place = places.get(name)
            if place is None or place <= last:
                break  # a name the zygote has not, or not in its order
            dropped.extend(names[last + 1 : place])
            last = place
        else:
            dropped.extend(names[last + 1 :])
            for name in dropped:
                del os.environ[name]
            for name, value in changed:
                os.environ[name] = value
            return
    os.environ.clear()
    for entry in entries:
        name, _, value = entry.partition("=")
        os.environ[name] = value


def fcntl_dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


# ---------------------------------------------------------------------------
# The worker's pipes for the node's output
# ---------------------------------------------------------------------------

# `worker_main.py --fluksio-output FD ...`: the worker made the pipes the
# node's stdout and stderr become (their write ends at FD and FD+1) and
# reads them itself, log events and their budget included: a reader in
# this process (the LogPump, for a runtime started without the worker)
# dies with it, and what the node wrote just before a hard exit (os._exit,
# a segfault and its faulthandler stack) would go with it. Before each
# stream event the runtime writes a mark (MARK_PREFIX, a token, MARK_SUFFIX)
# into both pipes: what the node wrote before the mark goes out before the
# event, what it wrote after, after it.
#
# The token comes on a pipe of its own (at FD + OUTPUT_TOKEN_AFTER), read
# and closed before node code runs, and is kept only in the closure of
# MARK_NODE_OUTPUT's function: it is in no argv (/proc/PID/cmdline), no
# environment, and no object a look through __main__'s names finds. Node
# code runs in this process and could still dig it out of memory (the
# closure's cell, /proc/self/mem): the worker does not rely on it being
# secret. A forged mark only moves the node's own lines around its stream
# events, and the worker holds lines waiting for an event within the same
# budget as any others.


def take_output_pipes():
    """The worker's write ends for the node's (stdout, stderr) and its mark, or None."""
    if len(sys.argv) < 3 or sys.argv[1] != OUTPUT_FLAG:
        return None
    first = int(sys.argv[2])
    del sys.argv[1:3]
    token_fd = first + OUTPUT_TOKEN_AFTER
    token = b""
    try:
        while True:
            piece = os.read(token_fd, MARK_TOKEN_SIZE)
            if not piece:
                break
            token += piece
    finally:
        os.close(token_fd)
    for fd in (first, first + 1):
        os.set_inheritable(fd, False)  # the node's children get them as fd 1 and 2 only
    return (first, first + 1), MARK_PREFIX + token + MARK_SUFFIX


def output_marker(fds: tuple, mark: bytes):
    """The function that marks the place of a stream event in the worker's pipes."""

    def mark_output() -> None:
        if os.getpid() != RUNNER_PID[0]:
            return
        for fd in fds:
            try:
                _WRITE(fd, mark)
            except OSError:
                pass

    return mark_output


# Set by prepare_call to output_marker's function where the worker reads the
# node's pipes.
MARK_NODE_OUTPUT = [lambda: None]


def mark_node_output() -> None:
    """Marks the place of a stream event in the node's output (the worker's pipes only)."""
    MARK_NODE_OUTPUT[0]()


# ---------------------------------------------------------------------------
# main: the mode this process was started in, then its one call
# ---------------------------------------------------------------------------


def report_capabilities() -> bool:
    """Started with CAPABILITIES_FLAG alone, writes what this runtime speaks on stdout (the wire block) and returns True."""
    if sys.argv[1:] != [CAPABILITIES_FLAG]:
        return False
    sys.stdout.write(json.dumps({CAPABILITY_VERSION: RUNTIME_VERSION, CAPABILITY_MODES: list(MODES)}) + "\n")
    sys.stdout.flush()
    return True


def main() -> None:
    if report_capabilities():
        return
    worker_pipes = zygote_serve() or take_output_pipes()
    spare_prepare()
    # The real stdout is the protocol channel and nothing else may reach it:
    # keep a private, close-on-exec copy (children never inherit it, so a
    # grandchild cannot hold the agent's pipe open) before anything can print.
    channel = Channel(os.dup(1))
    echo_fd = os.dup(2)
    CANCEL.install()
    CANCEL.on_timeout = lambda: (
        remove_call_dirs(),
        channel.answer(error_answer_fields(NodeCancelled("the call was cancelled (the node did not stop in time)"), channel.call_id)),
        _EXIT(1),
    )
    try:
        prepare_call(channel, echo_fd, worker_pipes)
        worker_pipes = None  # the mark lives on in MARK_NODE_OUTPUT's closure only
        if FORKED and (LEARN_FD[0] >= 0 or not request_waiting(REHEARSE_AFTER_S)):
            rehearse_call()
        if LEARN_FD[0] >= 0:
            # Before the request: no node code has run in this process.
            list_copied_pages()
        # What the runtime made so far stays out of the collector's way (a
        # runner forked from a zygote does not copy its pages for it), and
        # at exit, the objects the collector lists are the call's own. Done
        # before the request: it writes to pages of the zygote's objects.
        gc.freeze()
        request = read_request(channel)
        set_title(TITLE_CALL)
        # stdin stays open until the call ends; node code must not wait on it.
        os.dup2(DEVNULL[0], 0)
        os.close(DEVNULL.pop())
        op = request.get("op", "run")
        if op == "run":
            status = do_run(channel, request)
        elif op == "compile":
            status = do_compile(channel, request)
        else:
            raise BadRequest("unknown op %r (this runtime knows run and compile)" % (op,))
    except BaseException as exc:  # every failure is an answer, never a silent exit
        status = fail(channel, exc)
    exit_like_a_script(status, echo_fd)


def prepare_call(channel: Channel, echo_fd: int, worker_pipes) -> None:
    """Sets up what every call needs, before its request: a spare does it ahead of its call."""
    global PUMP
    if worker_pipes:
        fds, mark = worker_pipes
        for target, write_fd in zip((1, 2), fds):
            os.dup2(write_fd, target)  # inheritable: child processes log too
        # The write ends are kept for the marks: node code may redirect fd 1.
        MARK_NODE_OUTPUT[0] = output_marker(fds, mark)
        del worker_pipes, mark
    else:
        PUMP = LogPump(channel, echo_fd)
        PUMP.capture(1, "stdout")
        PUMP.capture(2, "stderr")
        PUMP.start()
    # A crash's Python stack goes where the node's stderr goes: to the
    # engine (the worker reads the node's pipes, and a crash does not
    # take its reader along). A descriptor, not a file object: a fork would
    # copy dozens of its zygote's pages to build one.
    try:
        import faulthandler

        faulthandler.enable(file=os.dup(2))
    except Exception:
        pass
    # Print and logging reach the pump line by line, as they happen. This
    # costs a write per line (a million prints take seconds, not a
    # fraction); flushing a block-buffered stdout from another thread
    # instead would be faster but can deadlock a node that forks.
    line_buffered_std_streams()
    STD_STREAMS[:] = [sys.stdout, sys.stderr]
    RUNNER_PID[0] = os.getpid()
    os._exit = exit_after_output
    os.register_at_fork(
        before=block_sigterm_for_fork,
        after_in_parent=restore_sigmask_after_fork,
        after_in_child=lambda: after_fork_in_child(channel),
    )
    install_sdk()
    prepare_code()
    DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))  # stdin's, once the request is read


# Opened by prepare_call: what stdin becomes once the request is read.
DEVNULL = []


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__":
    # A spawn or forkserver child of a node imports this file as its main
    # module before it imports the node's module: node code that does
    # `from fluksio import node` must import there too. (Its sys.path is
    # the runner's, without the PYTHONPATH entry of the SDK module.)
    install_sdk(for_children=False)
