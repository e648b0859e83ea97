"""transformers `generate` as a rollout engine (`cluster.rollout_backend=hf`): slow, for debugging and for
machines without vLLM. Same interface as rl.rollout.vllm.VLLMRollout; the adapter is loaded into a PEFT model."""

from __future__ import annotations

import time
from typing import Any

import torch

from rl.config.schema import ModelConfig
from rl.rollout.episodes import EpisodeEngine
from rl.types import Adapter, Completion, EpisodeSpec, PromptRollout, Sampling


class HFRollout(EpisodeEngine):
    """The resolved `model` group's weights (model.actor_path, else model.path) in model.dtype; `seed` seeds the
    per-prompt seeds drawn for calls without their own."""

    def __init__(self, model: ModelConfig, *, seed: int, episodes: EpisodeSpec | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        m = model

        model_path, dtype, trust_remote_code = m.actor_path or m.path, m.dtype.value, m.trust_remote_code
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.model = (
            AutoModelForCausalLM.from_pretrained(
                model_path,
                dtype=getattr(torch, dtype),  # resolved: model.dtype=auto is bf16 or fp32 by then (rl/resolve.py)
                trust_remote_code=trust_remote_code,
            )
            .to(self.device)
            .eval()
        )
        self.generator = torch.Generator().manual_seed(seed)  # draws the per-prompt seeds, on the host
        self.seed = seed
        self.version = 0
        self.asleep = False
        self.episodes, self._env = episodes, None  # a multi-turn env, built at its first episodes

    def load_adapter(self, adapter: Adapter) -> dict:
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load

        self.wake_up()
        t0 = time.perf_counter()
        if adapter.config.get("full_weights"):  # full fine-tuning: every parameter, under its HF name
            weights = load(adapter.weights)
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    p.copy_(weights[name])
            self.version = adapter.version
            return {"seconds": time.perf_counter() - t0, "bytes": adapter.nbytes}
        if not hasattr(self.model, "peft_config"):
            cfg = {k: v for k, v in adapter.config.items() if k in LoraConfig.__dataclass_fields__}
            self.model = get_peft_model(self.model, LoraConfig(**cfg)).eval()
        set_peft_model_state_dict(self.model, load(adapter.weights))
        self.version = adapter.version
        return {"seconds": time.perf_counter() - t0, "bytes": adapter.nbytes}

    # a pack's jobs (rl/runtime/packed.py) share the model; each has its own LoRA factors, version and generator

    def pack_state(self) -> tuple[str, ...]:
        return ("version", "generator", "seed", "episodes", "_env")

    def pack_tensors(self) -> dict[str, torch.Tensor]:
        if not hasattr(self.model, "peft_config"):
            return {}  # no adapter loaded yet: every job samples the base
        return {n: p for n, p in self.model.named_parameters() if "lora_" in n}

    def add_job(self, job: int, *, seed: int, episodes: EpisodeSpec | None = None, **shared: object) -> None:
        self.generator, self.seed, self.version = torch.Generator().manual_seed(seed), seed, 0
        self.episodes, self._env = episodes, None

    def load_weights_ipc(self, update_info: dict, version: int) -> dict:
        """Not this engine's: the schema refuses cluster.weight_sync=ipc without vLLM, so no run calls it."""
        raise NotImplementedError("cluster.weight_sync=ipc loads into vLLM engines: set cluster.rollout_backend=vllm")

    def sleep(self) -> dict:
        """`cluster.colocate` with the HF engine (debugging): the model moves to host memory while the learner
        trains; on a CPU-only machine there is nothing to move."""
        t0 = time.perf_counter()
        if not self.asleep:
            if self.device.type == "cuda":
                self.model.to("cpu")
                torch.cuda.empty_cache()
            self.asleep = True
        return {"seconds": time.perf_counter() - t0}

    def wake_up(self) -> dict:
        t0 = time.perf_counter()
        if self.asleep:
            self.model.to(self.device)
            self.asleep = False
        return {"seconds": time.perf_counter() - t0}

    def state_dict(self) -> dict:
        """The sampling generator's state (bytes): a resumed run draws the same samples as an uninterrupted one."""
        return {"generator": self.generator.get_state().numpy().tobytes()}

    def load_state(self, state: dict) -> None:
        self.generator.set_state(torch.frombuffer(bytearray(state["generator"]), dtype=torch.uint8))

    def _generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        max_tokens: list[int] | None = None,
        seeds: list[int] | None = None,
    ) -> list[PromptRollout]:
        self.wake_up()
        return hf_generate(
            self.model, self.tokenizer, prompts, sampling, self.generator, self.version, max_tokens, seeds=seeds
        )

    def close(self) -> None:
        pass


@torch.no_grad()
def hf_generate(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    sampling: Sampling,
    generator: torch.Generator,
    version: int,
    max_tokens: list[int] | None = None,
    seeds: list[int] | None = None,
) -> list[PromptRollout]:
    """Sample `sampling.n` completions per prompt with transformers `generate`; the behaviour logprobs are of the
    processed distribution (after the filters: temperature, top-p, min-p), the one sampled from, as vLLM's
    processed_logprobs (transformers applies min-p after top-p, vLLM before it: the same with either one alone).
    Shared by HFRollout and the learners' own generation (Learner.generate). Each prompt's n samples are one
    `generate` call on a freshly seeded torch RNG: with `seeds` (one per prompt, rl/seeds.py prompt_seed) the
    samples depend only on the prompt's seed, as a vLLM request's do; without, the seed is drawn from `generator`
    (repeatable through its saved state, but dependent on the prompts before it in the same actor). `max_tokens`:
    a cap per prompt."""
    eos_ids = model.generation_config.eos_token_id
    eos = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    out = []
    for k, prompt in enumerate(prompts):
        ids = torch.tensor([prompt] * sampling.n, device=device)
        seed = seeds[k] if seeds is not None else int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        torch.manual_seed(seed)
        greedy = sampling.temperature == 0
        filters = sampling.filters()
        gen = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=sampling.max_tokens if max_tokens is None else max_tokens[k],
            do_sample=not greedy,
            **{name: None if greedy or not value else value for name, value in filters.items()},
            top_k=None,
            pad_token_id=pad,
            output_scores=True,
            return_dict_in_generate=True,
            use_cache=True,
        )
        new = gen.sequences[:, len(prompt) :]
        logps = torch.stack(gen.scores, 1).float().log_softmax(-1)  # processed scores: what was sampled from
        comps = []
        for row, lp in zip(new, logps):
            toks = row.tolist()
            n = next((i + 1 for i, t in enumerate(toks) if t in eos), len(toks))
            toks = toks[:n]
            lps = lp[torch.arange(n), row[:n]].tolist()
            reason = "stop" if toks and toks[-1] in eos else "length"
            comps.append(Completion(toks, lps, reason, tokenizer.decode(toks, skip_special_tokens=True)))
        out.append(PromptRollout(list(prompt), comps, version))
    return out
