"""Node code as ML engineers write it: child interpreters, exit handlers, floods, patched stdlib, own signal handlers."""

import json
import os
import signal
import subprocess
import tempfile
import unittest

from tests.support import EXAMPLES, PYTHON, RuntimeTestCase, logs, run_request, source, streams


def has_module(name):
    return subprocess.run([PYTHON, "-c", "import " + name], stderr=subprocess.DEVNULL).returncode == 0


class ChildInterpreters(RuntimeTestCase):
    CODE = """
        import subprocess, sys
        from fluksio import Port, node

        def square(x):
            return x * x

        class Scaler:
            def __init__(self, k):
                self.k = k

            def apply(self, x):
                return self.k * x

        def scaled(scaler, x):
            return scaler.apply(x)

        @node(provides=[Port("imported", "str")])
        def child_imports():
            out = subprocess.run([sys.executable, "-c", "import %s as m; print(m.square(7), m.child_imports.__name__)" % __name__],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
            return out.stdout.decode().strip()

        @node(provides=[Port("squares", "list"), Port("scaled", "list")])
        def with_joblib():
            from joblib import Parallel, delayed  # the default backend: loky
            return {
                "squares": Parallel(n_jobs=2)(delayed(square)(i) for i in range(6)),
                "scaled": Parallel(n_jobs=2)(delayed(scaled)(Scaler(3), i) for i in range(3)),
            }
        """

    def module_dir(self):
        path = tempfile.mkdtemp(prefix="fluksio-mod-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", path]))
        with open(os.path.join(path, "my_ml_node.py"), "w") as f:
            f.write(source(self.CODE))
        return path

    def test_a_child_interpreter_imports_shipped_source_and_the_sdk(self):
        answer, _, _ = self.run_call(run_request(self.CODE, "child_imports"))
        self.assertEqual(answer.get("outputs"), {"imported": "49 child_imports"}, answer)

    def test_a_child_interpreter_imports_a_module_node_and_the_sdk(self):
        request = {"op": "run", "call_id": "c1", "node": {"module": "my_ml_node"}, "function": "child_imports", "inputs": {}}
        answer, _, _ = self.run_call(request, env={"PYTHONPATH": self.module_dir()})
        self.assertEqual(answer.get("outputs"), {"imported": "49 child_imports"}, answer)

    @unittest.skipUnless(has_module("joblib"), "joblib is not installed for this Python")
    def test_joblib_default_backend_runs_node_functions_and_classes(self):
        want = {"squares": [0, 1, 4, 9, 16, 25], "scaled": [0, 3, 6]}
        answer, _, _ = self.run_call(run_request(self.CODE, "with_joblib"), timeout=120)
        self.assertEqual(answer.get("outputs"), want, answer)
        request = {"op": "run", "call_id": "c1", "node": {"module": "my_ml_node"}, "function": "with_joblib", "inputs": {}}
        answer, _, _ = self.run_call(request, env={"PYTHONPATH": self.module_dir()}, timeout=120)
        self.assertEqual(answer.get("outputs"), want, answer)


class ExitSemantics(RuntimeTestCase):
    def exited(self, c, timeout=60):
        """Waits for the runner to exit by itself (the support closes it at once otherwise)."""
        return c.proc.wait(timeout)

    def test_atexit_unclosed_files_and_buffered_logging_are_flushed_after_the_answer(self):
        out = tempfile.mkdtemp(prefix="fluksio-exit-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", out]))
        with open(os.path.join(EXAMPLES, "tracker.py")) as f:
            code = f.read()
        c = self.call(run_request(code, "train", {"out": out}), env={"FLUKSIO_CANCEL_GRACE": "60"})
        answer, _ = self.wait_keeping(c)
        self.assertOk(answer)
        open(os.path.join(out, "answer-seen"), "w").close()
        self.assertEqual(self.exited(c), 0)
        with open(os.path.join(out, "atexit")) as f:
            self.assertEqual(f.read(), "ran")
        with open(os.path.join(out, "metrics.csv")) as f:
            self.assertEqual(f.read(), "epoch,loss\n1,0.5\n")
        with open(os.path.join(out, "run.log")) as f:
            self.assertIn("kept in memory until shutdown", f.read())
        self.assertIn("printed at exit", c.stderr(), "what exit handlers print goes to the runner's stderr")

    def test_a_thread_that_never_ends_does_not_hold_the_exit(self):
        with open(os.path.join(EXAMPLES, "tracker.py")) as f:
            code = f.read()
        c = self.call(run_request(code, "stuck"), env={"FLUKSIO_CANCEL_GRACE": "0.2"})
        answer, _ = self.wait_keeping(c)
        self.assertOk(answer)
        self.assertEqual(self.exited(c), 0)
        self.assertIn("did not finish within 0.2s", c.stderr())

    def wait_keeping(self, c, timeout=60):
        """The answer and events, leaving the runner running."""
        events = []
        while True:
            item = c.next(timeout)
            self.assertIsNotNone(item, "no answer; stderr:\n" + c.stderr()[-3000:])
            if item[1].get("event"):
                events.append(item[1])
                continue
            return item[1], events


class HardExit(RuntimeTestCase):
    def test_lines_printed_just_before_os_exit_arrive(self):
        code = """
            import os, sys

            def f():
                print("working", flush=True)
                print("last words", flush=True)
                sys.stderr.write("no newline before the exit")
                os._exit(3)
            """
        for attempt in range(12):  # it was lost in one to two calls of three
            c = self.call(run_request(code, "f"))
            events = []
            while True:
                item = c.next(30)
                if item is None:
                    break
                events.append(item[1])
            self.assertEqual(c.proc.wait(30), 3)
            self.assertEqual(logs(events, "stdout"), ["working", "last words"], "attempt %d" % attempt)
            self.assertEqual(logs(events, "stderr"), ["no newline before the exit"], "attempt %d" % attempt)


class Flood(RuntimeTestCase):
    def test_a_flood_keeps_its_beginning_and_its_last_lines(self):
        code = """
            def train():
                for i in range(5000):
                    print("step", i)
                print("FINAL accuracy=0.93")
                return {}
            """
        answer, events, _ = self.run_call(run_request(code, "train"))
        self.assertOk(answer)
        lines = logs(events)
        self.assertEqual(lines[0], "step 0")
        self.assertEqual(lines[-1], "FINAL accuracy=0.93")
        self.assertEqual(lines[-100:], ["step %d" % i for i in range(4901, 5000)] + ["FINAL accuracy=0.93"])
        notes = [i for i, line in enumerate(lines) if "lines dropped here" in line]
        self.assertTrue(notes, lines[:3])
        shown = [line for line in lines if "lines dropped" not in line]
        dropped = sum(int(lines[i].split()[1]) for i in notes)
        self.assertEqual(len(shown) + dropped, 5001, "every line is sent or counted where it went missing")
        numbers = [int(line.split()[1]) for line in shown[:-1]]
        self.assertEqual(numbers, sorted(numbers), "in order")
        for i in notes:  # each note stands where lines are missing
            before, after = int(lines[i - 1].split()[1]), int(lines[i + 1].split()[1])
            self.assertEqual(after - before - 1, int(lines[i].split()[1]), lines[i - 1 : i + 2])


class PatchedStdlib(RuntimeTestCase):
    def test_patches_of_json_print_stdout_and_os_write_do_not_reach_the_protocol(self):
        code = """
            import builtins, functools, io, json, os, sys
            from fluksio import Port, node

            @node(provides=[Port("loss", "float", stream=True), Port("done", "json")])
            def patched():
                json.dumps = functools.partial(json.dumps, indent=2)
                json.dump = lambda *a, **k: None
                json.JSONEncoder.default = lambda self, o: "patched"
                real_write = os.write
                os.write = lambda fd, data: real_write(fd, b"PATCHED " + bytes(data))
                real_print = builtins.print
                builtins.print = lambda *a, **k: real_print("patched print:", *a, **k)
                print("hello")
                sys.stdout = io.StringIO()
                sys.__stdout__ = io.StringIO()
                yield {"loss": 0.5}
                return {"done": {"nested": [1, 2]}}
            """
        answer, events, _ = self.run_call(run_request(code, "patched"))
        self.assertEqual(answer, {"call_id": "c1", "ok": True, "outputs": {"done": {"nested": [1, 2]}}})
        self.assertEqual(streams(events), [{"loss": 0.5}])
        self.assertIn("patched print: hello", logs(events, "stdout"))


class OwnSigtermHandler(RuntimeTestCase):
    CODE = """
        import signal, time

        def stubborn():
            signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
            print("ready", flush=True)
            for i in range(200000):
                print("busy", i)
            time.sleep(0.5)
            return {"finished": True}
        """

    def test_a_cancel_is_answered_node_cancelled_whatever_the_nodes_handler_does(self):
        for attempt in range(4):
            c = self.call(run_request(self.CODE, "stubborn"), env={"FLUKSIO_CANCEL_GRACE": "30"})
            while True:
                item = c.next(30)
                self.assertIsNotNone(item, c.stderr()[-2000:])
                if item[1].get("line") == "ready":
                    break
            c.signal_group(signal.SIGTERM)
            answer, _ = c.wait(60)
            self.assertError(answer, "NodeCancelled")


class Values(RuntimeTestCase):
    def test_a_numpy_bool_is_a_bool(self):
        # numpy.bool_ by type, so the runtime needs no numpy: the same class name and module.
        code = """
            from fluksio import Port, node

            class bool_:
                def __init__(self, v):
                    self.v = v

                def __bool__(self):
                    return self.v

            bool_.__module__ = "numpy"

            @node(provides=[Port("good", "bool"), Port("bad", "bool"), Port("raw", "json")])
            def f():
                return {"good": bool_(True), "bad": bool_(False), "raw": {"flag": bool_(True)}}
            """
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertEqual(answer.get("outputs"), {"good": True, "bad": False, "raw": {"flag": True}}, answer)

    @unittest.skipUnless(has_module("numpy"), "numpy is not installed for this Python")
    def test_a_real_numpy_comparison_on_a_bool_port(self):
        code = """
            import numpy as np
            from fluksio import Port, node

            @node(provides=[Port("good", "bool")])
            def f():
                return np.array([1.0, 0.0, 1.0]).mean() > 0.5
            """
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertEqual(answer.get("outputs"), {"good": True}, answer)

    def test_whitespace_only_pieces_are_not_log_lines(self):
        code = """
            import sys

            def f():
                sys.stderr.write("\\r 50%|#####     |")
                sys.stderr.write("\\r" + " " * 80 + "\\r")  # how tqdm clears a bar
                print("written over the bar")
                print(" \\t ")
                return {}
            """
        answer, events, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(logs(events, "stdout"), ["written over the bar"])
        self.assertEqual(logs(events, "stderr"), [" 50%|#####     |"])


if __name__ == "__main__":
    unittest.main()
