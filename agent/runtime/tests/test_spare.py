"""Spare mode: the runtime started ahead of its call (--fluksio-spare FD MODS)."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

from tests.support import PYTHON, RUNTIME, run_request


class SpareTest(unittest.TestCase):
    def start(self, preload="", env=None):
        read_fd, write_fd = os.pipe()
        args = [PYTHON, RUNTIME, "--fluksio-spare", str(write_fd)] + ([preload] if preload else [])
        proc = subprocess.Popen(
            args, pass_fds=[write_fd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, **(env or {}))
        )
        os.close(write_fd)
        self.addCleanup(lambda: (proc.kill(), proc.wait(), proc.stdout.close(), proc.stderr.close()))
        with os.fdopen(read_fd) as report:
            return proc, json.load(report)

    def test_says_what_it_speaks_when_asked(self):
        # The worker asks each runtime file once, before it starts one as a spare.
        out = subprocess.run([PYTHON, RUNTIME, "--fluksio-capabilities"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        said = json.loads(out.stdout.decode().splitlines()[0])
        self.assertEqual(sorted(said["modes"]), ["--fluksio-output", "--fluksio-spare", "--fluksio-zygote"])
        self.assertTrue(said["version"])

    def test_reports_then_serves_one_call_like_a_cold_runner(self):
        proc, report = self.start("json,no_such_module_here")
        self.assertEqual(list(report["failed"]), ["no_such_module_here"])
        self.assertIn("ModuleNotFoundError", report["failed"]["no_such_module_here"])
        watched = {path: existed for path, existed in report["watch"]}
        self.assertTrue(watched[os.path.abspath(RUNTIME)])
        self.assertTrue(watched[os.path.dirname(os.path.abspath(RUNTIME))])
        request = run_request(
            """
            import sys
            from fluksio import Port, node

            @node(provides=[Port("seen", "json")])
            def probe():
                return {"argv": sys.argv, "json": "json" in sys.modules}
            """,
            "probe",
        )
        out, _ = proc.communicate(json.dumps(request).encode() + b"\n", timeout=60)
        answer = json.loads(out.decode().splitlines()[-1])
        self.assertTrue(answer["ok"], answer)
        # node code sees the argv of a runner started cold
        self.assertEqual(answer["outputs"]["seen"]["argv"], [RUNTIME])
        self.assertTrue(answer["outputs"]["seen"]["json"])

    def test_a_preload_that_prints_does_not_reach_the_protocol_channel(self):
        proc, report = self.start("this")  # `import this` prints the Zen of Python
        self.assertEqual(report["failed"], {})
        request = run_request("from fluksio import node\n@node()\ndef f():\n    return None\n", "f")
        out, _ = proc.communicate(json.dumps(request).encode() + b"\n", timeout=60)
        lines = out.decode().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(json.loads(lines[0])["ok"], lines)

    def test_preloads_the_users_own_module_that_imports_the_sdk(self):
        path = tempfile.mkdtemp(prefix="fluksio-preload-")
        self.addCleanup(shutil.rmtree, path, True)
        with open(os.path.join(path, "my_nodes.py"), "w") as f:
            f.write("from fluksio import Port, node\n\n@node(provides=[Port('x', 'int')])\ndef seven():\n    return 7\n")
        proc, report = self.start("my_nodes", env={"PYTHONPATH": path})
        self.assertEqual(report["failed"], {})
        request = run_request("import sys\n\ndef f():\n    return {'preloaded': 'my_nodes' in sys.modules}\n", "f")
        out, _ = proc.communicate(json.dumps(request).encode() + b"\n", timeout=60)
        answer = json.loads(out.decode().splitlines()[-1])
        self.assertEqual(answer.get("outputs"), {"preloaded": True}, answer)
        request = {"op": "run", "call_id": "c2", "node": {"module": "my_nodes"}, "function": "seven", "inputs": {}}
        proc, _ = self.start("my_nodes", env={"PYTHONPATH": path})
        out, _ = proc.communicate(json.dumps(request).encode() + b"\n", timeout=60)
        answer = json.loads(out.decode().splitlines()[-1])
        self.assertEqual(answer.get("outputs"), {"x": 7}, answer)


if __name__ == "__main__":
    unittest.main()
