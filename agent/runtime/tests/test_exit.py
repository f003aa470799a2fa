"""The runner's exit after its answer: what a script's exit does, in a runner started cold and in one forked from a zygote."""

import gzip
import json
import os
import shutil
import tempfile
import unittest
import zipfile

from tests.support import Call, Zygote, run_request

NODES = """
import _thread, atexit, concurrent.futures, gzip, json, os, tempfile, threading, time, zipfile

def leave_files_open(out):
    global ARCHIVE, SCRATCH
    # Held by another module, which a full shutdown tears down and this one
    # does not: text over a GzipFile over a file, closed in that order, or
    # the trailer (and the text still buffered) is lost; and a plain file.
    json._fluksio_test_text = gzip.open(os.path.join(out, "lines.gz"), "wt")
    json._fluksio_test_text.write("line\\n" * 1000)
    json._fluksio_test_file = open(os.path.join(out, "held.txt"), "w")
    json._fluksio_test_file.write("held elsewhere")
    ARCHIVE = zipfile.ZipFile(os.path.join(out, "archive.zip"), "w")  # its directory is written when it is freed
    ARCHIVE.writestr("inside.txt", "zipped")
    SCRATCH = tempfile.NamedTemporaryFile(dir=out, prefix="scratch-")  # removed when it is freed
    return {}

class SlowToFree:
    # Freed while the module is cleared: its finalizer gives the daemon threads time to run.
    def __del__(self, sleep=time.sleep):
        sleep(0.2)


def daemon_threads_at_exit(out):
    global CALLS, HELD

    def spin():
        while True:  # `CALLS` and `time` are None once the module is cleared
            CALLS.append(1)
            del CALLS[:]
            time.sleep(0.001)

    CALLS = []
    threading.Thread(target=spin, daemon=True).start()
    _thread.start_new_thread(spin, ())
    HELD = SlowToFree()
    return {}


def pool_and_atexit(out):
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def late():
        time.sleep(0.3)
        with open(os.path.join(out, "pool"), "w") as f:
            f.write("done")

    pool.submit(late)  # never shut down: exit waits for its work

    def runs():
        with open(os.path.join(out, "atexit"), "w") as f:
            f.write("ran")

    def fails():
        raise RuntimeError("this exit handler failed")

    atexit.register(runs)
    atexit.register(fails)  # runs first; its error is printed and the others still run
    return {}
"""


class ExitLikeAScript(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.zygote = Zygote()

    @classmethod
    def tearDownClass(cls):
        cls.zygote.close()

    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="fluksio-exit-")
        self.addCleanup(shutil.rmtree, self.out, True)

    def run_to_exit(self, function, forked):
        """Runs the node's function; returns (answer, the runner's stderr) once the runner is gone."""
        request = run_request(NODES, function, {"out": self.out})
        if not forked:
            c = Call(request)
            self.addCleanup(c.cleanup)
            answer, status = c.until_exit()
            self.assertEqual(status, 0)
            return answer, c.stderr()
        with tempfile.TemporaryFile() as stderr:
            env = ["%s=%s" % kv for kv in os.environ.items() if kv[0] != "PYTHONPATH"]
            pid, stdin_w, stdout_r, outputs = self.zygote.fork(env, self.out, stderr_fd=stderr.fileno())
            with os.fdopen(stdin_w, "wb") as stdin:
                stdin.write(json.dumps(request).encode() + b"\n")
            with os.fdopen(stdout_r, "rb") as stdout:
                lines = stdout.read().decode().splitlines()  # to EOF: the runner is gone
            for fd in outputs:
                os.close(fd)
            stderr.seek(0)
            return json.loads(lines[-1]), stderr.read().decode("utf-8", "replace")

    def test_files_left_open_are_flushed_and_closed_outermost_first(self):
        for forked in (False, True):
            with self.subTest(forked=forked):
                answer, stderr = self.run_to_exit("leave_files_open", forked)
                self.assertTrue(answer.get("ok"), answer)
                with gzip.open(os.path.join(self.out, "lines.gz"), "rt") as f:
                    self.assertEqual(f.read(), "line\n" * 1000, stderr)
                with zipfile.ZipFile(os.path.join(self.out, "archive.zip")) as z:
                    self.assertEqual(z.read("inside.txt"), b"zipped")
                with open(os.path.join(self.out, "held.txt")) as f:
                    self.assertEqual(f.read(), "held elsewhere")
                self.assertEqual([n for n in os.listdir(self.out) if n.startswith("scratch-")], [], "a temporary file is removed")
                for name in os.listdir(self.out):
                    os.unlink(os.path.join(self.out, name))

    def test_pools_finish_and_every_exit_handler_runs(self):
        for forked in (False, True):
            with self.subTest(forked=forked):
                answer, stderr = self.run_to_exit("pool_and_atexit", forked)
                self.assertTrue(answer.get("ok"), answer)
                for name, text in (("pool", "done"), ("atexit", "ran")):
                    with open(os.path.join(self.out, name)) as f:
                        self.assertEqual(f.read(), text)
                self.assertIn("RuntimeError: this exit handler failed", stderr, "printed as Python prints it")
                for name in os.listdir(self.out):
                    os.unlink(os.path.join(self.out, name))

    def test_daemon_threads_end_silently_while_the_module_is_cleared(self):
        for forked in (False, True):
            with self.subTest(forked=forked):
                answer, stderr = self.run_to_exit("daemon_threads_at_exit", forked)
                self.assertTrue(answer.get("ok"), answer)
                self.assertNotIn("Traceback", stderr)
                self.assertNotIn("Exception", stderr)


if __name__ == "__main__":
    unittest.main()
