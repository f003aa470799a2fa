"""compile: the nodes a source defines, or why it does not import here."""

import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import EXAMPLES, RuntimeTestCase, compile_request, source  # noqa: E402

PIPELINE = source(
    """
    import fluksio
    from fluksio import Flow, Port, node, use

    print("importing the pipeline")

    @node(
        requires=[Port("steps", "int", initial=3), Port("lr", "float")],
        provides=[Port("loss", "float", stream=True), Port("model", "artifact"), Port("final", "json")],
        timeout=600,
        device="gpu",
        device_policy="prefer",
    )
    def train(*, steps, lr, seed=0, **rest):
        yield {"loss": 1.0}
        return {"model": None, "final": {}}

    @node(requires=Port("names", "list", item="str"), provides=Port("count", "int"), cache=False)
    def count(*, names):
        return len(names)

    @node
    def bare():
        return {}

    def helper():
        pass

    flow = Flow("demo", nodes=[use(train, steps=5), use(count)])
    flow.connect(train, count)
    """
)


class Compile(RuntimeTestCase):
    def test_nodes_and_digest(self):
        answer, events, _ = self.run_call(compile_request(PIPELINE))
        self.assertOk(answer)
        self.assertEqual(answer["call_id"], "k1")
        self.assertEqual(answer["digest"], "sha256:" + hashlib.sha256(PIPELINE.encode()).hexdigest())
        self.assertEqual(set(answer), {"call_id", "ok", "nodes", "digest"})
        nodes = {n["name"]: n for n in answer["nodes"]}
        self.assertEqual(list(nodes), ["train", "count", "bare"], "definition order, helpers left out")
        self.assertEqual(
            nodes["train"],
            {
                "name": "train",
                "requires": [
                    {"name": "steps", "type": "int", "initial": 3, "stream": False, "item": None},
                    {"name": "lr", "type": "float", "initial": None, "stream": False, "item": None},
                ],
                "provides": [
                    {"name": "loss", "type": "float", "initial": None, "stream": True, "item": None},
                    {"name": "model", "type": "artifact", "initial": None, "stream": False, "item": None},
                    {"name": "final", "type": "json", "initial": None, "stream": False, "item": None},
                ],
                "timeout": 600,
                "device": "gpu",
            },
        )
        self.assertEqual(nodes["count"]["requires"], [{"name": "names", "type": "list", "initial": None, "stream": False, "item": "str"}])
        self.assertEqual(nodes["count"]["provides"][0]["name"], "count")
        self.assertEqual(nodes["bare"], {"name": "bare", "requires": [], "provides": [], "timeout": None, "device": None})
        self.assertIn("importing the pipeline", [e.get("line") for e in events])

    def test_the_example_compiles(self):
        with open(os.path.join(EXAMPLES, "train.py")) as f:
            code = f.read()
        answer, _, _ = self.run_call(compile_request(code, filename="train.py"))
        self.assertOk(answer)
        self.assertEqual([n["name"] for n in answer["nodes"]], ["train", "evaluate"])

    def test_syntax_error_names_the_line(self):
        code = "from fluksio import node\n\n@node()\ndef f(:\n    pass\n"
        answer, _, _ = self.run_call(compile_request(code))
        err = self.assertError(answer, "SyntaxError", "line 4", "pipeline.py")
        self.assertIn("def f(:", err["traceback"])

    def test_indentation_error(self):
        answer, _, _ = self.run_call(compile_request("def f():\nreturn 1\n"))
        self.assertError(answer, "IndentationError", "line 2")

    def test_missing_import_names_the_line(self):
        code = "import json\n\nfrom torch_not_here import nn\n"
        answer, _, _ = self.run_call(compile_request(code))
        self.assertError(answer, "ModuleNotFoundError", "torch_not_here", "pipeline.py, line 3")

    def test_import_error_of_a_name(self):
        answer, _, _ = self.run_call(compile_request("from os import no_such_name\n"))
        self.assertError(answer, "ImportError", "no_such_name", "line 1")

    def test_a_node_file_named_like_a_stdlib_module(self):
        code = "import json\nfrom fluksio import node\n@node\ndef f():\n    return json.dumps({})\n"
        answer, _, _ = self.run_call(compile_request(code, filename="json.py"))
        self.assertOk(answer)

    def test_module_node(self):
        answer, _, _ = self.run_call({"op": "compile", "call_id": "k2", "node": {"module": "json"}})
        self.assertOk(answer)
        self.assertEqual(answer["nodes"], [])
        self.assertTrue(answer["digest"].startswith("sha256:"))


if __name__ == "__main__":
    import unittest

    unittest.main()
