"""Node code as ML engineers write it: pools, cleanups, loaded files edited, directories."""

import os
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import ArtifactStore, RuntimeTestCase, logs, run_request, source  # noqa: E402


class ForkedChildren(RuntimeTestCase):
    def test_a_fork_pool_stopped_early_does_not_cancel_the_call(self):
        code = source(
            """
            import multiprocessing as mp, time

            def square(x):
                return x * x

            def f(rounds):
                total = 0
                for _ in range(rounds):
                    with mp.get_context("fork").Pool(2) as pool:
                        total += sum(pool.map(square, range(8)))
                time.sleep(1.2)  # past the runtime's default grace
                return {"total": total}
            """
        )
        answer, events, _ = self.run_call(run_request(code, "f", {"rounds": 40}))
        self.assertOk(answer)
        self.assertEqual(answer["outputs"], {"total": 40 * 140})
        self.assertFalse([l for l in logs(events) if "NodeCancelled" in l])

    def test_a_forked_child_cannot_answer(self):
        code = source(
            """
            import os

            def f():
                pid = os.fork()
                if pid == 0:
                    return {"who": "child"}
                os.waitpid(pid, 0)
                return {"who": "parent"}
            """
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(answer["outputs"], {"who": "parent"})


class CancelGrace(RuntimeTestCase):
    def test_the_grace_comes_from_the_environment(self):
        code = source(
            """
            import time

            def train():
                try:
                    yield {"step": 0}
                    time.sleep(30)
                finally:
                    time.sleep(1.5)
                    print("checkpoint saved")
            """
        )
        c = self.call(run_request(code, "train"), env={"FLUKSIO_CANCEL_GRACE": "4"})
        c.next(timeout=20)
        c.signal_group(signal.SIGTERM)
        answer, events = c.wait(timeout=10)
        err = self.assertError(answer, "NodeCancelled")
        self.assertNotIn("did not stop", err["message"])
        self.assertIn("checkpoint saved", logs(events))


class Output(RuntimeTestCase):
    def test_lines_stay_whole_under_pythonunbuffered(self):
        code = source(
            """
            import threading

            def f():
                start = threading.Barrier(4)
                def run(k):
                    start.wait()
                    for i in range(200):
                        print("printer-%d line %d" % (k, i))
                threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                return {}
            """
        )
        answer, events, _ = self.run_call(run_request(code, "f"), env={"PYTHONUNBUFFERED": "1"})
        self.assertOk(answer)
        lines = logs(events, "stdout")
        self.assertEqual(len(lines), 800)
        for line in lines:
            self.assertRegex(line, r"^printer-\d line \d+$")


class Artifacts(RuntimeTestCase):
    def setUp(self):
        self.store = ArtifactStore()
        self.addCleanup(self.store.close)
        root = tempfile.mkdtemp(prefix="fluksio-cache-")
        self.addCleanup(shutil.rmtree, root, True)
        self.cache = os.path.join(root, "cache")

    def env(self):
        env = self.store.env()
        env["FLUKSIO_ARTIFACT_CACHE"] = self.cache
        return env

    def test_an_edited_load_is_fetched_again(self):
        digest = self.store.put_bytes(b"pretrained weights")
        code = source(
            """
            import os
            from fluksio import load_artifact

            def edit(digest):
                path = load_artifact(digest)
                mode = os.stat(path).st_mode & 0o777
                os.chmod(path, 0o644)
                with open(path, "r+b") as f:
                    f.write(b"FINE-TUNED")
                return {"mode": mode}

            def read(digest):
                with open(load_artifact(digest), "rb") as f:
                    return {"data": f.read().decode()}
            """
        )
        answer, _, _ = self.run_call(run_request(code, "edit", {"digest": digest}), env=self.env())
        self.assertOk(answer)
        self.assertEqual(answer["outputs"]["mode"], 0o444)
        answer, _, _ = self.run_call(run_request(code, "read", {"digest": digest}), env=self.env())
        self.assertEqual(answer["outputs"]["data"], "pretrained weights")
        self.assertEqual(os.stat(self.cache).st_mode & 0o777, 0o700)

    def test_a_shared_cache_is_refused(self):
        os.makedirs(self.cache)
        os.chmod(self.cache, 0o777)
        digest = self.store.put_bytes(b"x")
        code = "from fluksio import load_artifact\ndef f(digest):\n    load_artifact(digest)\n"
        answer, _, _ = self.run_call(run_request(code, "f", {"digest": digest}), env=self.env())
        self.assertError(answer, "RuntimeError", "written by others")

    def test_a_directory_round_trips(self):
        code = source(
            """
            import os
            from fluksio import load_artifact, save_artifact

            def f(root):
                os.makedirs(os.path.join(root, "model", "sub"))
                with open(os.path.join(root, "model", "config.json"), "w") as fh:
                    fh.write("{}")
                with open(os.path.join(root, "model", "sub", "w.bin"), "wb") as fh:
                    fh.write(b"\\x00" * 100)
                ref = save_artifact(os.path.join(root, "model"))
                path = load_artifact(ref)
                found = sorted(os.path.relpath(os.path.join(d, n), path) for d, _, ns in os.walk(path) for n in ns)
                return {"ref": ref, "found": found, "isdir": os.path.isdir(path)}
            """
        )
        root = tempfile.mkdtemp(prefix="fluksio-dir-")
        self.addCleanup(shutil.rmtree, root, True)
        answer, _, _ = self.run_call(run_request(code, "f", {"root": root}), env=self.env())
        self.assertOk(answer)
        out = answer["outputs"]
        self.assertTrue(out["isdir"])
        self.assertEqual(out["found"], ["config.json", os.path.join("sub", "w.bin")])
        self.assertTrue(out["ref"]["directory"])
        self.assertTrue(self.store.has(out["ref"]["digest"]))


class SpawnPools(RuntimeTestCase):
    def test_a_spawn_pool_in_shipped_source(self):
        code = source(
            """
            import multiprocessing as mp
            from fluksio import Port, node

            def square(x):
                return x * x

            @node(provides=[Port("squares", "json")])
            def f():
                with mp.get_context("spawn").Pool(2) as pool:
                    return {"squares": pool.map_async(square, range(4)).get(timeout=30)}
            """
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(answer["outputs"], {"squares": [0, 1, 4, 9]})
