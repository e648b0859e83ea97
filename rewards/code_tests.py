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
from typing import Any

from envs.sandbox import SandboxLimits, run_many

_TAGS = frozenset(("", "python3", "python", "py"))  # what may follow ``` on the line that opens a block (any case)
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
    whole completion when it has none.

    A scanner without regular expressions, linear in the completion's length: it runs in the trainer on whatever
    the model wrote, outside every sandbox limit (the regex it replaced backtracked quadratically on a fence
    followed by a long run of blanks). An opening fence is the last ``` on its line followed only by blanks, an
    optional tag and the newline (an earlier ``` on the line has a backtick after it); the block runs to the
    next ```. Each line is looked at once outside blocks, each block's text once."""
    text, find = completion, completion.find
    body = end = -1
    pos = 0
    while (fence := find("```", pos)) >= 0 and (newline := find("\n", fence)) >= 0:
        if text[text.rfind("```", fence, newline) + 3 : newline].strip(" \t").lower() not in _TAGS:
            pos = newline + 1  # no block opens on this line
            continue
        body, end = newline + 1, find("```", newline + 1)
        if end < 0:
            return text[body:]
        pos = end + 3
    return completion if body < 0 else text[body:end]


def same_value(got: Any, want: Any) -> bool:
    """Decoded JSON values equal: same kind (a bool never equals a number), integers exactly, floats within 1e-6
    relative (an integer too large for a float, NaN or an infinity is simply unequal to a float, never an error)."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if type(want) is int and type(got) is int:
        return got == want
    if isinstance(want, int | float) and isinstance(got, int | float):
        try:
            return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
        except OverflowError:
            return False
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def parse_results(stdout: str, n: int) -> dict[int, Any]:
    """index -> reported value (the first report of each index; a test that raised reports nothing usable).

    Any line a program can print is either a report or ignored: malformed JSON, nesting deep enough to exhaust the
    parser's recursion, integers past Python's digit limit and the like are skipped, never raised."""
    out: dict[int, Any] = {}
    for line in stdout.split("\n"):
        if not line.startswith(MARK):
            continue
        try:
            rec = json.loads(line[len(MARK) :])
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, list) and len(rec) == 2 and type(rec[0]) is int and 0 <= rec[0] < n and rec[0] not in out:
            out[rec[0]] = rec[1]
    return out


def score_output(stdout: str, want: list[Any]) -> tuple[float, str]:
    """(pass fraction, reason) of a program's output against the expected values (as JSON gives them back)."""
    got = parse_results(stdout, len(want))
    passed = 0
    for i, w in enumerate(want):
        try:
            passed += i in got and same_value(got[i], w)
        except RecursionError:  # a reported value nested past the interpreter's depth: not a pass
            pass
    if not got:
        return 0.0, "no result reported"
    return passed / len(want), f"{passed}/{len(want)} tests passed"


def _cases(meta: Any) -> tuple[str, list[Any]] | None:
    """(the program's stdin, the expected values as JSON gives them back) when the item carries well-formed tests
    (an entry point, inputs as argument lists, outputs, all JSON data), else None."""
    if not isinstance(meta, dict):
        return None
    entry, cases = meta.get("entry_point"), meta.get("tests")
    if not isinstance(entry, str) or not isinstance(cases, list) or not cases:
        return None
    if not all(isinstance(c, dict) and isinstance(c.get("input"), list | tuple) and "output" in c for c in cases):
        return None
    try:
        stdin = json.dumps([entry, [c["input"] for c in cases]]) + "\n"
        # tuples become lists and dict keys strings, as in what the harness reports
        want = [json.loads(json.dumps(c["output"])) for c in cases]
    except (TypeError, ValueError, RecursionError):
        return None
    return stdin, want


class CodeTestsReward:
    """Pass fraction (0..1) of each item's tests, each completion's program run in the sandbox.

    limits: the sandbox config (`${sandbox}`, the fields of envs.sandbox.SandboxLimits, or that object itself);
    `limits.workers` programs run at once. Every program output yields a score (0 when it reports nothing usable)
    and `reasons` says why, per completion of the last call; nothing a program prints can raise here.
    """

    check_suite = "code"  # python -m rewards.check judges it with the code suite (rl/tools/reward_check_code.py)

    def __init__(self, limits: dict[str, Any] | SandboxLimits | None = None):
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits(**dict(limits or {}))
        self.errors = self.timeouts = 0
        self.reasons: list[str] = []  # why each completion of the last call scored what it did
        self._seconds: list[float] = []

    @property
    def workers(self) -> int:
        return self.limits.workers

    def __call__(
        self, completions: list[str], *, answer: list[Any] | None = None, metadata: list[dict], **kwargs
    ) -> list[float]:
        jobs, tests, scores = [], [], [0.0] * len(completions)
        self.reasons = ["item has no tests"] * len(completions)
        for k, (text, meta) in enumerate(zip(completions, metadata)):
            found = _cases(meta)
            if found is None:
                self.errors += 1  # no usable tests: a data problem, counted, never a crash
                continue
            stdin, want = found
            jobs.append((_HARNESS.format(code=extract_code(str(text)), mark=MARK), stdin))
            tests.append((k, want))
        for (k, want), res in zip(tests, run_many(jobs, self.limits, self.limits.workers)):
            self._seconds.append(res.seconds)
            self.timeouts += res.timed_out
            if res.error and res.error.startswith("sandbox"):
                self.errors += 1
            scores[k], why = score_output(res.stdout, want)
            self.reasons[k] = f"{why} ({res.error})" if res.error else why
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
