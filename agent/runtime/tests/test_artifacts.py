"""save_artifact / load_artifact against a loopback store, and the SDK surface."""

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import TOKEN, ArtifactStore, RuntimeTestCase, compile_request, logs, run_request, source  # noqa: E402

SAVE_BYTES = source(
    """
    import fluksio
    from fluksio import Port, node

    @node(requires=[Port("text", "str")], provides=Port("blob", "artifact"))
    def save(*, text):
        return fluksio.save_artifact(text.encode(), name="notes.txt", media_type="text/plain")
    """
)

LOAD = source(
    """
    from fluksio import Port, load_artifact, node

    @node(requires=[Port("blob", "artifact")], provides=[Port("path", "str"), Port("text", "str")])
    def load(*, blob):
        path = load_artifact(blob)
        with open(path) as f:
            return {"path": path, "text": f.read()}
    """
)


class ArtifactCase(RuntimeTestCase):
    def setUp(self):
        self.store = ArtifactStore()
        self.addCleanup(self.store.close)
        self.cache = tempfile.mkdtemp(prefix="fluksio-cache-")
        self.addCleanup(shutil.rmtree, self.cache, True)

    def env(self, **extra):
        env = self.store.env()
        env["FLUKSIO_ARTIFACT_CACHE"] = self.cache
        env.update(extra)
        return env

    def save(self, text="hello artifacts", **env):
        answer, events, _ = self.run_call(run_request(SAVE_BYTES, "save", {"text": text}), env=self.env(**env))
        return answer, events

    def load(self, ref, **env):
        answer, events, _ = self.run_call(run_request(LOAD, "load", {"blob": ref}), env=self.env(**env))
        return answer, events


class RoundTrip(ArtifactCase):
    def test_save_then_load(self):
        answer, _ = self.save()
        self.assertOk(answer)
        ref = answer["outputs"]["blob"]
        digest = "sha256:" + hashlib.sha256(b"hello artifacts").hexdigest()
        self.assertEqual(ref["digest"], digest)
        self.assertEqual((ref["name"], ref["size"], ref["media_type"]), ("notes.txt", 15, "text/plain"))
        self.assertEqual(self.store.read(digest), b"hello artifacts")
        method, path, headers = self.store.requests[0]
        self.assertEqual((method, path), ("PUT", "/api/v1/artifacts/" + digest))
        self.assertEqual(headers["Authorization"], "Bearer " + TOKEN)
        self.assertEqual(headers["X-Artifact-Name"], "notes.txt")
        self.assertEqual(headers["Content-Type"], "text/plain")
        self.assertEqual(headers["Content-Length"], "15")

        answer, _ = self.load(ref)
        self.assertOk(answer)
        self.assertEqual(answer["outputs"]["text"], "hello artifacts")
        self.assertTrue(answer["outputs"]["path"].startswith(self.cache))

    def test_load_by_digest_string_and_cache(self):
        digest = self.store.put_bytes(b"cached once")
        answer, _ = self.load({"digest": digest})
        self.assertEqual(answer["outputs"]["text"], "cached once")
        answer, _ = self.load(digest)  # a bare digest works too, and comes from the cache
        self.assertEqual(answer["outputs"]["text"], "cached once")
        self.assertEqual(self.store.count("GET"), 1, "a cached verified file is not fetched again")

    def test_save_a_path_and_the_store_reply_is_kept(self):
        code = source(
            """
            import os, tempfile
            from fluksio import save_artifact
            def f():
                path = os.path.join(tempfile.mkdtemp(), "weights.bin")
                with open(path, "wb") as out:
                    out.write(b"w" * 3000000)
                return {"ref": save_artifact(path)}
            """
        )
        answer, _, _ = self.run_call(run_request(code, "f"), env=self.env())
        self.assertOk(answer)
        ref = answer["outputs"]["ref"]
        self.assertEqual(ref["name"], "weights.bin")
        self.assertEqual(ref["size"], 3000000)
        self.assertEqual(ref["media_type"], "application/octet-stream")
        self.assertIs(ref["stored"], True, "fields the store answers are kept")
        self.assertEqual(self.store.read(ref["digest"]), b"w" * 3000000)

    def test_retries_on_5xx_then_succeeds(self):
        self.store.fail("PUT", 503, "busy", times=2)
        answer, events = self.save()
        self.assertOk(answer)
        self.assertEqual(self.store.count("PUT"), 3)
        self.assertTrue(any("retrying" in line for line in logs(events)), "retries are said on the node's log")
        self.store.fail("GET", 502, "bad gateway", times=1)
        answer, _ = self.load(answer["outputs"]["blob"])
        self.assertEqual(answer["outputs"]["text"], "hello artifacts")

    def test_persistent_5xx_is_an_error(self):
        self.store.fail("PUT", 500, "disk full", times=10)
        answer, _ = self.save()
        self.assertError(answer, "RuntimeError", "500", "disk full", "4 tries")
        self.assertEqual(self.store.count("PUT"), 4)

    def test_4xx_is_not_retried_and_says_what_the_engine_said(self):
        self.store.fail("PUT", 413, "artifact too large for this engine")
        answer, _ = self.save()
        self.assertError(answer, "RuntimeError", "413", "artifact too large for this engine")
        self.assertEqual(self.store.count("PUT"), 1)

    def test_wrong_token(self):
        answer, _ = self.save(FLUKSIO_ARTIFACT_TOKEN="wrong")
        self.assertError(answer, "RuntimeError", "401", "unknown worker token")

    def test_missing_artifact(self):
        answer, _ = self.load({"digest": "sha256:" + "0" * 64})
        self.assertError(answer, "RuntimeError", "404", "no artifact")

    def test_corrupt_bytes_are_refused_and_not_cached(self):
        digest = "sha256:" + hashlib.sha256(b"the real bytes").hexdigest()
        self.store.put_bytes(b"something else", digest=digest)
        answer, _ = self.load({"digest": digest})
        self.assertError(answer, "RuntimeError", digest)
        cached = os.path.join(self.cache, "sha256")
        self.assertEqual([n for n in os.listdir(cached) if not n.startswith(".")], [])
        self.assertEqual([n for n in os.listdir(cached) if not n.endswith(".lock")], [], "no partial file is left")

    def test_store_unreachable(self):
        self.store.close()
        answer, _ = self.save()
        self.assertError(answer, "RuntimeError", "4 tries")

    def test_bad_reference(self):
        answer, _ = self.load({"digest": "md5:abc"})
        self.assertError(answer, "ValueError", "sha256")

    def test_outside_a_call_raises_runtime_error(self):
        code = source(
            """
            import fluksio
            try:
                fluksio.save_artifact(b"at import")
                AT_IMPORT = "no error"
            except RuntimeError as e:
                AT_IMPORT = str(e)
            def f():
                return {"at_import": AT_IMPORT}
            """
        )
        answer, _, _ = self.run_call(run_request(code, "f"), env=self.env())
        self.assertIn("while a node runs", answer["outputs"]["at_import"])
        self.assertEqual(self.store.count("PUT"), 0)


LOAD_DIR = source(
    """
    import hashlib, os, time
    from fluksio import Port, load_artifact, node

    @node(requires=[Port("blob", "artifact")], provides=[Port("path", "str"), Port("sha", "str")])
    def load(*, blob):
        path = load_artifact(blob)
        time.sleep(0.2)  # another call loads meanwhile; this tree must stay
        with open(os.path.join(path, "model", "weights.bin"), "rb") as f:
            return {"path": path, "sha": hashlib.sha256(f.read()).hexdigest()}
    """
)

WEIGHTS = os.urandom(256 << 10)


def directory_archive(members):
    """A directory artifact as save_artifact writes one, with extra members: (TarInfo, data)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"FLUKSIO.directory": "1"}) as tf:
        model = tarfile.TarInfo("model")
        model.type, model.mode = tarfile.DIRTYPE, 0o755
        tf.addfile(model)
        for info, data in members:
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class ParallelLoads(ArtifactCase):
    """Eight calls at once load one saved directory: the fan-out of N evaluations of one model."""

    def load_at_once(self, digest, n=8):
        calls = [self.call(run_request(LOAD_DIR, "load", {"blob": digest}), env=self.env()) for _ in range(n)]
        answers = [c.wait(120)[0] for c in calls]
        for answer in answers:
            self.assertOk(answer)
        self.assertEqual({a["outputs"]["sha"] for a in answers}, {hashlib.sha256(WEIGHTS).hexdigest()})
        self.assertEqual(len({a["outputs"]["path"] for a in answers}), 1, "every call gets the one cached tree")

    def test_eight_calls_load_one_directory_cold_then_warm(self):
        digest = self.store.put_bytes(directory_archive([(tarfile.TarInfo("model/weights.bin"), WEIGHTS)]))
        self.load_at_once(digest)  # cold: nothing cached
        self.assertEqual(self.store.count("GET"), 1, "the archive is fetched once, by the first call")
        self.load_at_once(digest)  # warm
        self.assertEqual(self.store.count("GET"), 1)
        left = [n for n in os.listdir(os.path.join(self.cache, "sha256")) if n.startswith(".") and not n.endswith((".lock", ".use"))]
        self.assertEqual(left, [], "temporary files were left in the cache")


LOAD_AND_TRY_TO_PRUNE = source(
    """
    import fcntl, os
    from fluksio import load_artifact

    def f(digest):
        path = load_artifact(digest)
        use = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".use")
        # What the worker's trim tries (agent/artifacts), on a file of its own.
        fd = os.open(use, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            pruned = True
        except BlockingIOError:
            pruned = False
        finally:
            os.close(fd)
        return {"pruned": pruned, "used": os.stat(use).st_mtime}
    """
)


class InUse(ArtifactCase):
    """What the worker's trim of the cache relies on: a call keeps what it loaded, and each load marks it used."""

    def test_a_load_holds_its_entry_and_marks_it_used(self):
        digest = self.store.put_bytes(b"weights" * 1000)
        answer, _, _ = self.run_call(run_request(LOAD_AND_TRY_TO_PRUNE, "f", {"digest": digest}), env=self.env())
        self.assertOk(answer)
        self.assertFalse(answer["outputs"]["pruned"], "the entry a call loaded could be locked for removal while the call ran")
        use = os.path.join(self.cache, "sha256", "." + digest.split(":", 1)[1] + ".use")
        a_day_ago = os.stat(use).st_mtime - 86400
        os.utime(use, (a_day_ago, a_day_ago))
        answer, _, _ = self.run_call(run_request(LOAD_AND_TRY_TO_PRUNE, "f", {"digest": digest}), env=self.env())
        self.assertOk(answer)
        self.assertGreater(answer["outputs"]["used"], a_day_ago + 3600, "a load from the cache did not mark the entry used")
        self.assertEqual(self.store.count("GET"), 1)
        # Once its call is gone, the entry is the worker's to remove.
        fd = os.open(use, os.O_RDWR)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)

    def test_a_load_after_the_worker_removed_the_entry_fetches_it_again(self):
        digest = self.store.put_bytes(b"gone and back")
        self.assertOk(self.load(digest)[0])
        hexdigest = digest.split(":", 1)[1]
        cache = os.path.join(self.cache, "sha256")
        for name in (hexdigest, hexdigest + ".ok", "." + hexdigest + ".use", "." + hexdigest + ".lock"):
            p = os.path.join(cache, name)
            os.chmod(p, 0o600)
            os.unlink(p)
        answer, _ = self.load(digest)
        self.assertEqual(answer["outputs"]["text"], "gone and back")
        self.assertEqual(self.store.count("GET"), 2)


def _waited_for(path, also=lambda: False, timeout=60.0):
    """Waits until a process waits for a flock on path's file (/proc/locks shows it, '->'), or also() is true.

    Returns whether one waits. Polls the kernel's table: waiting is not
    otherwise observable from outside the waiting process.
    """
    st = os.stat(path)
    key = " %02x:%02x:%d " % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/locks") as f:
            if any("->" in line and key in line for line in f):
                return True
        if also():
            return False
        time.sleep(0.01)
    raise AssertionError("nothing waited for the lock %s in %.0fs" % (path, timeout))


@unittest.skipUnless(os.path.exists("/proc/locks"), "needs /proc/locks to see a process wait for a lock")
class RemovedWhileWaiting(ArtifactCase):
    def test_a_load_waiting_for_an_entry_the_worker_removes_locks_the_new_lock_file(self):
        """The worker removes an entry, lock file last, holding its lock; a load waiting for it must not go on under the old file.

        Went on, it would hold "the" lock of that digest beside a process
        that locked the file now of that name: two fetching, unpacking or
        replacing one entry at once.
        """
        import fcntl

        digest = self.store.put_bytes(b"removed and fetched again")
        self.assertOk(self.load(digest)[0])
        hexdigest = digest.split(":", 1)[1]
        cache = os.path.join(self.cache, "sha256")
        lock = os.path.join(cache, "." + hexdigest + ".lock")
        held = os.open(lock, os.O_RDWR)
        fcntl.flock(held, fcntl.LOCK_EX)  # the worker, about to remove the entry
        call = self.call(run_request(LOAD, "load", {"blob": digest}), env=self.env())
        self.assertTrue(_waited_for(lock))
        for name in (hexdigest, hexdigest + ".ok", "." + hexdigest + ".use", "." + hexdigest + ".lock"):
            try:
                os.unlink(os.path.join(cache, name))
            except FileNotFoundError:
                pass  # a runtime that keeps no use file
        # Another process takes the digest's lock file anew, then the worker lets go of the old one.
        anew = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(anew, fcntl.LOCK_EX)
        os.close(held)
        waits = _waited_for(lock, also=lambda: not call.lines.empty())
        os.close(anew)
        answer, _ = call.wait()
        self.assertTrue(waits, "the load went on under the removed lock file while another process held the new one")
        self.assertOk(answer)
        self.assertEqual(answer["outputs"]["text"], "removed and fetched again")
        self.assertEqual(self.store.count("GET"), 2)


class HostileArchive(ArtifactCase):
    def test_a_sparse_member_is_refused_and_nothing_big_is_written(self):
        # A pax (GNU 1.0) sparse member: 512 bytes of map and 4 KiB of data
        # that claim a 64 MiB file, the rest a hole.
        real = 64 << 20
        sparse_map = ("1\n%d\n4096\n" % (real - 4096)).encode().ljust(512, b"\0")
        info = tarfile.TarInfo("GNUSparseFile.0/weights.bin")
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": "model/weights.bin",
            "GNU.sparse.realsize": str(real),
        }
        archive = directory_archive([(info, sparse_map + b"x" * 4096)])
        self.assertLess(len(archive), 16 << 10)
        digest = self.store.put_bytes(archive)
        answer, _ = self.load(digest)
        self.assertError(answer, "RuntimeError", "not a plain file")
        written = 0
        for root, _, files in os.walk(self.cache):
            written += sum(os.lstat(os.path.join(root, f)).st_blocks * 512 for f in files)
        self.assertLess(written, 1 << 20, "unpacking a %d-byte archive wrote %d bytes" % (len(archive), written))


class BigArtifact(ArtifactCase):
    SIZE = 300 << 20

    def test_300_mib_sparse_file_round_trip_with_small_memory(self):
        # Sparse: no disk or time spent writing it, and the runtime still
        # has to read (hash) and send every byte.
        folder = tempfile.mkdtemp(prefix="fluksio-big-")
        self.addCleanup(shutil.rmtree, folder, True)
        path = os.path.join(folder, "big.bin")
        with open(path, "wb") as f:
            f.truncate(self.SIZE)
        code = source(
            """
            import os, resource
            from fluksio import Port, node, save_artifact, load_artifact

            def peak_mib():
                return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

            @node(requires=[Port("path", "str")], provides=[Port("ref", "artifact"), Port("loaded", "int"), Port("peak_mib", "float")])
            def big(*, path):
                ref = save_artifact(path, media_type="application/x-weights")
                local = load_artifact(ref)
                return {"ref": ref, "loaded": os.path.getsize(local), "peak_mib": peak_mib()}
            """
        )
        answer, _, _ = self.run_call(run_request(code, "big", {"path": path}), env=self.env(), timeout=300)
        self.assertOk(answer)
        out = answer["outputs"]
        expected = hashlib.sha256()
        zeros = bytes(1 << 20)
        for _ in range(self.SIZE >> 20):
            expected.update(zeros)
        self.assertEqual(out["ref"]["digest"], "sha256:" + expected.hexdigest())
        self.assertEqual(out["ref"]["size"], self.SIZE)
        self.assertEqual(out["loaded"], self.SIZE)
        self.assertEqual(os.path.getsize(self.store.path(out["ref"]["digest"])), self.SIZE)
        self.assertLess(out["peak_mib"], 64, "peak RSS %.1f MiB: the file must be streamed, not read into memory" % out["peak_mib"])


FAKE_SDK = source(
    '''
    """A stand-in for the real fluksio package: its own decorator and Port."""
    REAL = True

    class Port:
        def __init__(self, name, type, initial=None, stream=False, item=None):
            self.name, self.type, self.initial, self.stream, self.item = name, type, initial, stream, item

    def node(requires=None, provides=None, timeout=None, cache=True, device=None):
        def decorate(fn):
            fn.real_sdk_saw_it = True
            return fn
        return decorate

    def save_artifact(data, name="", media_type="application/octet-stream"):
        raise RuntimeError("the real SDK's own save_artifact ran")

    def load_artifact(ref):
        raise RuntimeError("the real SDK's own load_artifact ran")
    '''
)

USES_REAL_SDK = source(
    """
    import fluksio
    from fluksio import Port, node, save_artifact

    @node(requires=[Port("key", "str")], provides=[Port("loss", "float", stream=True), Port("ref", "artifact"), Port("real", "bool")])
    def train(*, key):
        yield {key: 0.5}
        return {"ref": save_artifact(b"model"), "real": fluksio.REAL and train.real_sdk_saw_it}
    """
)


class RealSDK(ArtifactCase):
    def setUp(self):
        super().setUp()
        self.sdk_dir = tempfile.mkdtemp(prefix="fluksio-sdk-")
        self.addCleanup(shutil.rmtree, self.sdk_dir, True)
        os.makedirs(os.path.join(self.sdk_dir, "fluksio"))
        with open(os.path.join(self.sdk_dir, "fluksio", "__init__.py"), "w") as f:
            f.write(FAKE_SDK)

    def test_node_code_gets_the_real_sdk_with_artifacts_bound(self):
        answer, events, _ = self.run_call(run_request(USES_REAL_SDK, "train", {"key": "loss"}), env=self.env(PYTHONPATH=self.sdk_dir))
        self.assertOk(answer)
        self.assertIs(answer["outputs"]["real"], True)
        self.assertEqual(self.store.read(answer["outputs"]["ref"]["digest"]), b"model")
        self.assertEqual([e["values"] for e in events if e["event"] == "stream"], [{"loss": 0.5}])

    def test_ports_declared_through_the_real_sdk_are_enforced(self):
        answer, _, _ = self.run_call(run_request(USES_REAL_SDK, "train", {"key": "acc"}), env=self.env(PYTHONPATH=self.sdk_dir))
        self.assertError(answer, "ValueError", "'acc'", "undeclared")

    def test_compile_with_the_real_sdk(self):
        answer, _, _ = self.run_call(compile_request(USES_REAL_SDK), env=self.env(PYTHONPATH=self.sdk_dir))
        self.assertOk(answer)
        self.assertEqual([p["name"] for p in answer["nodes"][0]["provides"]], ["loss", "ref", "real"])


if __name__ == "__main__":
    import unittest

    unittest.main()
