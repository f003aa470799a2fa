"""The code cache: shipped source compiled once, kept in the worker's artifact cache."""

import marshal
import os
import shutil
import tempfile
import time
import unittest

from tests.support import RuntimeTestCase, Zygote, run_request

NODE = """
import subprocess, sys

def f():
    # A child interpreter imports the node's module from the call's directory.
    child = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.ANSWER)"], capture_output=True, text=True)
    return {"answer": ANSWER, "child": child.stdout.strip() or child.stderr[-500:]}

ANSWER = "compiled from the source"
"""
PLANTED = NODE.replace("compiled from the source", "planted in the cache")
# The runtime's CODE_CACHE_KEEP: the entries the cache keeps.
KEEP = 256


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

    def test_the_cache_keeps_the_entries_used_last(self):
        self.run_to_exit()
        [used] = self.entries()
        days_ago = time.time() - 10 * 86400
        os.utime(used, (days_ago, days_ago))  # the oldest, until it is used again
        names = []
        for i in range(KEEP + 20):
            names.append(os.path.join(self.code_dir, "%s-0-%08x-%d" % ("ab" * 4, i, i)))
            with open(names[-1], "wb") as f:
                f.write(b"an entry of another source")
            os.utime(names[-1], (days_ago + 3600 + i, days_ago + 3600 + i))
        part = os.path.join(self.code_dir, ".part-cut-short")
        with open(part, "wb"):
            pass
        os.utime(part, (days_ago, days_ago))
        self.run_to_exit()  # read from the cache: marked used
        self.assertGreater(os.stat(used).st_mtime, time.time() - 3600)
        self.run_to_exit(NODE + "# another source, a new entry\n")
        left = set(self.entries())
        self.assertEqual(len(left), KEEP)
        self.assertIn(used, left)
        self.assertEqual(left - {used} - set(names), {max(self.entries(), key=os.path.getmtime)}, "the new entry is kept")
        self.assertEqual(set(names) - left, set(names[:22]), "the oldest go")

    def test_shipped_source_takes_the_place_of_the_empty_file_made_ahead(self):
        code = "import os, sys\n\ndef f():\n    return {'files': sorted(os.listdir(sys.path[0]))}\n"
        self.assertEqual(self.run_to_exit(code), {"files": ["pipeline.py"]})
        module_dir = tempfile.mkdtemp(dir=self.state)
        with open(os.path.join(module_dir, "fd_lister.py"), "w") as f:
            f.write(
                "import os\n\ndef f():\n    links = []\n    for fd in os.listdir('/proc/self/fd'):\n"
                "        try:\n            links.append(os.readlink('/proc/self/fd/' + fd))\n"
                "        except OSError:\n            pass\n    return {'open': links}\n"
            )
        call_dir = tempfile.mkdtemp(dir=self.state)
        env = {"FLUKSIO_ARTIFACT_CACHE": os.path.join(self.state, "artifacts"), "FLUKSIO_CALL_DIR": call_dir, "PYTHONPATH": module_dir}
        request = {"op": "run", "call_id": "m1", "node": {"module": "fd_lister"}, "function": "f", "inputs": {}}
        answer, _ = self.call(request, env=env).until_exit()
        self.assertTrue(answer.get("ok"), answer)
        self.assertEqual([p for p in answer["outputs"]["open"] if "fluksio-source" in p], [], "a module node holds no empty file open")


class ZygoteCodeCache(unittest.TestCase):
    """The code cache as runners forked from a zygote use it: read by the zygote, found in memory."""

    def setUp(self):
        self.state = tempfile.mkdtemp(prefix="fluksio-state-")
        self.addCleanup(shutil.rmtree, self.state, True)
        self.cache = os.path.join(self.state, "artifacts")
        self.code_dir = os.path.join(self.cache, "code")

    def run_forked(self, zygote):
        call_dir = tempfile.mkdtemp(dir=self.state)
        env = ["%s=%s" % kv for kv in os.environ.items() if kv[0] != "PYTHONPATH"]
        env += ["FLUKSIO_ARTIFACT_CACHE=" + self.cache, "FLUKSIO_CALL_DIR=" + call_dir]
        answer = zygote.run(run_request(NODE, "f"), env, call_dir)
        self.assertTrue(answer.get("ok"), answer)
        return answer["outputs"]["answer"]

    def plant(self, text):
        """Replaces the source's entry with code that answers text."""
        [entry] = [os.path.join(self.code_dir, n) for n in os.listdir(self.code_dir)]
        with open(entry, "rb") as f:
            claimed = marshal.load(f)[1]
        with open(entry, "wb") as f:
            marshal.dump(("pipeline.py", claimed, compile(claimed.replace("compiled from the source", text), "pipeline.py", "exec")), f)

    def start_zygote(self):
        zygote = Zygote(env={"FLUKSIO_ARTIFACT_CACHE": self.cache})
        self.addCleanup(zygote.close)
        return zygote

    def test_forks_find_the_code_the_zygote_read_and_read_no_file(self):
        zygote = self.start_zygote()
        self.assertEqual(self.run_forked(zygote), "compiled from the source")  # writes the entry as it exits
        self.plant("read by the zygote")
        self.assertEqual(self.run_forked(zygote), "read by the zygote")
        self.plant("only on disk")
        self.assertEqual(self.run_forked(zygote), "read by the zygote", "the fork took the zygote's copy, not the file")

    def test_a_cache_others_may_write_is_not_read_by_the_zygote(self):
        zygote = self.start_zygote()
        self.run_forked(zygote)
        self.plant("planted")
        os.chmod(self.code_dir, 0o777)
        self.assertEqual(self.run_forked(zygote), "compiled from the source")

