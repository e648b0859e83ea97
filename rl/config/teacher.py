"""The `teacher` group: the model a judge/teacher role serves (a vLLM engine beside the actors and learners).

One role kind for two uses: `reward=judge` asks it for verdicts (text), `algorithm=distill` for the logprobs of the
student's sampled tokens. How many engines and their resources are `cluster.num_teachers` / `gpus_per_teacher` /
`cpus_per_teacher`; this group says which weights they serve. Apart from rl/config/schema.py so that the schema
only gains one field for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl.config.errors import check, check_fields_finite


@dataclass
class TeacherConfig:
    path: str | None = None  # judge/teacher weights: folder, hub id or embedded:<name> (null: the actors' model)
    adapter: str | None = None  # LoRA adapter merged into them (folder, run dir or checkpoint; null: none)
    max_new_tokens: int = 16  # tokens a judge writes for its verdict
    max_prompt_tokens: int = 512  # judge prompts longer than this (question + completion + template) score 0

    def __post_init__(self) -> None:
        check_fields_finite(self, "teacher")
        check(self.max_new_tokens > 0, f"teacher.max_new_tokens must be > 0 (got {self.max_new_tokens})")
        check(self.max_prompt_tokens > 0, f"teacher.max_prompt_tokens must be > 0 (got {self.max_prompt_tokens})")
