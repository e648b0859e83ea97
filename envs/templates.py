"""Prompt templates: a system prompt and a user-message pattern, by name or given in full.

The chat template itself (special tokens, generation prompt) is the tokenizer's: it is applied once, when the
prompts are tokenised (rl/data/prompts.py, model.use_chat_template). Environments only build the chat messages.
"""

from __future__ import annotations

from typing import Any

# The system prompt for the `boxed` reward: it asks for the one final answer that reward reads.
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
THINK_ANSWER_SYSTEM_PROMPT = (
    "You are a helpful assistant. First think about the reasoning process, then give the answer. Put the "
    "reasoning inside <think> </think> tags and the final answer inside <answer> </answer> tags, i.e. "
    "<think> reasoning here </think><answer> answer here </answer>."
)
TEMPLATES: dict[str, dict[str, str | None]] = {
    "boxed": {"system_prompt": BOXED_SYSTEM_PROMPT, "user": "{prompt}"},
    "think_answer": {"system_prompt": THINK_ANSWER_SYSTEM_PROMPT, "user": "{prompt}"},
    "boxed_inline": {"system_prompt": None, "user": "{prompt}\n" + BOXED_SYSTEM_PROMPT},
    "plain": {"system_prompt": None, "user": "{prompt}"},
}


class PromptTemplate:
    """Turns a prompt (text or chat messages) into chat messages.

    name: one of TEMPLATES (boxed, think_answer, boxed_inline, plain). system_prompt / user: override the named
    template's parts (user must contain `{prompt}`); system_prompt "" means no system message. Messages that
    already start with a system message keep it.
    """

    def __init__(self, name: str = "boxed", system_prompt: str | None = None, user: str | None = None):
        if name not in TEMPLATES:
            raise ValueError(f"env.template={name!r} is not known; valid: {', '.join(TEMPLATES)}")
        base = TEMPLATES[name]
        self.system_prompt = base["system_prompt"] if system_prompt is None else (system_prompt or None)
        self.user = user if user is not None else base["user"]
        if "{prompt}" not in self.user:
            raise ValueError(f"env.user_template={self.user!r} must contain {{prompt}}")

    def messages(self, prompt: str | list[dict[str, Any]]) -> list[dict[str, str]]:
        if isinstance(prompt, str):
            msgs = [{"role": "user", "content": self.user.replace("{prompt}", prompt)}]
        else:
            msgs = [dict(m) for m in prompt]
        if self.system_prompt and (not msgs or msgs[0].get("role") != "system"):
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs
