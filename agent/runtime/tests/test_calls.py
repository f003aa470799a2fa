"""Calling nodes: shapes, arguments, streams, outputs and their validation."""

import os
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import RuntimeTestCase, logs, run_request, streams  # noqa: E402

HEADER = "from fluksio import Port, node\n"


def with_node(decorator, body):
    """Node source: the SDK import, then body with decorator on its last function."""
    lines = textwrap.dedent(body).strip("\n").split("\n")
    last_def = max(i for i, line in enumerate(lines) if line.startswith(("def ", "async def ")))
    lines.insert(last_def, decorator)
    return HEADER + "\n".join(lines) + "\n"


class NodeShapes(RuntimeTestCase):
    def test_plain_node_returns_dict(self):
        code = with_node(
            '@node(requires=[Port("a", "int"), Port("b", "int")], provides=[Port("sum", "int"), Port("text", "str")])',
            """
            def add(*, a, b):
                return {"sum": a + b, "text": "%d+%d" % (a, b)}
            """,
        )
        answer, events, _ = self.run_call(run_request(code, "add", {"a": 2, "b": 3}))
        self.assertOk(answer)
        self.assertEqual(answer, {"call_id": "c1", "ok": True, "outputs": {"sum": 5, "text": "2+3"}})

    def test_bare_value_for_single_output(self):
        code = with_node(
            '@node(requires=[Port("x", "float")], provides=Port("y", "float"))',
            """
            def double(*, x):
                return x * 2
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "double", {"x": 1.5}))
        self.assertEqual(answer["outputs"], {"y": 3.0})

    def test_single_json_output_returned_bare_dict(self):
        code = with_node(
            '@node(provides=[Port("report", "json")])',
            """
            def report():
                return {"acc": 0.9, "per_class": [0.8, 1.0]}
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "report"))
        self.assertEqual(answer["outputs"], {"report": {"acc": 0.9, "per_class": [0.8, 1.0]}})

    def test_settings_and_rest(self):
        code = with_node(
            '@node(requires=[Port("n", "int")], provides=[Port("out", "json")])',
            """
            def f(*, n, scale=10, mode="fast", **rest):
                return {"out": {"n": n, "scale": scale, "mode": mode, "rest": sorted(rest)}}
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "f", {"n": 1, "extra": True}, {"scale": 3}))
        self.assertEqual(answer["outputs"]["out"], {"n": 1, "scale": 3, "mode": "fast", "rest": ["extra"]})

    def test_initial_used_when_input_missing(self):
        code = with_node(
            '@node(requires=[Port("steps", "int", initial=7), Port("name", "str", initial="x")], provides=Port("out", "str"))',
            """
            def f(*, steps, name):
                return "%s:%d" % (name, steps)
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "f", {"name": "given"}))
        self.assertEqual(answer["outputs"], {"out": "given:7"})

    def test_missing_input_is_a_type_error(self):
        code = with_node(
            '@node(requires=[Port("a", "int")], provides=Port("out", "int"))',
            """
            def f(*, a):
                return a
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "TypeError", "'a'")

    def test_undecorated_function_returning_dict(self):
        answer, _, _ = self.run_call(run_request("def f(x):\n    return {'x2': x * 2}\n", "f", {"x": 4}))
        self.assertEqual(answer["outputs"], {"x2": 8})

    def test_real_numbers_from_other_types_are_accepted(self):
        code = with_node(
            '@node(provides=[Port("f", "float"), Port("i", "int"), Port("l", "list", item="float")])',
            """
            from fractions import Fraction
            def f():
                return {"f": Fraction(1, 4), "i": 3, "l": (1, 2.5)}
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertEqual(answer["outputs"], {"f": 0.25, "i": 3, "l": [1.0, 2.5]})

    def test_async_node(self):
        code = with_node(
            '@node(provides=Port("out", "int"))',
            """
            import asyncio
            async def f():
                await asyncio.sleep(0.01)
                return 5
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(answer["outputs"], {"out": 5})

    def test_large_request(self):
        code = "def f(blob):\n    return {'n': len(blob)}\n"
        answer, _, _ = self.run_call(run_request(code, "f", {"blob": "x" * (20 << 20)}))
        self.assertEqual(answer["outputs"], {"n": 20 << 20})

    def test_module_node(self):
        pkg = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(pkg, True))
        os.makedirs(os.path.join(pkg, "mypipes"))
        open(os.path.join(pkg, "mypipes", "__init__.py"), "w").close()
        with open(os.path.join(pkg, "mypipes", "steps.py"), "w") as f:
            f.write(with_node('@node(provides=Port("out", "str"))', "def hello(*, who='world'):\n    return 'hello ' + who\n"))
        request = {"op": "run", "call_id": "m1", "node": {"module": "mypipes.steps"}, "function": "hello", "inputs": {}, "settings": {"who": "x"}}
        answer, _, _ = self.run_call(request, env={"PYTHONPATH": pkg})
        self.assertEqual(answer, {"call_id": "m1", "ok": True, "outputs": {"out": "hello x"}})


GEN = '@node(requires=[Port("steps", "int", initial=3)], provides=[Port("loss", "float", stream=True), Port("step", "int", stream=True), Port("final", "float")])'


class Streams(RuntimeTestCase):
    def test_streams_in_order_and_partial(self):
        code = with_node(
            GEN,
            """
            def train(*, steps):
                for i in range(steps):
                    yield {"step": i}
                    yield {"loss": 1.0 / (i + 1), "step": i}
                return {"final": 0.25}
            """,
        )
        answer, events, _ = self.run_call(run_request(code, "train", {"steps": 3}))
        self.assertOk(answer)
        self.assertEqual(
            streams(events),
            [{"step": 0}, {"loss": 1.0, "step": 0}, {"step": 1}, {"loss": 0.5, "step": 1}, {"step": 2}, {"loss": 1 / 3, "step": 2}],
        )
        self.assertEqual(answer["outputs"], {"final": 0.25})

    def test_first_event_arrives_before_the_call_ends(self):
        code = with_node(
            GEN,
            """
            import time
            def train(*, steps):
                yield {"loss": 1.0}
                time.sleep(3)
                return {"final": 0.5}
            """,
        )
        c = self.call(run_request(code, "train"))
        at, first = c.next(timeout=20)
        self.assertEqual(first["event"], "stream")
        answer, _ = c.wait()
        self.assertOk(answer)
        self.assertGreater(c.answer_at - at, 2.0, "the stream event was held back until the end")

    def test_prints_before_a_yield_arrive_before_it(self):
        code = with_node(
            GEN,
            """
            import os
            def train(*, steps):
                for i in range(steps):
                    print("before", i)
                    os.write(2, b"raw %d\\n" % i)
                    yield {"step": i}
                return {"final": 0.0}
            """,
        )
        answer, events, _ = self.run_call(run_request(code, "train"))
        self.assertOk(answer)
        order = [e["line"] if e["event"] == "log" else "yield %d" % e["values"]["step"] for e in events]
        for i in range(3):
            self.assertLess(order.index("before %d" % i), order.index("yield %d" % i))
            self.assertLess(order.index("raw %d" % i), order.index("yield %d" % i))

    def test_generator_without_return_and_no_outputs(self):
        code = with_node(
            '@node(provides=[Port("loss", "float", stream=True)])',
            """
            def train():
                yield {"loss": 0.5}
            """,
        )
        answer, events, _ = self.run_call(run_request(code, "train"))
        self.assertEqual(answer, {"call_id": "c1", "ok": True, "outputs": {}})
        self.assertEqual(streams(events), [{"loss": 0.5}])

    def test_async_generator(self):
        code = with_node(
            '@node(provides=[Port("loss", "float", stream=True)])',
            """
            async def train():
                for i in range(2):
                    yield {"loss": float(i)}
            """,
        )
        answer, events, _ = self.run_call(run_request(code, "train"))
        self.assertOk(answer)
        self.assertEqual(streams(events), [{"loss": 0.0}, {"loss": 1.0}])


class ShippedFile(RuntimeTestCase):
    def test_shipped_source_is_a_real_file_that_its_code_names(self):
        # What tools that look for a function's file do: inspect's, and
        # numba's cache=True locators (os.path.exists on inspect.getfile).
        code = (
            "import inspect, os, sys\n"
            "\n"
            "def f():\n"
            "    path = inspect.getsourcefile(f)\n"
            "    with open(inspect.getfile(f)) as src:\n"
            "        text = src.read()\n"
            "    return {'abs': os.path.isabs(path), 'same': path == f.__code__.co_filename == sys.modules[f.__module__].__file__,\n"
            "            'text': text, 'lines': inspect.getsourcelines(f)[1]}\n"
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertEqual(answer["outputs"], {"abs": True, "same": True, "text": code, "lines": 3})

    def test_tracebacks_and_messages_name_the_engines_file(self):
        answer, _, _ = self.run_call(run_request("def f():\n    return 1 / 0\n", "f"))
        err = self.assertError(answer, "ZeroDivisionError")
        self.assertIn('File "pipeline.py", line 2, in f', err["traceback"])
        answer, _, _ = self.run_call(run_request("x = 1 / 0\n", "f"))
        err = self.assertError(answer, "ZeroDivisionError", "pipeline.py, line 1")


class Validation(RuntimeTestCase):
    """Every refusal names the port and what is wrong with the value."""

    def yield_error(self, value, *fragments, kind="ValueError", ports=GEN):
        code = with_node(ports, "def train(*, steps):\n    yield {'step': 1}\n    yield %s\n    return {'final': 0.0}\n" % value)
        answer, events, _ = self.run_call(run_request(code, "train"))
        err = self.assertError(answer, kind, *fragments)
        self.assertEqual(streams(events), [{"step": 1}], "the good yield went out, the bad one did not")
        self.assertIn('pipeline.py", line 5, in train', err["traceback"], "the traceback points at the yield")
        return err

    def test_undeclared_stream_key(self):
        self.yield_error("{'acc': 0.5}", "'acc'", "undeclared", "loss")

    def test_output_port_yielded(self):
        self.yield_error("{'final': 0.5}", "'final'", "not a stream port")

    def test_nan_on_float_port(self):
        self.yield_error("{'loss': float('nan')}", "'loss'", "nan")

    def test_infinity_on_float_port(self):
        self.yield_error("{'loss': float('-inf')}", "'loss'", "inf")

    def test_none_on_float_port(self):
        self.yield_error("{'loss': None}", "'loss'", "None", kind="TypeError")

    def test_string_on_float_port(self):
        self.yield_error("{'loss': '0.5'}", "'loss'", "str", kind="TypeError")

    def test_bool_is_not_an_int(self):
        self.yield_error("{'step': True}", "'step'", "bool", kind="TypeError")

    def test_float_is_not_an_int(self):
        self.yield_error("{'step': 2.0}", "'step'", "float", kind="TypeError")

    def test_yield_must_be_a_dict(self):
        self.yield_error("[0.5]", "yielded", "list", kind="TypeError")

    def test_json_port_refuses_nested_non_finite(self):
        code = with_node(
            '@node(provides=[Port("cfg", "json")])',
            "def f():\n    return {'cfg': {'a': [1, {'b': float('inf')}]}}\n",
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "ValueError", "port 'cfg'['a'][1]['b']", "inf")

    def test_json_port_refuses_objects(self):
        code = with_node(
            '@node(provides=[Port("cfg", "json")])',
            "class Model:\n    pass\ndef f():\n    return {'cfg': {'model': Model()}}\n",
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "TypeError", "'cfg'", "Model", "JSON")

    def test_json_port_refuses_non_string_keys(self):
        code = with_node('@node(provides=[Port("cfg", "json")])', "def f():\n    return {'cfg': {1: 2}}\n")
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "TypeError", "'cfg'", "keys must be strings")

    def test_list_item_type(self):
        code = with_node('@node(provides=[Port("names", "list", item="str")])', "def f():\n    return ['a', 2]\n")
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "TypeError", "port 'names'[1]", "str")

    def test_missing_output(self):
        code = with_node('@node(provides=[Port("a", "int"), Port("b", "int")])', "def f():\n    return {'a': 1}\n")
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "ValueError", "'b'")

    def test_undeclared_output(self):
        code = with_node('@node(provides=[Port("a", "int"), Port("b", "int")])', "def f():\n    return {'a': 1, 'b': 2, 'c': 3}\n")
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "ValueError", "'c'", "undeclared")

    def test_stream_port_returned(self):
        code = with_node(GEN, "def train(*, steps):\n    yield {'step': 0}\n    return {'final': 1.0, 'loss': 0.1}\n")
        answer, _, _ = self.run_call(run_request(code, "train"))
        self.assertError(answer, "ValueError", "'loss'", "stream port")

    def test_several_outputs_need_a_dict(self):
        code = with_node('@node(provides=[Port("a", "int"), Port("b", "int")])', "def f():\n    return 3\n")
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "TypeError", "a, b", "dict")

    def test_nan_output(self):
        code = with_node('@node(provides=Port("score", "float"))', "def f():\n    return float('nan')\n")
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "ValueError", "'score'", "nan")

    def test_bad_artifact_value(self):
        code = with_node('@node(provides=Port("model", "artifact"))', "def f():\n    return '/tmp/model.bin'\n")
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "TypeError", "'model'", "save_artifact")


class Errors(RuntimeTestCase):
    def test_exception_in_node(self):
        code = with_node(
            '@node(provides=Port("out", "int"))',
            """
            def helper(x):
                return 1 / x
            def f():
                return helper(0)
            """,
        )
        answer, _, _ = self.run_call(run_request(code, "f"))
        err = self.assertError(answer, "ZeroDivisionError", "division by zero")
        self.assertEqual(err["short"], "ZeroDivisionError: " + err["message"])
        tb = err["traceback"]
        self.assertTrue(tb.startswith("Traceback (most recent call last):"), tb)
        self.assertIn('File "pipeline.py", line 6, in f', tb)
        self.assertIn('File "pipeline.py", line 3, in helper', tb)
        self.assertIn("return 1 / x", tb, "the source lines are shown")

    def test_chained_exception_is_trimmed_too(self):
        code = "def f():\n    try:\n        {}['k']\n    except KeyError as e:\n        raise RuntimeError('wrapped') from e\n"
        answer, _, _ = self.run_call(run_request(code, "f"))
        err = self.assertError(answer, "RuntimeError", "wrapped")
        self.assertIn("KeyError", err["traceback"])

    def test_exception_in_generator_after_yields(self):
        code = with_node(GEN, "def train(*, steps):\n    yield {'step': 0}\n    raise ValueError('diverged at step 1')\n")
        answer, events, _ = self.run_call(run_request(code, "train"))
        self.assertError(answer, "ValueError", "diverged")
        self.assertEqual(streams(events), [{"step": 0}])

    def test_system_exit(self):
        answer, _, _ = self.run_call(run_request("import sys\ndef f():\n    sys.exit(3)\n", "f"))
        self.assertError(answer, "SystemExit", "sys.exit(3)")

    def test_keyboard_interrupt(self):
        answer, _, _ = self.run_call(run_request("def f():\n    raise KeyboardInterrupt\n", "f"))
        self.assertError(answer, "KeyboardInterrupt")

    def test_import_time_exception_names_the_line(self):
        answer, _, _ = self.run_call(run_request("x = 1\ny = x / 0\ndef f():\n    pass\n", "f"))
        self.assertError(answer, "ZeroDivisionError", "pipeline.py, line 2")

    def test_missing_module(self):
        answer, _, _ = self.run_call(run_request("import os\nimport no_such_module_here\ndef f():\n    pass\n", "f"))
        err = self.assertError(answer, "ModuleNotFoundError", "no_such_module_here", "line 2")
        self.assertIn('pipeline.py", line 2', err["traceback"])

    def test_syntax_error(self):
        answer, _, _ = self.run_call(run_request("def f(:\n    pass\n", "f"))
        self.assertError(answer, "SyntaxError", "line 1")

    def test_missing_function(self):
        # Named as the engine gave the file, with what it does define: not
        # the call's copy of the file, nor what it imports.
        code = "from os import getcwd\nimport json\nX = 1\ndef hello():\n    pass\ndef _helper():\n    pass\ndef count():\n    pass\n"
        answer, _, _ = self.run_call(run_request(code, "helo", filename="mynode.py"))
        err = self.assertError(answer, "AttributeError")
        self.assertEqual(err["message"], "mynode.py has no function 'helo' (it defines hello, count)")
        answer, _, _ = self.run_call(run_request("X = 1\n", "g"))
        self.assertEqual(answer["error"]["message"], "pipeline.py has no function 'g' (it defines no functions)")

    def test_missing_node_module(self):
        request = {"op": "run", "call_id": "c1", "node": {"module": "no_such_pkg.steps"}, "function": "f"}
        answer, _, _ = self.run_call(request)
        self.assertError(answer, "ModuleNotFoundError", "no_such_pkg")

    def test_request_not_json(self):
        answer, _, _ = self.run_call({"call_id": ""}, raw_request=b"this is not json\n")
        self.assertError(answer, "BadRequest", "not JSON")

    def test_unknown_op(self):
        answer, _, _ = self.run_call({"op": "dance", "call_id": "c9"})
        self.assertError(answer, "BadRequest", "dance")

    def test_request_without_node(self):
        answer, _, _ = self.run_call({"op": "run", "call_id": "c2", "function": "f"})
        self.assertError(answer, "BadRequest", "node")

    def test_unprintable_exception(self):
        code = "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\ndef f():\n    raise Odd()\n"
        answer, _, _ = self.run_call(run_request(code, "f"))
        self.assertError(answer, "Odd", "unprintable")

    def test_stdin_is_not_the_requests(self):
        answer, _, _ = self.run_call(run_request("def f():\n    try:\n        input()\n    except EOFError:\n        return {'eof': True}\n", "f"))
        self.assertEqual(answer["outputs"], {"eof": True})

    def test_non_daemon_thread_does_not_hold_the_call(self):
        code = "import threading, time\ndef f():\n    threading.Thread(target=time.sleep, args=(60,)).start()\n    return {'ok': 1}\n"
        c = self.call(run_request(code, "f"))
        _, answer = c.next(timeout=20)
        self.assertEqual(answer["outputs"], {"ok": 1})
        self.assertEqual(c.proc.wait(10), 0, "the runtime exits by itself after answering")


class Logs(RuntimeTestCase):
    def test_logging_and_print_become_log_events(self):
        code = "import logging, sys\ndef f():\n    logging.basicConfig(level=logging.INFO)\n    logging.info('from logging')\n    print('from print')\n    print('to stderr', file=sys.stderr)\n    return {}\n"
        answer, events, c = self.run_call(run_request(code, "f"))
        self.assertOk(answer)
        self.assertIn("from print", logs(events, "stdout"))
        self.assertIn("INFO:root:from logging", logs(events, "stderr"))
        self.assertIn("to stderr", logs(events, "stderr"))
        self.assertIn("from print", c.stderr(), "also echoed on the runner's stderr")


if __name__ == "__main__":
    import unittest

    unittest.main()
