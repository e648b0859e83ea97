"""The judge/teacher engine: a vLLM engine beside the actors that writes verdicts (reward=judge) and scores the
student's sampled tokens (algorithm=distill), serving `teacher.path` (+ `teacher.adapter`).

It is the rollout actor's engine (VLLMRollout) built from a config whose model is the teacher's, so start-up,
start-up errors, restarts and batching are the actors'; it adds one call, `token_logprobs`, and never takes an
adapter version from the learners. `teacher_engine_config` is the whole difference, made with
`dataclasses.replace` from the resolved run config.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rl.config.choices import ActorBase, LoraMode, WeightSync
from rl.config.schema import ConfigError, TrainConfig
from rl.resolve import adapter_lora, teacher_in_4bit
from rl.rollout.vllm import VLLMRollout
from rl.types import Adapter


def teacher_engine_config(cfg: TrainConfig) -> TrainConfig:
    """The run config as a teacher engine reads it (resolved `cfg` in): `teacher.path` as the model, a context long
    enough for a judge prompt and for a student's prompt + completion (+1: the engine must generate a token), its
    adapter merged into the weights (on the actors' NF4 base, `teacher_in_4bit`: quantized as theirs and the adapter
    as native LoRA), its own GPU share, no colocation, no episodes."""
    t, m, c = cfg.teacher, cfg.model, cfg.cluster
    nf4 = teacher_in_4bit(cfg)
    model = replace(
        m,
        path=t.path or m.path,
        actor_path=None,
        load_in_4bit=nf4,
        actor_base=m.actor_base if nf4 else ActorBase.original,
        lora_rank=adapter_lora(t.adapter)[0] if nf4 and t.adapter else m.lora_rank,  # vLLM's LoRA slot: the adapter's
        full_finetune=False,
        init_adapter=None,
        max_prompt_tokens=max(t.max_prompt_tokens, cfg.max_seq_length + 1),
        max_new_tokens=t.max_new_tokens,
    )
    cluster = replace(
        c,
        gpus_per_actor=c.gpus_per_teacher,
        gpu_memory_utilization=c.teacher_memory_utilization or c.gpu_memory_utilization,
        lora_mode=LoraMode.native if nf4 else LoraMode.merged,
        weight_sync=WeightSync.object_store,
        colocate=False,
        staleness=0,
    )
    return replace(cfg, model=model, cluster=cluster, episodes=None)


class TeacherEngine(VLLMRollout):
    """A VLLMRollout on the teacher's weights; `generate` writes judge verdicts, `token_logprobs` scores tokens."""

    def __init__(self, cfg: TrainConfig):
        super().__init__(teacher_engine_config(cfg))
        if cfg.teacher.adapter:  # merged once, as an actor merges a version (on an NF4 base: its LoRA slot)
            self.load_adapter(Adapter.from_folder(cfg.teacher.adapter, version=0))

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
