"""The code cache: shipped source compiled once, kept in the worker's artifact cache."""

import marshal
import os
import shutil
import tempfile

from tests.support import RuntimeTestCase, run_request

NODE = """
import subprocess, sys

def f():
    # A child interpreter imports the node's module from the call's directory.
    child = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.ANSWER)"], capture_output=True, text=True)
    return {"answer": ANSWER, "child": child.stdout.strip() or child.stderr[-500:]}

ANSWER = "compiled from the source"
"""
PLANTED = NODE.replace("compiled from the source", "planted in the cache")


class CodeCache(RuntimeTestCase):
    def setUp(self):
        self.state = tempfile.mkdtemp(prefix="fluksio-state-")
        self.addCleanup(shutil.rmtree, self.state, True)
        self.code_dir = os.path.join(self.state, "artifacts", "code")

    def run_to_exit(self, code=NODE):
        """Runs f in a runner with the worker's variables; its answer, once the runner is gone (it caches after answering)."""
        call_dir = tempfile.mkdtemp(dir=self.state)
        env = {"FLUKSIO_ARTIFACT_CACHE": os.path.join(self.state, "artifacts"), "FLUKSIO_CALL_DIR": call_dir}
        answer, status = self.call(run_request(code, "f"), env=env).until_exit()
        self.assertEqual(status, 0)
        self.assertTrue(answer.get("ok"), answer)
        return answer["outputs"]

    def entries(self):
        return [os.path.join(self.code_dir, n) for n in os.listdir(self.code_dir)]

    def plant(self, path, claimed, source):
        """Replaces a cache entry with the code of source, said to be claimed's."""
        with open(path, "wb") as f:
            marshal.dump(("pipeline.py", claimed, compile(source, "pipeline.py", "exec", dont_inherit=True)), f)

    def cached_source(self, path):
        with open(path, "rb") as f:
            return marshal.load(f)[1]

    def test_a_source_is_compiled_once_then_its_cached_code_runs(self):
        first = self.run_to_exit()
        self.assertEqual(first, {"answer": "compiled from the source", "child": "compiled from the source"})
        self.assertEqual(os.stat(self.code_dir).st_mode & 0o777, 0o700)
        [entry] = self.entries()
        # Proof that the next call loads the cache and does not compile:
        # code planted under the source's name (with the source it claims) runs.
        self.plant(entry, self.cached_source(entry), PLANTED)
        self.assertEqual(self.run_to_exit()["answer"], "planted in the cache")

    def test_an_entry_for_another_source_is_not_used(self):
        self.run_to_exit()
        [entry] = self.entries()
        # The same name (as a CRC-32 collision would give), another source in it.
        self.plant(entry, PLANTED, PLANTED)
        self.assertEqual(self.run_to_exit()["answer"], "compiled from the source")
        self.assertEqual(self.run_to_exit()["answer"], "compiled from the source", "the entry was replaced")

    def test_a_cache_others_may_write_is_not_trusted(self):
        self.run_to_exit()
        [entry] = self.entries()
        self.plant(entry, self.cached_source(entry), PLANTED)
        os.chmod(self.code_dir, 0o777)
        self.assertEqual(self.run_to_exit()["answer"], "compiled from the source")

    def test_a_broken_entry_means_compiling(self):
        self.run_to_exit()
        [entry] = self.entries()
        with open(entry, "wb") as f:
            f.write(b"not marshal data")
        self.assertEqual(self.run_to_exit()["answer"], "compiled from the source")
