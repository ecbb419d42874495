"""The test harness that runs INSIDE the sandbox (never imported by asyncrl; its source is shipped as a file).

Reads a nonce from stdin, then runs ``/input/solution.py`` and each test of ``/input/tests.json`` in one
namespace, one test at a time under an interval timer, and reports every test on fd 3 as a JSON line
carrying the nonce, so a line the program prints itself is not mistaken for a result.
"""

import json
import os
import signal
import sys

REPORT_FD = 3
MAX_ERROR_CHARS = 300


class TimeLimit(Exception):
    """A test ran past its per-test time."""


def report(nonce: str, index: int, passed: bool, error: str = "") -> None:
    line = json.dumps({"nonce": nonce, "test": index, "passed": passed, "error": error[:MAX_ERROR_CHARS]})
    os.write(REPORT_FD, line.encode() + b"\n")


def describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def on_alarm(signum, frame):
    raise TimeLimit("test timed out")


def main() -> None:
    nonce = sys.stdin.readline().strip()
    per_test_s = float(sys.argv[1])
    with open("/input/tests.json") as f:
        tests = json.load(f)
    with open("/input/solution.py") as f:
        source = f.read()
    namespace = {"__name__": "solution"}
    signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, per_test_s)
        exec(compile(source, "solution.py", "exec"), namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as err:  # the program itself failed: every test fails for that reason
        signal.setitimer(signal.ITIMER_REAL, 0)
        for index in range(len(tests)):
            report(nonce, index, False, f"the program raised {describe(err)}")
        return
    for index, test in enumerate(tests):
        try:
            signal.setitimer(signal.ITIMER_REAL, per_test_s)
            exec(compile(test, f"test_{index}", "exec"), namespace)
            signal.setitimer(signal.ITIMER_REAL, 0)
            report(nonce, index, True)
        except BaseException as err:
            signal.setitimer(signal.ITIMER_REAL, 0)
            report(nonce, index, False, describe(err))


if __name__ == "__main__":
    main()
