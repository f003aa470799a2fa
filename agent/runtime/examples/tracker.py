"""A node that leaves to interpreter exit what a training script leaves to it.

An experiment tracker's atexit handler (held here until the test says the
engine has its answer: the answer must not wait for it), a metrics file
never closed, a buffered logging handler; and a thread that never ends.
"""

import atexit
import logging
import logging.handlers
import os
import threading
import time

from fluksio import Port, node


@node(provides=[Port("done", "bool")])
def train(out):
    global METRICS
    METRICS = open(os.path.join(out, "metrics.csv"), "w")  # never closed, as trackers do
    METRICS.write("epoch,loss\n1,0.5\n")

    def tracker_flush():
        while not os.path.exists(os.path.join(out, "answer-seen")):
            time.sleep(0.01)
        with open(os.path.join(out, "atexit"), "w") as f:
            f.write("ran")
        print("printed at exit")

    atexit.register(tracker_flush)
    buffered = logging.handlers.MemoryHandler(10000, target=logging.FileHandler(os.path.join(out, "run.log")))
    logging.getLogger("train").addHandler(buffered)
    logging.getLogger("train").warning("kept in memory until shutdown")
    return True


@node(provides=[Port("done", "bool")])
def stuck():
    threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon
    return True
