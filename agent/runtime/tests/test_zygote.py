"""Zygote mode: the runtime loaded once, forking each call's runner (--fluksio-zygote REPORT CONTROL EXITS MODS)."""

import array
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest

from tests.support import PYTHON, RUNTIME, Zygote, run_request

PROBE = """
import os, random, signal, sys
from fluksio import Port, node

@node(provides=[Port("seen", "json")])
def probe():
    return {
        "argv": sys.argv,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sigchld": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "marker": os.environ.get("ZYGOTE_TEST_MARKER"),
        "cwd": os.getcwd(),
        "draw": random.random(),
        "json": "json" in sys.modules,
        "stdin": os.read(0, 10).decode(),
    }
"""


class ZygoteTest(unittest.TestCase):
    def setUp(self):
        self.zygote = Zygote("json")
        self.addCleanup(self.zygote.close)
        self.proc, self.control, self.report = self.zygote.proc, self.zygote.control, self.zygote.report

    def fork(self, env, cwd="", dumps=json.dumps):
        """Asks for one runner and runs PROBE in it; returns what it saw."""
        pid, stdin_w, stdout_r, outputs = self.zygote.fork(env, cwd, dumps=dumps)
        self.assertGreater(pid, 0)
        with os.fdopen(stdin_w, "wb") as stdin:
            stdin.write(json.dumps(run_request(PROBE, "probe")).encode() + b"\n")
        with os.fdopen(stdout_r, "rb") as stdout:
            out = stdout.read()
        for r in outputs:
            os.close(r)
        answer = json.loads(out.decode().splitlines()[-1])
        self.assertTrue(answer["ok"], answer)
        seen = answer["outputs"]["seen"]
        self.assertEqual(seen["pid"], pid)
        return seen

    def test_forks_runners_with_the_calls_environment_and_fresh_random_state(self):
        self.assertEqual(self.report["failed"], {})
        cwd = tempfile.mkdtemp(prefix="fluksio-zygote-")
        self.addCleanup(os.rmdir, cwd)
        env = [k + "=" + v for k, v in os.environ.items()]
        first = self.fork(env + ["ZYGOTE_TEST_MARKER=one"], cwd)
        second = self.fork(env + ["ZYGOTE_TEST_MARKER=two"])
        self.assertEqual(first["argv"], [RUNTIME])  # a cold runner's argv
        self.assertEqual((first["marker"], second["marker"]), ("one", "two"))
        self.assertEqual(os.path.realpath(first["cwd"]), os.path.realpath(cwd))
        self.assertTrue(first["pgid_is_pid"] and second["pgid_is_pid"])
        self.assertTrue(first["json"])  # the preload is loaded
        # The zygote's child, which it reaps and reports; with SIGCHLD's
        # default disposition, as a cold start has it.
        self.assertEqual((first["ppid"], second["ppid"]), (self.proc.pid, self.proc.pid))
        self.assertTrue(first["sigchld"] and second["sigchld"])
        self.assertEqual((self.zygote.exit_status(first["pid"]), self.zygote.exit_status(second["pid"])), (0, 0))
        self.assertEqual(first["stdin"], "")  # stdin is closed to node code, as in a cold start
        self.assertNotEqual(first["pid"], second["pid"])
        self.assertNotEqual(first["draw"], second["draw"])
        self.assertIsNone(self.proc.poll(), "the zygote ended with its calls")

    def test_the_rehearsal_of_a_call_leaves_nothing_behind(self):
        # The zygote and each forked spare go through a call's path on a
        # node of the runtime's own before the request: nothing of it may
        # be seen by the call.
        probe = (
            "import gc, linecache, os, sys, types\n\n"
            "def f():\n"
            "    runtime = sys.modules['__main__']\n"
            "    return {\n"
            "        'modules': [m for m in sys.modules if 'rehearsal' in m],\n"
            "        'lines': [n for n in linecache.cache if 'rehearsal' in n],\n"
            "        'specs': [v[0].__name__ for v in runtime.SPECS.values() if 'rehearsal' in v[0].__name__],\n"
            "        'functions': gc.unfreeze() or [o.__name__ for o in gc.get_objects() if isinstance(o, types.FunctionType) and o.__name__ == 'rehearsal'],\n"
            "        'files': [n for d in sys.path[:1] for n in os.listdir(d)],\n"
            "    }\n"
        )
        env = [k + "=" + v for k, v in os.environ.items() if k != "PYTHONPATH"]
        call_dir = tempfile.mkdtemp(prefix="fluksio-zygote-")
        self.addCleanup(shutil.rmtree, call_dir, True)
        # Written late: a spare rehearses only once it has waited a while.
        answer = self.zygote.run(run_request(probe, "f"), env + ["FLUKSIO_CALL_DIR=" + call_dir], call_dir, after=0.5)
        self.assertTrue(answer.get("ok"), answer)
        self.assertEqual(answer["outputs"], {"modules": [], "lines": [], "specs": [], "functions": [], "files": ["pipeline.py"]})

    def run_rehearsed(self, request, env=(), zygote=None):
        """Runs request in a forked runner that rehearsed first, with a call directory and a code cache; returns (answer, cache dir)."""
        state = tempfile.mkdtemp(prefix="fluksio-zygote-")
        self.addCleanup(shutil.rmtree, state, True)
        call_dir = os.path.join(state, "call")
        os.mkdir(call_dir)
        base = [k + "=" + v for k, v in os.environ.items() if k != "PYTHONPATH"] + list(env)
        base += ["FLUKSIO_CALL_DIR=" + call_dir, "FLUKSIO_ARTIFACT_CACHE=" + os.path.join(state, "artifacts")]
        # Written late: a spare rehearses only once it has waited a while.
        return (zygote or self.zygote).run(request, base, call_dir, after=0.5), os.path.join(state, "artifacts", "code")

    def test_a_rehearsed_runner_ships_the_source_to_child_interpreters(self):
        # The directory shipped source goes to is on sys.path and
        # PYTHONPATH before the request: the file must be there by the
        # time node code starts another Python, which imports it by name.
        code = (
            "import multiprocessing, os, subprocess, sys\n"
            "MARK = 'shipped'\n\n"
            "def square(x):\n    return x * x\n\n"
            "def f():\n"
            "    with multiprocessing.get_context('spawn').Pool(1) as pool:\n"
            "        squares = pool.map(square, range(3))\n"
            "    child = subprocess.run([sys.executable, '-c', 'import pipeline; print(pipeline.MARK)'], stdout=subprocess.PIPE, check=True)\n"
            "    return {'squares': squares, 'child': child.stdout.decode().strip(), 'first': sys.path[0],\n"
            "            'pythonpath': os.environ['PYTHONPATH'].split(os.pathsep)[0]}\n"
        )
        answer, cache = self.run_rehearsed(run_request(code, "f"))
        self.assertTrue(answer.get("ok"), answer)
        out = answer["outputs"]
        self.assertEqual((out["squares"], out["child"]), ([0, 1, 4], "shipped"))
        self.assertEqual(out["pythonpath"], out["first"])
        # The code cache holds the call's source, none of the rehearsal's.
        names = []
        for entry in os.listdir(cache):
            with open(os.path.join(cache, entry), "rb") as f:
                names.append(f.read().split(b"\n", 1)[1][: len("pipeline.py")])
        self.assertEqual(names, [b"pipeline.py"])

    def test_a_rehearsed_runner_shows_the_nodes_lines_and_takes_a_cancel(self):
        failing = "def f():\n    x = 1\n    raise ValueError('from the node, x=%d' % x)\n"
        answer, _ = self.run_rehearsed(run_request(failing, "f"))
        self.assertFalse(answer["ok"])
        self.assertIn('pipeline.py", line 3, in f\n    raise ValueError', answer["error"]["traceback"])
        # The rehearsal leaves the runtime's SIGTERM handler in place.
        cancelled = "import os, signal, time\n\ndef f():\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(20)\n"
        answer, _ = self.run_rehearsed(run_request(cancelled, "f"))
        self.assertEqual(answer["error"]["type"], "NodeCancelled", answer)

    def test_a_module_node_finds_no_directory_for_shipped_source_on_its_paths(self):
        # The directory is put on the paths ahead of the request; a call
        # that ships no source has it taken off again.
        module_dir = tempfile.mkdtemp(prefix="fluksio-zygote-")
        self.addCleanup(shutil.rmtree, module_dir, True)
        with open(os.path.join(module_dir, "path_probe.py"), "w") as f:
            f.write("import os, sys\n\ndef f():\n    return {'path': sys.path, 'pythonpath': os.environ['PYTHONPATH'].split(os.pathsep)}\n")
        request = {"op": "run", "call_id": "m1", "node": {"module": "path_probe"}, "function": "f", "inputs": {}}
        zygote = Zygote(env={"PYTHONPATH": module_dir})  # a zygote's sys.path is its forks'
        self.addCleanup(zygote.close)
        answer, _ = self.run_rehearsed(request, ["PYTHONPATH=" + module_dir], zygote)
        self.assertTrue(answer.get("ok"), answer)
        out = answer["outputs"]
        self.assertEqual([p for p in out["path"] + out["pythonpath"] if "fluksio-code" in p], [], out)
        self.assertEqual(out["pythonpath"][0], module_dir)

    def test_reports_how_each_runner_ended(self):
        env = [k + "=" + v for k, v in os.environ.items()]
        exits = "import os\ndef f():\n    os._exit(7)\n"
        killed = "import os, signal\ndef f():\n    os.kill(os.getpid(), signal.SIGUSR1)\n"
        statuses = []
        for code in (exits, killed):
            pid, stdin_w, stdout_r, outputs = self.zygote.fork(env)
            with os.fdopen(stdin_w, "wb") as stdin:
                stdin.write(json.dumps(run_request(code, "f")).encode() + b"\n")
            with os.fdopen(stdout_r, "rb") as stdout:
                self.assertEqual(stdout.read(), b"")  # no answer: it ended first
            for r in outputs:
                os.close(r)
            statuses.append(self.zygote.exit_status(pid))
        self.assertTrue(os.WIFEXITED(statuses[0]) and os.WEXITSTATUS(statuses[0]) == 7, statuses)
        self.assertTrue(os.WIFSIGNALED(statuses[1]) and os.WTERMSIG(statuses[1]) == signal.SIGUSR1, statuses)
        # Reaped: no zombie of them is left under the zygote.
        with open("/proc/%d/task/%d/children" % (self.proc.pid, self.proc.pid)) as f:
            self.assertEqual(f.read().split(), [])

    def test_reports_the_exits_of_its_runners_only(self):
        # While it waits for a request, the zygote reaps its children and
        # reports those that are runners; one a preload started is not.
        script = (
            "import importlib.util, os, sys\n"
            "spec = importlib.util.spec_from_file_location('runtime', sys.argv[1])\n"
            "runtime = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(runtime)\n"
            "r, w = os.pipe()\n"
            "reports = runtime.ExitReports(w)\n"
            "other = os.fork()\n"
            "if other == 0:\n"
            "    os._exit(5)\n"
            "runner = os.fork()\n"
            "if runner == 0:\n"
            "    os._exit(3)\n"
            "reports.runners.add(runner)\n"
            "for pid in (other, runner):\n"
            "    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)\n"
            "request_r, request_w = os.pipe()\n"
            "os.write(request_w, b'x')\n"
            "reports.wait_for(request_r)\n"
            "os.close(w)\n"
            "records = b''\n"
            "while True:\n"
            "    chunk = os.read(r, 64)\n"
            "    if not chunk:\n"
            "        break\n"
            "    records += chunk\n"
            "print(runner, len(records), int.from_bytes(records[:4], sys.byteorder, signed=True), int.from_bytes(records[4:8], sys.byteorder), int.from_bytes(records[8:16], sys.byteorder))\n"
        )
        out = subprocess.run([PYTHON, "-c", script, RUNTIME], stdout=subprocess.PIPE, check=True, timeout=60).stdout.split()
        runner, size, reported, status, maxrss = (int(x) for x in out)
        self.assertEqual(size, 16, "one report: the runner's, not the other child's")
        self.assertEqual(reported, runner)
        self.assertTrue(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, status)
        self.assertGreater(maxrss, 0)  # its peak memory in KiB, from wait4

    def test_the_environment_is_the_calls_own_in_its_order(self):
        # A fork sets only what differs from its zygote's environment:
        # what the zygote has and the call has not must go, changed values
        # change, and os.environ's order and the C environment (what a
        # child process inherits) are a cold start's; so they are where
        # the call has names the zygote lacks, or in another order.
        probe = (
            "import os, subprocess\n\n"
            "def f():\n"
            "    c = subprocess.run(['env', '-0'], stdout=subprocess.PIPE, check=True).stdout.decode()\n"
            "    return {'environ': [k + '=' + (v if k != 'PYTHONPATH' else 'X') for k, v in os.environ.items()],\n"
            "            'c': sorted(e if not e.startswith('PYTHONPATH=') else 'PYTHONPATH=X' for e in c.split('\\0') if e)}\n"
        )
        zygote = Zygote(env={"ZYGOTE_ONLY": "1", "ZYGOTE_CHANGED": "before"})
        self.addCleanup(zygote.close)
        base = [k + "=" + v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ZYGOTE_ONLY", "ZYGOTE_CHANGED")]
        in_order = base + ["ZYGOTE_CHANGED=after"]
        for env in (in_order, in_order + ["CALL_ONLY=a=b"], list(reversed(in_order))):
            answer = zygote.run(run_request(probe, "f"), env)
            self.assertTrue(answer.get("ok"), answer)
            want = env + ["PYTHONPATH=X"]  # the SDK package's directory, for the call's other interpreters
            self.assertEqual(answer["outputs"]["environ"], want)
            self.assertEqual(answer["outputs"]["c"], sorted(want))

    def test_streams_are_line_buffered_under_pythonunbuffered(self):
        # The zygote makes the standard streams line-buffered once, before
        # it forks (PYTHONUNBUFFERED=1 gives ones that write every piece
        # through): a fork's threads printing at once never cut a line.
        probe = (
            "import sys, threading\n\n"
            "def f():\n"
            "    start = threading.Barrier(4)\n"
            "    def run(k):\n"
            "        start.wait()\n"
            "        for i in range(200):\n"
            "            print('printer-%d line %d' % (k, i))\n"
            "    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]\n"
            "    for t in threads:\n"
            "        t.start()\n"
            "    for t in threads:\n"
            "        t.join()\n"
            "    return {'line_buffering': sys.stdout.line_buffering, 'write_through': sys.stdout.write_through,\n"
            "            'name': sys.stdout.name, 'same': sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__}\n"
        )
        zygote = Zygote(env={"PYTHONUNBUFFERED": "1"})
        self.addCleanup(zygote.close)
        env = [k + "=" + v for k, v in os.environ.items()] + ["PYTHONUNBUFFERED=1"]
        out = []
        answer = zygote.run(run_request(probe, "f"), env, node_output=out)
        self.assertTrue(answer.get("ok"), answer)
        self.assertEqual(answer["outputs"], {"line_buffering": True, "write_through": False, "name": "<stdout>", "same": True})
        lines = out[0].splitlines()
        self.assertEqual(len(lines), 800)
        for line in lines:
            self.assertRegex(line, r"^printer-\d line \d+$")

    def test_a_crash_shows_its_python_stack_on_the_nodes_stderr(self):
        # faulthandler is enabled in each fork on a copy of its own stderr
        # (the node's pipe): a segfault's stack reaches the worker.
        probe = "import ctypes\n\ndef f():\n    print('last words', flush=True)\n    ctypes.string_at(0)\n"
        env = [k + "=" + v for k, v in os.environ.items()]
        out = []
        answer = self.zygote.run(run_request(probe, "f"), env, node_output=out)
        self.assertIsNone(answer)  # no answer: the runner died (the worker answers for it)
        self.assertIn("last words", out[0])
        self.assertIn("Fatal Python error", out[1])
        self.assertRegex(out[1], r'File "[^"]*/pipeline.py", line 5 in f')  # the shipped file

    def test_a_bad_request_is_refused_and_the_zygote_goes_on(self):
        self.control.send(b"not json")
        self.assertEqual(self.control.recv(32), b"0")
        env = [k + "=" + v for k, v in os.environ.items()]
        self.assertIsNone(self.fork(env)["marker"])

    def test_a_request_with_other_keys_is_refused(self):
        # Its keys are FORK_REQUEST_KEYS, no more and no fewer: a worker that
        # names one otherwise gets no runner, rather than one in the wrong
        # directory or environment.
        r, w = os.pipe()
        # Nor in another order: the zygote checks a request's shape, as
        # the worker writes it, and only its fork parses it.
        for request in ({"env": [], "workdir": "/", "token": "0" * 32}, {"env": [], "token": "0" * 32}, {"cwd": "", "env": [], "token": "0" * 32}):
            fds = array.array("i", [r, w, w, w, w])
            self.control.sendmsg([json.dumps(request).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            self.assertEqual(self.control.recv(32), b"0")
        os.close(r)
        os.close(w)
        env = [k + "=" + v for k, v in os.environ.items()]
        self.assertIsNone(self.fork(env)["marker"])

    def test_a_fork_gets_its_environment_whole_however_the_request_is_written(self):
        # The zygote only checks a request's shape (FORK_REQUEST_SHAPE),
        # which holds any JSON string: escapes, control characters, UTF-8
        # as the worker writes it (unescaped, compact) or escaped.
        odd = 'a"b\\c\td\ne \u00e9 \u2028 <&> \x01 \\u0041 =='
        env = [k + "=" + v for k, v in os.environ.items()] + ["ZYGOTE_TEST_MARKER=" + odd]
        as_the_worker = lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
        for dumps in (as_the_worker, json.dumps, lambda obj: json.dumps(obj, indent=1)):
            self.assertEqual(self.fork(env, dumps=dumps)["marker"], odd)
        self.assertEqual(self.fork([k + "=" + v for k, v in os.environ.items()], dumps=lambda obj: json.dumps(dict(obj, env=None)))["marker"], None)

    def test_exits_when_the_worker_closes_its_end(self):
        self.control.shutdown(socket.SHUT_RDWR)
        self.assertEqual(self.proc.wait(timeout=30), 0)


if __name__ == "__main__":
    unittest.main()


# A stand-in for torch's generator API (torch is not installed here): a
# default generator seeded from the system's entropy at import, which
# torch.seed() reseeds, as the real one does.
FAKE_TORCH = """
import os, types

random = types.ModuleType("torch.random")
random._seed = int.from_bytes(os.urandom(8), "little")

def seed():
    random._seed = int.from_bytes(os.urandom(8), "little")
    return random._seed

def initial_seed():
    return random._seed

random.seed, random.initial_seed = seed, initial_seed
"""

# A preload that starts a thread as it is imported (as torch's or numba's
# thread pools do), native or not: threading's count sees only Python's.
THREAD_STARTER = """
import _thread, time

_thread.start_new_thread(time.sleep, (3600,))
"""

DRAWS = """
import random, sys

def f():
    out = {"random": random.random(), "torch": sys.modules["torch"].initial_seed()}
    try:
        import numpy
    except ImportError:
        return out
    out["numpy"] = float(numpy.random.random())
    out["default_rng"] = float(numpy.random.default_rng().random())
    return out
"""


# A preload that registers fork handlers as a library does (a pool's lock,
# a generator to reseed): each counts its runs in a file of its own, and
# the child's also keeps its pid, where the node looks. It also keeps
# threading's lock of its module state, which Python's own fork replaces
# in the child (threading's handler) and the zygote's does not.
FORK_HOOKS = """
import os, sys, threading

DIR = os.environ["FORK_HOOKS_DIR"]
child_pid = None
limbo_lock = threading._active_limbo_lock

def _count(name):
    with open(os.path.join(DIR, name), "a") as f:
        f.write("%d\\n" % os.getpid())

def _child():
    global child_pid
    child_pid = os.getpid()
    _count("child")

os.register_at_fork(before=lambda: _count("before"), after_in_parent=lambda: _count("parent"), after_in_child=_child)
"""

FORK_HOOKS_NODE = """
import os, sys, threading

def f():
    hooks = sys.modules["forkhooks"]
    seen = []
    worker = threading.Thread(target=lambda: seen.append(threading.current_thread().name), name="t")
    worker.start()
    worker.join()
    r, w = os.pipe()
    pid = os.fork()  # the node's own fork: Python's, with every handler
    if pid == 0:
        os.write(w, b"%d" % (threading._active_limbo_lock is not hooks.limbo_lock))
        os._exit(0)
    os.close(w)
    replaced_in_its_fork = os.read(r, 10) == b"1"
    os.waitpid(pid, 0)
    return {
        "child_handler_ran_here": hooks.child_pid == os.getpid(),
        "register_at_fork": type(os.register_at_fork).__name__,
        "main_thread": threading.current_thread() is threading.main_thread() and threading.main_thread().ident == threading.get_ident(),
        "thread_ran": seen == ["t"],
        "threading_state_kept": threading._active_limbo_lock is hooks.limbo_lock,
        "replaced_in_its_fork": replaced_in_its_fork,
    }
"""


class ZygoteForks(unittest.TestCase):
    """How a zygote forks: the fork handlers run as Python's own fork runs them, where a node can see it."""

    def test_a_preloads_fork_handlers_run_and_the_runner_is_a_plain_process(self):
        path = tempfile.mkdtemp(prefix="fluksio-forkhooks-")
        self.addCleanup(shutil.rmtree, path, True)
        with open(os.path.join(path, "forkhooks.py"), "w") as f:
            f.write(FORK_HOOKS)
        env = {"PYTHONPATH": path, "FORK_HOOKS_DIR": path}
        zygote = Zygote("forkhooks", env=env)
        self.addCleanup(zygote.close)
        self.assertEqual(zygote.report["failed"], {})
        call_env = ["%s=%s" % kv for kv in dict(os.environ, **env).items()]
        answers = [zygote.run(run_request(FORK_HOOKS_NODE, "f"), call_env) for _ in range(2)]
        for answer in answers:
            self.assertTrue(answer and answer["ok"], answer)
            seen = answer["outputs"]
            self.assertEqual(
                {k: seen[k] for k in ("child_handler_ran_here", "register_at_fork", "main_thread", "thread_ran", "replaced_in_its_fork")},
                {
                    "child_handler_ran_here": True,
                    "register_at_fork": "builtin_function_or_method",  # Python's own, for the node
                    "main_thread": True,
                    "thread_ran": True,
                    "replaced_in_its_fork": True,  # the node's fork ran threading's handler
                },
            )

        def pids(name):
            with open(os.path.join(path, name)) as f:
                return [int(line) for line in f.read().split()]

        # Before and after in the zygote, once per fork of the zygote (and
        # of each node's own fork, in the runner); the child's in each.
        self.assertEqual(pids("before").count(zygote.proc.pid), 2)
        self.assertEqual(pids("parent").count(zygote.proc.pid), 2)
        self.assertEqual(len(pids("child")), 4)
        # Python's fork replaces threading's state in a child; the zygote's
        # keeps it (one thread forks, none of whose locks another holds),
        # where every fork handler was registered after the runtime began:
        # an interpreter whose start-up imported threading, random or
        # logging (a site's .pth) forks as Python does.
        startup = subprocess.run(
            [PYTHON, "-c", "import sys; print(any(m in sys.modules for m in ('threading', 'random', 'logging')))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        fast = startup == "False" and sys.implementation.name == "cpython" and sys.platform.startswith("linux")
        self.assertEqual([a["outputs"]["threading_state_kept"] for a in answers], [fast, fast])


# What a forked runner shows of its memory and its descriptors: the page
# faults it took so far, and what each descriptor it holds is.
FAULTS_AND_FDS = """
import os, resource

def f():
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass
    return {"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt, "fds": fds}
"""


def pinned_kib(pid):
    """The memory process pid holds pinned (VmPin), in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmPin:"):
                return int(line.split()[1])
    return 0


def io_uring_usable():
    """Whether this process may make an io_uring (a kernel from 5.1, not disabled by sysctl or seccomp)."""
    import ctypes

    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    params = (ctypes.c_uint32 * 30)()
    ring = syscall(ctypes.c_long(425), ctypes.c_uint32(1), params)
    if ring < 0:
        return False
    os.close(ring)
    return True


@unittest.skipUnless(sys.platform.startswith("linux"), "pages are pinned for forks on Linux only")
class ForkPinning(unittest.TestCase):
    """The pages a zygote's runners write are copied at the fork once the worker asks for it (PIN_FORKS_ENV)."""

    def run_probe(self, zygote):
        env = ["%s=%s" % kv for kv in os.environ.items()]
        answer = zygote.run(run_request(FAULTS_AND_FDS, "f"), env)
        self.assertTrue(answer["ok"], answer)
        return answer["outputs"]

    def test_the_pages_the_first_runner_wrote_are_copied_at_each_later_fork(self):
        if not io_uring_usable():
            self.skipTest("io_uring cannot be had here")
        zygote = Zygote("json", env={"FLUKSIO_PIN_FORKS": "1"})
        self.addCleanup(zygote.close)
        learner = self.run_probe(zygote)
        self.assertEqual(pinned_kib(zygote.proc.pid), 0, "pinned before its first runner listed its pages")
        later = [self.run_probe(zygote) for _ in range(3)]
        pinned = pinned_kib(zygote.proc.pid)
        # What a runner writes of its zygote's: hundreds of pages, at most 16 MiB.
        self.assertGreater(pinned, 256, "the zygote pinned no page its first runner wrote")
        self.assertLessEqual(pinned, 16 << 10)
        # A later runner copied them at its fork, without a fault each:
        # it took far fewer than the runner before the pinning.
        for seen in later[1:]:
            self.assertLess(seen["faults"], learner["faults"] * 2 / 3, (learner["faults"], [s["faults"] for s in later]))
        # No runner holds the ring that pins them, nor the pipe the first
        # runner listed its pages on: each holds the descriptors a runner
        # of a zygote that pins nothing holds.
        plain = Zygote("json")
        self.addCleanup(plain.close)
        held = sorted(self.run_probe(plain)["fds"])
        self.assertEqual(pinned_kib(plain.proc.pid), 0, "a zygote the worker did not ask pinned pages")
        for seen in [learner] + later:
            self.assertFalse([t for t in seen["fds"].values() if "io_uring" in t], seen["fds"])
            self.assertEqual(sorted(seen["fds"]), held, seen["fds"])


class PreloadedState(unittest.TestCase):
    """What a zygote's preloads leave in its forks: generators reseeded, and no fork at all where a preload started threads."""

    def zygote(self, preload, modules):
        path = tempfile.mkdtemp(prefix="fluksio-preloads-")
        self.addCleanup(shutil.rmtree, path, True)
        for name, text in modules.items():
            with open(os.path.join(path, name + ".py"), "w") as f:
                f.write(text)
        zygote = Zygote(preload, env={"PYTHONPATH": path})
        self.addCleanup(zygote.close)
        env = ["%s=%s" % kv for kv in os.environ.items()] + ["PYTHONPATH=" + path]
        return zygote, env

    def test_each_fork_draws_numbers_of_its_own(self):
        preload = "torch,numpy" if subprocess.run([PYTHON, "-c", "import numpy"], capture_output=True).returncode == 0 else "torch"
        zygote, env = self.zygote(preload, {"torch": FAKE_TORCH})
        self.assertEqual(zygote.report["failed"], {})
        # numpy's OpenBLAS threads end before a fork: they are no reason not to fork.
        self.assertNotIn("threads", zygote.report)
        first, second = (zygote.run(run_request(DRAWS, "f"), env) for _ in range(2))
        self.assertTrue(first["ok"] and second["ok"], (first, second))
        first, second = first["outputs"], second["outputs"]
        self.assertEqual(set(first), {"random", "torch", "numpy", "default_rng"} if "numpy" in preload else {"random", "torch"})
        for name in first:
            self.assertNotEqual(first[name], second[name], name)

    def test_a_zygote_whose_preload_started_threads_forks_nothing(self):
        zygote, env = self.zygote("json,threader,torch", {"threader": THREAD_STARTER, "torch": FAKE_TORCH})
        self.assertEqual(zygote.report["failed"], {})
        self.assertEqual(zygote.report["threads"], {"count": 2, "module": "threader"})
        pid, stdin_w, stdout_r, outputs = zygote.fork(env)
        for fd in [stdin_w, stdout_r] + outputs:
            os.close(fd)
        self.assertEqual(pid, 0, "the zygote forked")
        self.assertIsNone(zygote.proc.poll(), "the zygote goes on (the worker stops it)")

    def test_a_zygote_without_threads_says_none(self):
        zygote, _ = self.zygote("json,torch", {"torch": FAKE_TORCH})
        self.assertNotIn("threads", zygote.report)
