"""Example Fluksio nodes, the shape real pipelines use.

`train` is a generator node: it streams its loss and learning rate while it
runs, saves the model as an artifact and returns a summary. `evaluate` loads
that artifact back. `fluksio-worker selftest` runs both through the embedded
runtime; they only need the standard library.
"""

import json
import math
import time

import fluksio
from fluksio import Port, node


@node(
    requires=[Port("steps", "int", initial=5), Port("lr", "float", initial=0.3)],
    provides=[
        Port("loss", "float", stream=True),
        Port("lr_now", "float", stream=True),
        Port("model", "artifact"),
        Port("final", "json"),
    ],
    timeout=120,
    device="cpu",
)
def train(*, steps, lr, delay=0.2, target=3.0, **rest):
    """Fits one weight to `target` by gradient descent, one step per yield."""
    weight = 0.0
    loss = float("nan")
    for step in range(1, steps + 1):
        lr_now = lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / steps))  # cosine decay
        weight -= lr_now * 2 * (weight - target)
        loss = (weight - target) ** 2
        print("step %d/%d loss=%.6f" % (step, steps, loss), flush=True)
        yield {"loss": loss}  # partial yields are fine: one port at a time
        yield {"lr_now": lr_now}
        time.sleep(delay)
    blob = json.dumps({"weight": weight, "target": target}).encode()
    model = fluksio.save_artifact(blob, name="model.json", media_type="application/json")
    return {"model": model, "final": {"loss": loss, "weight": weight, "steps": steps}}


@node(requires=[Port("model", "artifact")], provides=Port("weight", "float"))
def evaluate(*, model):
    """Loads the model artifact `train` saved; a single output returned bare."""
    with open(fluksio.load_artifact(model)) as f:
        return json.load(f)["weight"]
