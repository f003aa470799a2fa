"""Reads `go test -json` on stdin and prints one line per top-level test as
it ends, so that a long run shows where it is and a timeout where it was.

Passed tests: their `--- PASS` line. Skipped ones: their `--- SKIP` line
with the reason the test gave. Failed ones: everything they printed, as
`go test -v` would show it. Everything that belongs to no test is printed
as it comes: the `ok` and `FAIL` lines of each package and build errors.
When a package fails, what its unfinished tests printed comes before its
`FAIL` line: a test binary's timeout panic, which names the tests still
running, is there. The exit
status is go test's own (the pipeline's, under `set -o pipefail`).

Used by test/all.sh; Python 3 from the standard library, as CI has it.
"""

import json
import sys


def main():
    held = {}  # (package, top-level test) -> lines it printed, until it ends
    for raw in sys.stdin:
        try:
            event = json.loads(raw)
        except ValueError:
            sys.stdout.write(raw)  # not go test's JSON: pass it on
            continue
        action = event.get("Action")
        package = event.get("Package", "")
        output = event.get("Output", "")
        test = event.get("Test")
        if action in ("build-output", "build-fail") or (action == "output" and not test):
            if output.startswith("FAIL"):
                # The package failed: tests that never ended were running
                # when it did (a timeout's panic is in their output).
                for key in [k for k in held if k[0] == package]:
                    sys.stdout.write("".join(held.pop(key)))
            sys.stdout.write(output)
        elif test:
            key = (package, test.split("/")[0])
            if action == "output":
                held.setdefault(key, []).append(output)
            elif "/" not in test and action in ("pass", "fail", "skip"):
                lines = held.pop(key, [])
                if action == "fail":
                    sys.stdout.write("".join(lines))
                else:
                    ending = [line for line in lines if line.startswith("--- ")]
                    line = ending[-1].rstrip("\n") if ending else "--- %s: %s" % (action.upper(), test)
                    if action == "skip":
                        said = [l.strip() for l in lines if not l.startswith(("---", "==="))]
                        if said:
                            line += ": " + said[-1]
                    sys.stdout.write("%s  (%s)\n" % (line, package))
        else:
            continue
        sys.stdout.flush()


if __name__ == "__main__":
    main()
