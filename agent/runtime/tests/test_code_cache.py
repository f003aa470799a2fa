"""The code cache: shipped source compiled once, kept in the worker's artifact cache."""

import os
import shutil
import tempfile
import time
import unittest

from tests.support import RuntimeTestCase, Zygote, run_request, source

NODE = """
import subprocess, sys

def f():
    # A child interpreter imports the node's module from the call's directory.
    child = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.ANSWER)"], capture_output=True, text=True)
    return {"answer": ANSWER, "child": child.stdout.strip() or child.stderr[-500:]}

ANSWER = "compiled from the source"
"""
PLANTED = NODE.replace("compiled from the source", "planted in the cache")
# Another pipeline's node: it rewrites every entry of the code cache so that
# it holds code that answers "planted in the cache" under the entry's file
# name and NODE's source (a cache keeping code would run it for NODE).
PLANTER = """
import marshal, os

def f():
    code_dir = os.path.join(os.environ["FLUKSIO_ARTIFACT_CACHE"], "code")
    planted = compile(%r, "pipeline.py", "exec", dont_inherit=True)
    names = [n for n in os.listdir(code_dir) if not n.startswith(".")]
    for name in names:
        with open(os.path.join(code_dir, name), "wb") as f:
            marshal.dump(("pipeline.py", %r, planted), f)
    return {"planted": len(names)}
""" % (PLANTED, source(NODE))
# A node that says whether its code is what the zygote compiled (the
# runtime's CODE_MEMO: a forked call that finds its source there runs it).
# (A constant that is not an identifier is not interned: compiled again,
# it is another object.)
FROM_ZYGOTE = """
import __main__

ANSWER = "ran from the code compiled"

def f():
    memo = getattr(__main__, "CODE_MEMO", {})
    return {"answer": "ran", "from_zygote": any(c is ANSWER for m in memo.values() for c in m[2].co_consts)}
"""
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

    def plant(self, path, source):
        """Replaces a cache entry with one of source (file name pipeline.py)."""
        with open(path, "wb") as f:
            f.write(b"%d\npipeline.py" % len("pipeline.py") + source.encode())

    def cached(self, path):
        with open(path, "rb") as f:
            return f.read()

    def test_a_source_is_cached_once_as_a_source(self):
        first = self.run_to_exit()
        self.assertEqual(first, {"answer": "compiled from the source", "child": "compiled from the source"})
        self.assertEqual(os.stat(self.code_dir).st_mode & 0o777, 0o700)
        [entry] = self.entries()
        self.assertTrue(self.cached(entry).startswith(b"11\npipeline.py"), self.cached(entry)[:50])
        self.assertIn(b'ANSWER = "compiled from the source"', self.cached(entry))
        written = os.stat(entry)
        self.run_to_exit()
        self.assertEqual((os.stat(entry).st_ino, os.stat(entry).st_mtime_ns), (written.st_ino, written.st_mtime_ns), "the entry was written again")

    def test_a_node_cannot_plant_code_for_another_pipeline(self):
        self.run_to_exit()
        self.assertEqual(self.run_to_exit(PLANTER), {"planted": 1})
        # A runner started after that (a worker restarted: no zygote's
        # memory) runs what its source says.
        self.assertEqual(self.run_to_exit()["answer"], "compiled from the source")

    def test_a_sandboxed_calls_own_cache_is_not_written(self):
        # In a sandbox the worker points the artifact cache into the call's
        # directory (runner/sandbox.go's sandboxEnv), removed with the call:
        # an entry written there after the answer would only hold its slot.
        call_dir = tempfile.mkdtemp(dir=self.state)
        own = os.path.join(call_dir, ".fluksio-artifacts")
        env = {"FLUKSIO_ARTIFACT_CACHE": own, "FLUKSIO_CALL_DIR": call_dir}
        answer, status = self.call(run_request(NODE, "f"), env=env).until_exit()
        self.assertEqual(status, 0)
        self.assertEqual(answer["outputs"]["answer"], "compiled from the source", answer)
        self.assertFalse(os.path.exists(os.path.join(own, "code")), os.listdir(call_dir))

    def test_an_entry_for_another_source_is_not_used(self):
        self.run_to_exit()
        [entry] = self.entries()
        written = self.cached(entry)
        # The same name (as a CRC-32 collision would give), another source in it.
        self.plant(entry, PLANTED)
        self.assertEqual(self.run_to_exit()["answer"], "compiled from the source")
        self.assertEqual(self.cached(entry), written, "the entry was replaced")

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

    def run_forked(self, zygote, code=NODE):
        call_dir = tempfile.mkdtemp(dir=self.state)
        env = ["%s=%s" % kv for kv in os.environ.items() if kv[0] != "PYTHONPATH"]
        env += ["FLUKSIO_ARTIFACT_CACHE=" + self.cache, "FLUKSIO_CALL_DIR=" + call_dir]
        answer = zygote.run(run_request(code, "f"), env, call_dir)
        self.assertTrue(answer.get("ok"), answer)
        return answer["outputs"]

    def start_zygote(self):
        zygote = Zygote(env={"FLUKSIO_ARTIFACT_CACHE": self.cache})
        self.addCleanup(zygote.close)
        return zygote

    def test_forks_run_the_code_the_zygote_compiled(self):
        zygote = self.start_zygote()
        self.assertEqual(self.run_forked(zygote, FROM_ZYGOTE), {"answer": "ran", "from_zygote": False})  # writes the entry as it exits
        self.assertEqual(self.run_forked(zygote, FROM_ZYGOTE), {"answer": "ran", "from_zygote": True})
        # A zygote started since compiled it as it started.
        self.assertEqual(self.run_forked(self.start_zygote(), FROM_ZYGOTE), {"answer": "ran", "from_zygote": True})

    def test_a_node_cannot_plant_code_for_another_pipeline(self):
        zygote = self.start_zygote()
        self.assertEqual(self.run_forked(zygote)["answer"], "compiled from the source")
        self.assertEqual(self.run_forked(zygote, PLANTER), {"planted": 1})
        # The worker restarted: a new zygote reads the cache.
        self.assertEqual(self.run_forked(self.start_zygote())["answer"], "compiled from the source")

    def test_a_cache_others_may_write_is_not_read_by_the_zygote(self):
        zygote = self.start_zygote()
        self.run_forked(zygote, FROM_ZYGOTE)
        os.chmod(self.code_dir, 0o777)
        self.assertEqual(self.run_forked(zygote, FROM_ZYGOTE), {"answer": "ran", "from_zygote": False})

