"""Unit-test reward for model-written code: the pass fraction of the item's tests, run in the sandbox.

Tests per item (envs/code_tasks.py writes them; any env may): `metadata["entry_point"]` names the function and
`metadata["tests"]` is a list of `{"input": [positional args...], "output": expected}` with JSON values.

Why it cannot be faked from inside the program: only the inputs enter the sandbox. A fixed harness defines the
program's code in a fresh namespace, calls the entry point on each input and prints each return value as JSON on
a marked line; this process parses those lines and compares the decoded plain values (numbers, strings, lists,
dicts, bools, null; floats with a small tolerance, bools never equal to numbers) with the expected outputs, which
never leave it. Printing "True", exiting before the tests, patching `assert`/`AssertionError`, returning an object
whose `__eq__` says yes, or rewriting the harness's own functions only changes what is reported; to score, the
reported values must be the right answers to inputs the program did not see. Hostile programs meet the
sandbox's limits (docs/sandbox.md) and score what they reported before they were stopped (usually 0).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from envs.sandbox import SandboxLimits, run_many

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
MARK = "#rlft-result "  # starts each result line the harness prints

_HARNESS = """\
import json as _json, sys as _sys
_write, _flush, _dumps = _sys.stdout.write, _sys.stdout.flush, _json.dumps
_entry, _inputs = _json.loads(_sys.stdin.readline())
_ns = {{"__name__": "solution", "__builtins__": __builtins__}}
exec(compile({code!r}, "solution.py", "exec"), _ns)
_fn = _ns[_entry]
for _i, _args in enumerate(_inputs):
    try:
        _line = _dumps([_i, _fn(*_args)])
    except BaseException as _e:  # a failing test, or a value that is not JSON data
        _line = _dumps([_i, None, type(_e).__name__])
    _write({mark!r} + _line + "\\n")
    _flush()
"""


def extract_code(completion: str) -> str:
    """The last fenced code block (```python, ```py or bare ```; an unclosed last fence runs to the end), or the
    whole completion when it has none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def same_value(got: Any, want: Any) -> bool:
    """Decoded JSON values equal: same kind (a bool never equals a number), floats within 1e-6 relative."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, int | float) and isinstance(got, int | float):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def parse_results(stdout: str, n: int) -> dict[int, Any]:
    """index -> reported value (the first report of each index; a test that raised reports nothing usable)."""
    out: dict[int, Any] = {}
    for line in stdout.split("\n"):
        if not line.startswith(MARK):
            continue
        try:
            rec = json.loads(line[len(MARK) :])
        except ValueError:
            continue
        if isinstance(rec, list) and len(rec) == 2 and type(rec[0]) is int and 0 <= rec[0] < n and rec[0] not in out:
            out[rec[0]] = rec[1]
    return out


class CodeTestsReward:
    """Pass fraction (0..1) of each item's tests, each completion's program run in the sandbox.

    limits: the sandbox config (`${sandbox}`: cpu_s, wall_s, memory_mb, max_procs, max_output_bytes, workers);
    workers programs run at once.
    """

    check_suite = "code"  # rewards/check.py judges it with the code suite (rewards/check_code.py)

    def __init__(self, limits: dict[str, Any] | None = None):
        cfg = dict(limits or {})
        self.workers = int(cfg.pop("workers", 2))
        self.limits = SandboxLimits(**cfg)
        self.errors = self.timeouts = 0
        self._seconds: list[float] = []

    def __call__(
        self, completions: list[str], *, answer: list[Any] | None = None, metadata: list[dict], **kwargs
    ) -> list[float]:
        jobs, tests, scores = [], [], [0.0] * len(completions)
        for k, (text, meta) in enumerate(zip(completions, metadata)):
            cases = (meta or {}).get("tests")
            entry = (meta or {}).get("entry_point")
            if not cases or not isinstance(entry, str):
                self.errors += 1  # the item has no tests: a data problem, counted, never a crash
                continue
            program = _HARNESS.format(code=extract_code(text), mark=MARK)
            stdin = json.dumps([entry, [c["input"] for c in cases]]) + "\n"
            jobs.append((program, stdin))
            tests.append((k, cases))
        for (k, cases), res in zip(tests, run_many(jobs, self.limits, self.workers)):
            self._seconds.append(res.seconds)
            self.timeouts += res.timed_out
            if res.error and res.error.startswith("sandbox"):
                self.errors += 1
            got = parse_results(res.stdout, len(cases))
            # the expected values as JSON gives them back (tuples are lists, dict keys strings), like the reports
            want = [json.loads(json.dumps(c["output"])) for c in cases]
            passed = sum(i in got and same_value(got[i], w) for i, w in enumerate(want))
            scores[k] = passed / len(cases)
        return scores

    def pop_metrics(self) -> dict[str, float]:
        """reward/errors (items without tests, sandbox failures), reward/timeouts (programs past wall_s) and the
        mean seconds per program, since the last call."""
        out = {
            "reward/errors": float(self.errors),
            "reward/timeouts": float(self.timeouts),
            "reward/sandbox_s": sum(self._seconds) / len(self._seconds) if self._seconds else 0.0,
        }
        self.errors = self.timeouts = 0
        self._seconds = []
        return out
