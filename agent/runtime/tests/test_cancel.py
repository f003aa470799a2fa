"""SIGTERM from the agent becomes a NodeCancelled answer, quickly."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import RuntimeTestCase, run_request, source, streams  # noqa: E402


class Cancel(RuntimeTestCase):
    def cancel_after_first_line(self, code, function="train", marker=None):
        """Runs the node, sends SIGTERM to its group after its first line (or
        the log line marker); returns the answer, the events, and how long the
        answer took after the signal."""
        c = self.call(run_request(code, function))
        seen = []
        while True:
            _, line = c.next(timeout=20)
            seen.append(line)
            if marker is None or line.get("line") == marker:
                break
        sent = time.monotonic()
        c.signal_group(signal.SIGTERM)
        answer, events = c.wait(timeout=10)
        return answer, seen + events, time.monotonic() - sent

    def test_sigterm_during_a_generator(self):
        code = source(
            """
            import time
            from fluksio import Port, node

            @node(provides=[Port("loss", "float", stream=True), Port("final", "float")])
            def train():
                for i in range(1000):
                    yield {"loss": 1.0 / (i + 1)}
                    time.sleep(0.5)
                return {"final": 0.0}
            """
        )
        answer, events, took = self.cancel_after_first_line(code)
        err = self.assertError(answer, "NodeCancelled", "cancelled")
        self.assertEqual(err["short"], "NodeCancelled: " + err["message"])
        self.assertLess(took, 1.5)
        self.assertGreaterEqual(len(streams(events)), 1)
        self.assertIn("in train", err["traceback"], "the traceback shows where the node was")

    def test_finally_blocks_run_on_cancel(self):
        code = source(
            """
            import time
            def train():
                try:
                    yield {"loss": 1.0}
                    time.sleep(30)
                finally:
                    print("cleaned up")
            """
        )
        answer, events, took = self.cancel_after_first_line(code)
        self.assertError(answer, "NodeCancelled")
        self.assertIn("cleaned up", [e.get("line") for e in events], answer)

    def test_finally_blocks_run_when_the_cancel_lands_between_yields(self):
        # A generator that yields without pause spends much of its time in
        # the runtime (validating, sending): the cancel lands there, and the
        # generator must still be closed.
        code = source(
            """
            def train():
                try:
                    while True:
                        yield {"loss": 1.0}
                finally:
                    print("cleaned up")
            """
        )
        for _ in range(5):
            answer, events, took = self.cancel_after_first_line(code)
            self.assertError(answer, "NodeCancelled")
            self.assertIn("cleaned up", [e.get("line") for e in events], answer)

    def test_node_that_swallows_the_cancel_is_answered_anyway(self):
        code = source(
            """
            import time
            def train():
                yield {"loss": 1.0}
                while True:
                    try:
                        print("swallowing", flush=True)
                        time.sleep(30)
                    except BaseException:
                        pass
            """
        )
        answer, _, took = self.cancel_after_first_line(code, marker="swallowing")
        self.assertError(answer, "NodeCancelled", "did not stop in time")
        self.assertLess(took, 3.0, "answered before the agent's SIGKILL")

    def test_cancel_while_blocked_in_c(self):
        code = source(
            """
            import ctypes
            def train():
                yield {"loss": 1.0}
                ctypes.CDLL(None).sleep(30)  # plain C: the signal interrupts it
            """
        )
        answer, _, took = self.cancel_after_first_line(code)
        self.assertError(answer, "NodeCancelled")
        self.assertLess(took, 3.0)

    def test_cancel_while_sending_an_event_is_not_lost_by_a_stubborn_generator(self):
        code = source(
            """
            def train():
                while True:
                    try:
                        yield {"loss": 1.0}
                    except BaseException:
                        pass
            """
        )
        answer, _, took = self.cancel_after_first_line(code)
        self.assertError(answer, "NodeCancelled")
        self.assertLess(took, 3.0)

    def test_cancel_during_import(self):
        code = "import time\nprint('importing', flush=True)\ntime.sleep(30)\ndef f():\n    pass\n"
        answer, _, took = self.cancel_after_first_line(code, "f")
        self.assertError(answer, "NodeCancelled")


if __name__ == "__main__":
    import unittest

    unittest.main()
