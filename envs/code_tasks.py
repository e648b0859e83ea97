"""Procedural function-writing tasks with unit tests (offline, deterministic by seed), for reward=code_tests.

Each task family is a template with random parameters (a shift, a divisor, a word, ...) and one reference
solution as source text. An item asks for one function in a ```python block and shows one example call (not a test); its
metadata holds the entry point and the tests (`{"input": [args], "output": expected}`; rewards/code_tests.py),
whose expected outputs come from running the reference source on random inputs in this process (our own code,
not the model's). The 14 families and their parameter ranges give over 13,000 distinct tasks (a family with its
parameters): at least 30 per family, poly_value alone about 11,000.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INSTRUCTION = "Answer with the complete function in one ```python code block."


@dataclass(frozen=True)
class Family:
    """name: the function's name; describe(p): the task in words; source(p): the reference solution;
    params(rng): one parameter draw; inputs(rng, p): one test's positional arguments."""

    name: str
    describe: Callable[[dict], str]
    source: Callable[[dict], str]
    params: Callable[[random.Random], dict]
    inputs: Callable[[random.Random, dict], list]


def _ints(rng: random.Random, n: tuple[int, int] = (0, 8), lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(*n))]


def _ordinal(k: int) -> str:
    return f"{k}{'rd' if k == 3 else 'nd' if k == 2 else 'th'}"  # k is 2..7 here


def _word(rng: random.Random, n: tuple[int, int] = (0, 12), alphabet: str = string.ascii_lowercase + " ") -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(*n)))


# pairwise_gaps' operations on the pair (nums[i], nums[i + K]): (in words, as code)
PAIR_OPS = {
    "diff": ("differences nums[i + K] - nums[i]", "nums[i + K] - nums[i]"),
    "sum": ("sums nums[i] + nums[i + K]", "nums[i] + nums[i + K]"),
    "product": ("products nums[i] * nums[i + K]", "nums[i] * nums[i + K]"),
    "max": ("maxima max(nums[i], nums[i + K])", "max(nums[i], nums[i + K])"),
    "absdiff": ("absolute differences abs(nums[i + K] - nums[i])", "abs(nums[i + K] - nums[i])"),
}
WORDS = ["a", "to", "cat", "Cat", "dog", "DOG", "bird", "sun", "Moon", "moon", "tree", "river", "forest", "garden"]

FAMILIES: list[Family] = [
    Family(
        "count_multiples",
        lambda p: f"returns how many numbers in the list `nums` leave the remainder {p['m']} when divided by {p['k']} "
        "(Python's % operator)",
        lambda p: f"def count_multiples(nums):\n    return sum(1 for x in nums if x % {p['k']} == {p['m']})\n",
        lambda r: (lambda k: {"k": k, "m": r.randint(0, k - 1)})(r.randint(2, 13)),
        lambda r, p: [_ints(r)],
    ),
    Family(
        "rotate_left",
        lambda p: f"returns the list `items` rotated left by {p['k']} positions (wrapping around; an empty list stays "
        f"empty), with {p['d']} added to every element",
        lambda p: f"def rotate_left(items):\n    if not items:\n        return []\n    k = {p['k']} % len(items)\n    return [x + {p['d']} for x in items[k:] + items[:k]]\n",
        lambda r: {"k": r.randint(1, 12), "d": r.randint(-9, 9)},
        lambda r, p: [_ints(r)],
    ),
    Family(
        "clip_all",
        lambda p: f"returns a new list with every number of `nums` clipped to the range [{p['lo']}, {p['hi']}]",
        lambda p: f"def clip_all(nums):\n    return [min(max(x, {p['lo']}), {p['hi']}) for x in nums]\n",
        lambda r: (lambda lo: {"lo": lo, "hi": lo + r.randint(1, 15)})(r.randint(-10, 5)),
        lambda r, p: [_ints(r)],
    ),
    Family(
        "digit_power_sum",
        lambda p: f"returns the sum of the digits of the non-negative integer `n` written in base {p['b']}, each digit "
        f"raised to the power {p['e']}",
        lambda p: f"def digit_power_sum(n):\n    total = 0\n    while n:\n        n, d = divmod(n, {p['b']})\n        total += d ** {p['e']}\n    return total\n",
        lambda r: {"b": r.randint(2, 16), "e": r.randint(1, 5)},
        lambda r, p: [r.randint(0, 10**6)],
    ),
    Family(
        "every_kth",
        lambda p: f"returns the string made of every {_ordinal(p['k'])} character of `s`, starting at index {p['o']}"
        + (", reversed" if p["rev"] else ""),
        lambda p: f"def every_kth(s):\n    return s[{p['o']}::{p['k']}]" + ("[::-1]" if p["rev"] else "") + "\n",
        lambda r: {"k": r.randint(2, 7), "o": r.randint(0, 5), "rev": r.random() < 0.5},
        lambda r, p: [_word(r, (0, 20), string.ascii_letters)],
    ),
    Family(
        "shift_letters",
        lambda p: f"returns `s` with every {'letter (a-z and A-Z, keeping its case)' if p['upper'] else 'lowercase letter a-z'} "
        f"shifted {abs(p['k'])} places {'forward' if p['k'] > 0 else 'backward'} in the alphabet (wrapping around); "
        "other characters stay as they are",
        lambda p: "def shift_letters(s):\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n"
        f"            c = chr((ord(c) - 97 + {p['k']}) % 26 + 97)\n"
        + (f"        elif 'A' <= c <= 'Z':\n            c = chr((ord(c) - 65 + {p['k']}) % 26 + 65)\n" if p["upper"] else "")
        + "        out.append(c)\n    return ''.join(out)\n",
        lambda r: {"k": r.choice([k for k in range(-25, 26) if k]), "upper": r.random() < 0.5},
        lambda r, p: [_word(r, (0, 16), string.ascii_lowercase + " !A")],
    ),
    Family(
        "replace_vowels",
        lambda p: f"returns `s` with every {'vowel (a, e, i, o, u, lowercase or uppercase)' if p['both'] else 'lowercase vowel (a, e, i, o, u)'} "
        f"replaced by '{p['c'] * p['n']}'",
        lambda p: f"def replace_vowels(s):\n    return ''.join('{p['c'] * p['n']}' if c in '{'aeiouAEIOU' if p['both'] else 'aeiou'}' else c for c in s)\n",
        lambda r: {"c": r.choice("*#-_+.xz!?@=~^%"), "n": r.randint(1, 3), "both": r.random() < 0.5},
        lambda r, p: [_word(r, (0, 16), string.ascii_letters + " ")],
    ),
    Family(
        "fizz_words",
        lambda p: f"returns a list with one entry for each integer i from 1 to `n`: '{p['wa']}{p['wb']}' when i is "
        f"divisible by both {p['a']} and {p['b']}, '{p['wa']}' when only by {p['a']}, '{p['wb']}' when only by "
        f"{p['b']}, and otherwise i itself (an int)",
        lambda p: f"def fizz_words(n):\n    out = []\n    for i in range(1, n + 1):\n        w = ('{p['wa']}' if i % {p['a']} == 0 else '') + ('{p['wb']}' if i % {p['b']} == 0 else '')\n        out.append(w or i)\n    return out\n",
        lambda r: {
            "a": r.randint(2, 4),
            "b": r.randint(5, 7),
            "wa": r.choice(["Fizz", "Ping", "Foo", "Tic"]),
            "wb": r.choice(["Buzz", "Pong", "Bar", "Tac"]),
        },
        lambda r, p: [r.randint(0, 25)],
    ),
    Family(
        "count_char",
        lambda p: f"returns how many times the character '{p['c']}' occurs in `s`"
        + (", ignoring case" if p["ignore_case"] else " (case-sensitive)"),
        lambda p: f"def count_char(s):\n    return s{'.lower()' if p['ignore_case'] else ''}.count('{p['c']}')\n",
        lambda r: (lambda c, i: {"c": c if i else r.choice([c, c.upper()]), "ignore_case": i})(
            r.choice(string.ascii_lowercase), r.random() < 0.5
        ),
        lambda r, p: [_word(r, (0, 30), string.ascii_letters)],
    ),
    Family(
        "poly_value",
        lambda p: "returns the value at the integer `x` of the polynomial "
        + " + ".join(f"{c}*x**{i}" for i, c in enumerate(p["coef"])),
        lambda p: "def poly_value(x):\n    return " + " + ".join(f"{c} * x ** {i}" for i, c in enumerate(p["coef"])) + "\n",
        lambda r: {"coef": [r.randint(-9, 9) for _ in range(r.randint(2, 4))]},
        lambda r, p: [r.randint(-10, 10)],
    ),
    Family(
        "keep_between",
        lambda p: f"returns the numbers of `nums` that lie between {p['lo']} and {p['hi']} inclusive, sorted in "
        f"{'descending' if p['desc'] else 'ascending'} order",
        lambda p: f"def keep_between(nums):\n    return sorted((x for x in nums if {p['lo']} <= x <= {p['hi']}), reverse={p['desc']})\n",
        lambda r: (lambda lo: {"lo": lo, "hi": lo + r.randint(3, 20), "desc": r.random() < 0.5})(r.randint(-15, 5)),
        lambda r, p: [_ints(r, (0, 10))],
    ),
    Family(
        "pairwise_gaps",
        lambda p: f"returns the list of {PAIR_OPS[p['op']][0]} for every valid index i of `nums`".replace("K", str(p["k"])),
        lambda p: f"def pairwise_gaps(nums):\n    return [{PAIR_OPS[p['op']][1]} for i in range(len(nums) - {p['k']})]\n".replace("K", str(p["k"])),
        lambda r: {"k": r.randint(1, 6), "op": r.choice(sorted(PAIR_OPS))},
        lambda r, p: [_ints(r, (0, 9))],
    ),
    Family(
        "word_lengths",
        lambda p: "returns a dict that maps each distinct word of `s` (words are separated by spaces) with "
        + (f"exactly {p['lo']}" if p["lo"] == p["hi"] else f"{p['lo']} to {p['hi']}")
        + " letters to its number of occurrences"
        + (", counting words that differ only in case as one (the dict's keys in lowercase)" if p["fold"] else ""),
        lambda p: f"def word_lengths(s):\n    out = {{}}\n    for w in s.split():\n        if {p['lo']} <= len(w) <= {p['hi']}:\n"
        + ("            w = w.lower()\n" if p["fold"] else "")
        + "            out[w] = out.get(w, 0) + 1\n    return out\n",
        lambda r: (lambda lo: {"lo": lo, "hi": r.randint(lo, 7), "fold": r.random() < 0.5})(r.randint(1, 5)),
        lambda r, p: [" ".join(r.choice(WORDS) for _ in range(r.randint(0, 10)))],
    ),
    Family(
        "collatz_steps",
        lambda p: f"returns the number of steps to reach 1 from the positive integer `n`, where a step maps an even "
        f"n to n // 2 and an odd n to 3 * n + 1, but never more than {p['cap']} (stop counting there)",
        lambda p: f"def collatz_steps(n):\n    steps = 0\n    while n != 1 and steps < {p['cap']}:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps\n",
        lambda r: {"cap": r.randint(20, 150)},
        lambda r, p: [r.randint(1, 500)],
    ),
]  # fmt: skip


def _call_repr(name: str, args: list) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def make_item(family: Family, params: dict, rng: random.Random, n_tests: int) -> dict[str, Any]:
    """One item: the prompt with one example, the reference source as `answer`, tests in the metadata.

    The example and the tests have pairwise different outputs where the family allows it, and the example is not
    among the tests: a constant answer (such as the example's output) passes at most one test."""
    source = family.source(params)
    ns: dict[str, Any] = {}
    exec(compile(source, f"<{family.name}>", "exec"), ns)  # our own reference solution, never model output
    fn = ns[family.name]
    cases, seen_inputs, seen_outputs, spare = [], set(), set(), []
    for _ in range((n_tests + 1) * 8):
        args = family.inputs(rng, params)
        if repr(args) in seen_inputs:
            continue
        seen_inputs.add(repr(args))
        case = {"input": args, "output": fn(*[list(a) if isinstance(a, list) else a for a in args])}
        out = repr(case["output"])
        (spare if out in seen_outputs else cases).append(case)
        seen_outputs.add(out)
        if len(cases) == n_tests + 1:
            break
    cases += spare[: n_tests + 1 - len(cases)]  # a family with few distinct outputs repeats some
    example, tests = cases[0], cases[1:]
    question = (
        f"Write a Python function `{family.name}` that {family.describe(params)}.\n"
        f"Example: `{_call_repr(family.name, example['input'])}` returns `{example['output']!r}`.\n{INSTRUCTION}"
    )
    return {
        "messages": [{"role": "user", "content": question}],
        "answer": source,
        "metadata": {
            "task": family.name,
            "params": params,
            "entry_point": family.name,
            "tests": tests,
            "example": example,
            "question": question,
        },
    }


def _task_key(item: dict[str, Any]) -> str:
    return f"{item['metadata']['task']}{item['metadata']['params']!r}"


MAX_MISSES = 50  # draws in a row that repeat a known task before a family counts as used up


class CodeTasksEnv:
    """Train and held-out items from the task families above.

    size: training items; seed: their generator seed; eval_size, eval_seed: the held-out set (prompts that also
    occur in it are removed from training); tests: tests per item (the example shown in the prompt is not one of them);
    families: the family names to use (null: all); system_prompt: optional system message.
    """

    def __init__(
        self,
        size: int = 2000,
        seed: int = 0,
        eval_size: int = 64,
        eval_seed: int = 1_000_003,
        tests: int = 8,
        families: list[str] | None = None,
        system_prompt: str | None = None,
    ):
        known = {f.name: f for f in FAMILIES}
        unknown = sorted(set(families or []) - set(known))
        if unknown:
            raise ValueError(f"env.families has unknown names {unknown}; valid: {', '.join(known)}")
        if tests < 1:
            raise ValueError(f"env.tests must be >= 1 (got {tests})")
        self.families = [known[n] for n in families] if families else list(FAMILIES)
        self.system_prompt, self.tests = system_prompt, tests
        self._eval = self._generate(eval_size, eval_seed, exclude=set())
        held_out = {_task_key(it) for it in self._eval}
        self._train = self._generate(size, seed, exclude=held_out)

    def _generate(self, n: int, seed: int, exclude: set[str]) -> list[dict[str, Any]]:
        """n distinct tasks, the families taking turns (each round visits every family still producing new tasks,
        in a shuffled order), so a family with few parameter sets runs out without crowding the others out."""
        rng, items, seen = random.Random(seed), [], set(exclude)
        live, misses = list(self.families), dict.fromkeys((f.name for f in self.families), 0)
        while len(items) < n and live:
            for family in rng.sample(live, len(live)):
                if len(items) == n:
                    break
                item = make_item(family, family.params(rng), rng, self.tests)
                key = _task_key(item)
                if key in seen:  # the same function (family and parameters) is one task, whatever its examples
                    misses[family.name] += 1
                    if misses[family.name] >= MAX_MISSES:  # its parameter sets are (nearly) used up
                        live.remove(family)
                    continue
                misses[family.name] = 0
                seen.add(key)
                if self.system_prompt:
                    item["messages"].insert(0, {"role": "system", "content": self.system_prompt})
                items.append(item)
        if n and not items:
            raise ValueError("env: no code task could be generated (env.families)")
        return items

    def train_items(self) -> list[dict[str, Any]]:
        return self._train

    def eval_items(self) -> list[dict[str, Any]]:
        return self._eval

    def answer_text(self, item: dict[str, Any]) -> str:
        """The reference solution in the code block the prompt asks for (demonstrations: python -m rl.tools.demos)."""
        return f"```python\n{item['answer']}```"
