"""An example verifiers taskset (the library's own classes): sums and differences of two 1-digit numbers, the demo's
task, scored by its task's rubric. It is env=verifiers' worked example (docs/environments.md) and its learning run
(docs/benchmarks.md): `python train.py env=verifiers env.taskset=envs.verifiers_example:SumTaskset`."""

from __future__ import annotations

import re

import verifiers.v1 as vf

INSTRUCTION = "Give the final answer as a number at the end."


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, trace) -> float:
        """1 when the reply's last number is the answer."""
        numbers = re.findall(r"-?\d+", trace.last_reply)
        return float(bool(numbers) and numbers[-1] == self.data.answer)


class SumTaskset(vf.Taskset[SumTask]):
    """Every `a + b` and `a - b` of two 1-digit numbers: 200 tasks."""

    def load(self):
        for a in range(10):
            for b in range(10):
                for op, value in (("+", a + b), ("-", a - b)):
                    data = SumData(prompt=f"{a} {op} {b} = ?\n{INSTRUCTION}", answer=str(value))
                    yield SumTask(data, self.config.task)
