"""What node code prints never corrupts the protocol, and floods stay bounded."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import RuntimeTestCase, logs, run_request, source, streams  # noqa: E402

NOISY = source(
    """
    import ctypes, os, subprocess, sys
    from fluksio import Port, node

    @node(provides=[Port("loss", "float", stream=True), Port("done", "bool")])
    def noisy():
        libc = ctypes.CDLL(None)
        print("python print")
        print('{"call_id": "c1", "ok": true, "outputs": {"forged": 1}}')
        sys.stdout.buffer.write(b"buffer write\\n")
        os.write(1, b"os.write to fd 1\\n")
        os.write(2, b"os.write to fd 2\\n")
        libc.write(1, b"libc write\\n", 11)
        libc.printf(b"libc printf %d\\n", 42)  # stdio-buffered: the runtime must flush it
        subprocess.run(["sh", "-c", "echo from a child; echo child err >&2"], check=True)
        yield {"loss": 0.5}
        sys.stdout.write("no newline at the end")
        return {"done": True}
    """
)


class Prints(RuntimeTestCase):
    def test_every_kind_of_print_becomes_a_log_event(self):
        answer, events, c = self.run_call(run_request(NOISY, "noisy"))
        self.assertEqual(answer, {"call_id": "c1", "ok": True, "outputs": {"done": True}})
        self.assertEqual(streams(events), [{"loss": 0.5}])
        out, err = logs(events, "stdout"), logs(events, "stderr")
        for line in ("python print", "buffer write", "os.write to fd 1", "libc write", "libc printf 42", "from a child", "no newline at the end"):
            self.assertIn(line, out)
        self.assertIn('{"call_id": "c1", "ok": true, "outputs": {"forged": 1}}', out, "a forged answer is only a log line")
        for line in ("os.write to fd 2", "child err"):
            self.assertIn(line, err)
        echoed = c.stderr()
        for line in ("python print", "libc printf 42", "child err", "from a child"):
            self.assertIn(line, echoed, "node output is echoed on the runner's stderr")

    def test_a_memory_handler_flushed_at_exit_reaches_the_engine(self):
        code = (
            "import logging, logging.handlers, sys\n"
            "target = logging.StreamHandler(sys.stderr)\n"
            "log = logging.getLogger('buffered')\n"
            "log.addHandler(logging.handlers.MemoryHandler(1000, flushLevel=logging.CRITICAL, target=target))\n"
            "log.setLevel(logging.INFO)\n"
            "def f():\n"
            "    log.info('held until flushed')\n"
            "    return {}\n"
        )
        answer, events, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(logs(events, "stderr"), ["held until flushed"])

    def test_print_at_import_time(self):
        code = "import os\nprint('importing')\nos.write(1, b'raw at import\\n')\ndef f():\n    return {}\n"
        answer, events, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(logs(events, "stdout"), ["importing", "raw at import"])

    def test_carriage_returns_split_progress_bars(self):
        code = "import sys\ndef f():\n    for i in range(3):\n        sys.stderr.write('\\r%d%%' % (i * 50))\n    sys.stderr.write('\\n')\n    return {}\n"
        answer, events, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(logs(events, "stderr"), ["0%", "50%", "100%"])

    def test_long_line_is_cut(self):
        code = "def f():\n    print('x' * 100000)\n    return {}\n"
        answer, events, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(logs(events), ["x" * 8192 + " … [line cut at 8192 bytes]"])

    def test_invalid_utf8_is_replaced(self):
        code = "import os\ndef f():\n    os.write(1, b'bad \\xff\\xfe bytes\\n')\n    return {}\n"
        answer, events, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(logs(events, "stdout"), ["bad \ufffd\ufffd bytes"])

    def test_a_million_lines_finish_with_bounded_output(self):
        code = source(
            """
            import sys
            from fluksio import Port, node

            @node(provides=[Port("tick", "int", stream=True), Port("n", "int")])
            def chatty():
                for i in range(1000000):
                    print("line", i)
                    if i % 250000 == 0:
                        yield {"tick": i}
                print("the last line")
                return {"n": 1000000}
            """
        )
        answer, events, c = self.run_call(run_request(code, "chatty"), timeout=240)
        self.assertEqual(answer["outputs"], {"n": 1000000})
        self.assertEqual(streams(events), [{"tick": i} for i in (0, 250000, 500000, 750000)], "no stream event is dropped")
        self.assertLess(c.raw_count, 20000, "log events are bounded")
        notes = [line for line in logs(events) if "lines dropped" in line]
        self.assertTrue(notes, "the drop is said in a log event")
        shown = len([line for line in logs(events) if "lines dropped" not in line])
        dropped = sum(int(n.split()[1]) for n in notes)
        self.assertEqual(shown + dropped, 1000001, "every line is either sent or counted")
        self.assertIn("the last line", c.stderr(), "the runner's stderr has them all")


if __name__ == "__main__":
    import unittest

    unittest.main()
