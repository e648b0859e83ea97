"""Rollout engines: sample completions with token ids and behaviour logprobs, and load new adapter versions.

Plain classes (no Ray); `rl/placement.py` wraps them as Ray actors. vLLM is imported lazily, inside the
engine's constructor, so that it is the first heavy import of the process that owns the engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from rl.types import Adapter, Completion, PromptRollout, Sampling


class VLLMRollout:
    """A vLLM engine with a LoRA adapter slot.

    lora_mode="native": each adapter version is written to a private temp folder and used as a `LoRARequest`
    (exact, vLLM's LoRA kernels). lora_mode="merged": the adapter is merged into the engine's weights by the
    worker extension in rl/vllm_ext.py (base-model decode speed; the CPU default, see that module). Full weights
    (a full fine-tuning learner) are loaded in place by the same extension, in either mode.
    Either way the adapter arrives as bytes (no shared filesystem) and every sample records its version.
    """

    def __init__(
        self,
        model_path: str,
        *,
        lora_mode: str = "native",
        max_lora_rank: int = 16,
        dtype: str = "bfloat16",
        max_model_len: int = 1024,
        seed: int = 0,
        gpu_memory_utilization: float = 0.2,
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        trust_remote_code: bool = False,
        weight_sync: str = "object_store",
    ):
        if lora_mode not in ("native", "merged"):
            raise ValueError(f"rollout.lora_mode must be native or merged (got {lora_mode!r})")
        from vllm import LLM

        self.lora_mode = lora_mode
        kwargs = dict(
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,  # per-request seeds kill the CPU engine; the engine seed makes runs repeatable
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            trust_remote_code=trust_remote_code,
            logprobs_mode="processed_logprobs",  # logprobs of the distribution actually sampled (after temperature)
        )
        # the worker extension loads merged adapters and full weights (rl/vllm_ext.py); native LoRA also needs vLLM's
        kwargs.update(worker_extension_cls="rl.vllm_ext.LoraMergeExtension")
        if lora_mode == "native":
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
        if weight_sync == "ipc":  # vLLM's weight-transfer engine: full weights arrive as CUDA IPC handles
            kwargs.update(weight_transfer_config={"backend": "ipc"})
        self.llm = LLM(**kwargs)
        self.version = 0
        self._lora_request = None
        self._lora_root = Path(tempfile.mkdtemp(prefix="rlft-lora-"))

    def load_adapter(self, adapter: Adapter) -> dict:
        """Make `adapter` the policy for every later generate call; returns timing and size."""
        t0 = time.perf_counter()
        if adapter.config.get("full_weights"):  # full fine-tuning: every parameter, loaded in place
            self.llm.collective_rpc("rlft_load_weights", args=(adapter.weights,))
            self.llm.reset_prefix_cache()
        elif self.lora_mode == "native":
            if self._lora_request is not None and self._lora_request.lora_int_id == adapter.version:
                # the same version again (a rejoining actor, a resume): already in use; rewriting its folder and
                # removing the "old" one would delete the adapter the engine reads
                return {"seconds": time.perf_counter() - t0, "bytes": adapter.nbytes}

            self._swap_native_adapter(adapter)
        else:
            self.llm.collective_rpc("rlft_merge_adapter", args=(adapter.config, adapter.weights))
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.version = adapter.version
        return {"seconds": time.perf_counter() - t0, "bytes": adapter.nbytes}

    def _swap_native_adapter(self, adapter: Adapter) -> None:
        """Write the adapter to its own folder and make it the LoRARequest of later generate calls; the previous
        version is removed from the engine and its folder deleted."""
        import json

        from vllm.lora.request import LoRARequest

        folder = self._lora_root / f"v{adapter.version}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text(json.dumps(adapter.config, default=str))
        (folder / "adapter_model.safetensors").write_bytes(adapter.weights)
        old = self._lora_request
        self._lora_request = LoRARequest(f"v{adapter.version}", adapter.version, str(folder))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def load_weights_ipc(self, update_info: dict, version: int) -> dict:
        """Full weights through vLLM's native weight-transfer API (IPC engine, CUDA only): the learner's
        parameters are opened in place from their CUDA IPC handles (`PeftLearner.ipc_weights`), no host copy.
        Run on one H200 (README: 3 steps of a 0.5B full fine-tune, 0.13-0.22 s per sync, probe 0.004-0.006)."""
        t0 = time.perf_counter()
        self.llm.start_weight_update()
        self.llm.update_weights({"update_info": update_info})
        self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()
        self.version = version
        return {"seconds": time.perf_counter() - t0, "bytes": 0}

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[PromptRollout]:
        if not prompts:
            return []
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            logprobs=0,  # the sampled token's logprob only
        )
        outs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=self._lora_request, use_tqdm=False
        )
        result = []
        for prompt, out in zip(prompts, outs):
            comps = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [float(step[tok].logprob) for tok, step in zip(ids, c.logprobs or [])]
                comps.append(Completion(ids, lps, "length" if c.finish_reason == "length" else "stop", c.text))
            result.append(PromptRollout(list(prompt), comps, self.version))
        return result

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


def cpu_threads_env(num_threads: int | None) -> dict[str, str]:
    """Environment for a vLLM CPU engine: let it use `num_threads` cores (it reserves one by default)."""
    n = num_threads or os.cpu_count() or 1
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{n - 1}" if n > 1 else "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
