"""The judge/teacher engine: a vLLM engine beside the actors that writes verdicts (reward=judge) and scores the
student's sampled tokens (algorithm=distill), serving `teacher.path` (+ `teacher.adapter`).

It is the rollout actor's engine (VLLMRollout) built from `model` and `cluster` groups that are the teacher's, so
start-up, start-up errors, restarts and batching are the actors'; it adds one call, `token_logprobs`, and never takes
an adapter version from the learners. rl/resolve.py `teacher_engine_config` derives those groups (the whole
difference) from the resolved run config.
"""

from __future__ import annotations

from typing import Any

from rl.config.cluster import ClusterConfig
from rl.config.errors import ConfigError
from rl.config.schema import ModelConfig
from rl.rollout.vllm import VLLMRollout
from rl.types import Adapter


class TeacherEngine(VLLMRollout):
    """A VLLMRollout on the teacher's weights; `generate` writes judge verdicts, `token_logprobs` scores tokens."""

    def __init__(
        self, model: ModelConfig, cluster: ClusterConfig, *, max_seq_length: int, seed: int, adapter: str | None = None
    ):
        super().__init__(model, cluster, max_seq_length=max_seq_length, seed=seed)
        if adapter:  # teacher.adapter, merged once, as an actor merges a version (on an NF4 base: its LoRA slot)
            self.load_adapter(Adapter.from_folder(adapter, version=0))

    def token_logprobs(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """log p_teacher(c_t | prompt, c_<t) for every token of every completion (vLLM prompt logprobs of the
        concatenation, one engine call). prompts[i] pairs with completions[i]; returns one list per completion."""
        if not prompts:
            return []
        self.wake_up()
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompts, completions)],
            params,
            lora_request=self._lora_request,
            use_tqdm=False,
        )
        return [completion_logprobs(o.prompt_logprobs, len(p), list(c)) for o, p, c in zip(outs, prompts, completions)]


def completion_logprobs(prompt_logprobs, n_prompt: int, completion: list[int]) -> list[float]:
    """The logprob of each completion token from vLLM's prompt logprobs of prompt + completion (position 0 has
    none; position k holds {token id: Logprob} with the actual token always present, or FlatLogprobs)."""
    out = []
    for k, tok in enumerate(completion):
        step = prompt_logprobs[n_prompt + k]
        entry = step[tok]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def check_same_tokenizer(student: Any, teacher: Any, student_path: str, teacher_path: str) -> None:
    """Distillation compares the two models token by token: their vocabularies (token -> id) must be the same.
    A ConfigError of one line naming the key otherwise."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if a == b:
        return
    differ = sorted(set(a.items()) ^ set(b.items()))[:3]
    raise ConfigError(
        f"teacher.path={teacher_path} has another tokenizer than model.path={student_path} ({len(b)} vs {len(a)} "
        f"tokens; e.g. {differ}): algorithm=distill scores the student's token ids, so give a teacher with the "
        "student's tokenizer"
    )
