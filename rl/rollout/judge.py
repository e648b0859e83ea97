"""A judge as a reward sees it: judge prompts as text in, verdicts as text out, over the run's judge/teacher
engines (Runtime.teacher_generate) or one engine in this process (`python -m rewards.check`: TeacherEngine.generate).
Rewards (rewards/judge.py) work on text and never import the runtime: the run hands them this object
(`bind_judge`) once the engines have started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl.data.prompts import encode_prompt
from rl.types import PromptRollout, Sampling

# token ids of each prompt and how to sample -> one PromptRollout per prompt, in prompt order
Generate = Callable[[list[list[int]], Sampling], list[PromptRollout]]


class JudgeClient:
    """Tokenises each judge prompt (as one user message through the judge's chat template when `chat`), leaves out
    those longer than `max_prompt_tokens` (their verdict is None), and asks the engines greedily for
    `max_new_tokens` tokens, all prompts in one batch."""

    def __init__(self, generate: Generate, tokenizer: Any, *, max_prompt_tokens: int, max_new_tokens: int, chat: bool):
        self.generate, self.tokenizer, self.chat = generate, tokenizer, chat
        self.max_prompt_tokens = max_prompt_tokens
        self.sampling = Sampling(n=1, temperature=0.0, top_p=1.0, max_tokens=max_new_tokens)

    def __call__(self, prompts: list[str]) -> list[str | None]:
        ids = [list(encode_prompt(self.tokenizer, [{"role": "user", "content": p}], self.chat)) for p in prompts]
        send = [k for k, t in enumerate(ids) if len(t) <= self.max_prompt_tokens]
        out: list[str | None] = [None] * len(prompts)
        rollouts = self.generate([ids[k] for k in send], self.sampling)
        for k, r in zip(send, rollouts):
            out[k] = r.completions[0].text
        return out
