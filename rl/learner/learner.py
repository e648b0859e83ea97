"""The learner role: policy-gradient steps on the sampled token ids, with the behaviour logprobs from the actors.

A plain class (no Ray) built from the resolved `model`, `algorithm` and `learner` groups and a few named values
(rl/app.py wires them), whose keys it reads where it uses them; `rl/runtime/placement.py` wraps it as a Ray actor. Its model comes from rl/learner/models.py (PEFT, PEFT
on 4-bit weights, Unsloth, or full fine-tuning), its batches from batching.py, its data-parallel reduction from
parallel.py, and what it sends out from export.py. The reference policy for a KL penalty is the same model with
the adapter disabled (no second copy in memory); a full fine-tuning learner keeps a frozen copy of the initial
weights instead, built only when a KL needs it. A micro-batch's loss is loss.py's (this step's and a sweep pack's
grouped step's, grouped.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings

import torch

from rl import algorithms
from rl.config.schema import AlgorithmConfig, LearnerConfig, ModelConfig
from rl.learner import attention, export, grouped, packing
from rl.learner.batching import Batcher, loss_tokens, to_host
from rl.learner.loss import entropy_use, micro_batch_loss, micro_batch_weight
from rl.learner.models import load_policy
from rl.learner.parallel import DataParallel
from rl.types import Adapter, JobError, PromptRollout, Sampling, TrainSample


def shares_prompt(packed: bool, checkpointing: bool, device: torch.device) -> bool:
    """Whether `learner.share_prompt_prefix` can apply: a packed row holds a group's prompt once, always; padded
    micro-batches share it through a KV cache, which needs use_cache in training (Unsloth's gradient checkpointing
    forbids it) and pays only on CPU: on an H200, at 32 prompts x 8, it made the learner step 29 s in train.py, and
    alone it did not finish four steps in eight minutes where the plain padded forward took 3 s a step
    (docs/benchmarks.md)."""
    return packed or (not checkpointing and device.type == "cpu")


class Learner:
    """`model`, `algorithm`, `learner`: the resolved groups. `seed`: run.seed; `deterministic`: run.deterministic;
    `threads`: cluster.learner_threads (None: every core); `colocate`: cluster.colocate; `max_seq_length` and
    `sync_dtype`: the schema's derived values of those names."""

    def __init__(
        self,
        model: ModelConfig,
        algorithm: AlgorithmConfig,
        learner: LearnerConfig,
        *,
        seed: int,
        max_seq_length: int,
        sync_dtype: str | None = None,
        deterministic: bool = False,
        threads: int | None = None,
        colocate: bool = False,
    ):
        # Ray limits an actor to its num_cpus threads; roles alternate in synchronous mode, so use every core
        torch.set_num_threads(threads or os.cpu_count() or 1)
        torch.manual_seed(seed)
        if deterministic:  # `run.deterministic=true`: rl/runtime/process_env.py sets cuBLAS's workspace before CUDA
            # deterministic kernels wherever torch has one; an op without one (a library's custom kernel may use
            # one) warns in this role's log instead of stopping the run: the two-run test is what shows identity
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.model_cfg, self.algorithm, self.learner_cfg = model, algorithm, learner
        self.seed, self.colocate = seed, colocate
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.policy = load_policy(
            model, self.device, max_seq_length=max_seq_length, seed=seed, kl=algorithm.kl_coef > 0
        )
        self.model = self.policy.model
        packed, use_attention = None, None
        if learner.micro_batch_tokens > 0:
            dtype = getattr(torch, model.learner_dtype.value)
            packed = packing.resolve_backend(learner.packed_attention.value, self.device, dtype)
            use_attention = packing.use_packed_attention
        elif self.device.type == "cpu":  # padded micro-batches on CPU: short sequences backpropagate faster in eager
            use_attention = attention.use_short_eager_attention
        for net in (self.model, self.policy.ref_model) if use_attention else ():
            if net is not None:
                use_attention(net)
        self.batcher = self._batcher(packed)
        if packed:
            try:
                self.batcher.check_packing(self.model)
            except RuntimeError as e:
                # a model whose attention mixes packed sequences trains padded rather than not at all (Unsloth,
                # which replaces the attention forward, is refused packed rows at config load already)
                budget = learner.micro_batch_tokens
                warnings.warn(
                    f"learner.micro_batch_tokens={budget}: padded micro-batches instead of packed rows. {e}",
                    stacklevel=2,
                )
                self.batcher = self._batcher(None)
        # a run that starts from an adapter: its version 0 (the resolve step checked its shape)
        if model.init_adapter:
            start = Adapter.from_folder(model.init_adapter, version=0)
            export.load_policy_bytes(self.model, start, self.device, full_weights=False)
            if algorithm.kl_coef > 0:  # the KL's reference is the policy the run starts from, not the base
                trained = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
                self.policy.ref_adapter = trained
        self._use_algorithm(algorithm)
        self.version = 0
        self.sync_dtype = getattr(torch, sync_dtype) if sync_dtype else None
        self.dp = DataParallel(self.device)
        self._ipc = export.IpcExport()
        self._gen_rng: torch.Generator | None = None  # learner generation's seed draws, made at its first use
        self._pack_tensors: dict[str, torch.Tensor] | None = None  # pack_tensors, listed at its first use

    def _use_algorithm(self, a: AlgorithmConfig) -> None:
        """The optimizer over the trainable parameters and the loss of the `algorithm` group `a`."""
        self.algorithm = a
        params = [p for p in self.model.parameters() if p.requires_grad]
        # fused: one kernel for all parameters, and it can skip a non-finite step on the device (`found_inf`), so the
        # step launches without waiting for the host to read the loss (the GPU would idle meanwhile)
        self.optimizer = torch.optim.AdamW(params, lr=a.lr, weight_decay=a.weight_decay, fused=True)
        self.loss_fn = algorithms.get_policy_loss(a.policy_loss)
        agg = algorithms.get_loss_agg(a.loss_agg)
        self.agg_fn = functools.partial(agg, norm_length=a.loss_agg_norm_length)
        self.agg_unit = getattr(agg, "unit", "seq")

    # ------------------------------------------------------------------------------------------------ a pack's jobs
    # (rl/runtime/packed.py): the jobs of a pack share this learner's base; each has its own adapter, optimizer,
    # algorithm knobs, version and RNG

    def pack_state(self) -> tuple[str, ...]:
        return ("algorithm", "optimizer", "loss_fn", "agg_fn", "agg_unit", "version", "seed", "_gen_rng")

    def pack_tensors(self) -> dict[str, torch.Tensor]:
        # the same Parameters for the learner's life (a pack swaps their storage): listed once, as walking the
        # model's modules on every swap costs a grouped step of 8 jobs about a second of host time on a GPU
        if self._pack_tensors is None:
            self._pack_tensors = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        return self._pack_tensors

    def add_job(self, job: int, *, algorithm: AlgorithmConfig, seed: int, **shared: object) -> None:
        """Job `job`'s adapter starts as a solo run's: the starting adapter (model.init_adapter), else LoRA's own
        initialisation drawn from the job's run.seed; its optimizer and loss from its `algorithm` group."""
        torch.manual_seed(seed)
        if not self.model_cfg.init_adapter:
            from peft.tuners.lora import LoraLayer

            for module in self.model.modules():
                if isinstance(module, LoraLayer):
                    for name in module.lora_A:
                        module.reset_lora_parameters(name, True)
        self.seed, self.version, self._gen_rng = seed, 0, None
        self._use_algorithm(algorithm)

    def train_grouped(self, jobs: list) -> list[dict[str, float] | JobError]:
        """Several pack jobs' steps in one forward and backward per micro-batch (rl/learner/grouped.py); a job whose
        step raised gets its JobError."""
        return grouped.train_grouped(self, jobs)

    def logprobs_grouped(self, jobs: list) -> list[list[list[float]] | JobError]:
        """Several pack jobs' `sequence_logprobs` calls in one forward per micro-batch (rl/learner/grouped.py)."""
        return grouped.logprobs_grouped(self, jobs)

    def _batcher(self, packed: str | None) -> Batcher:
        lc = self.learner_cfg
        return Batcher(
            self.device,
            share_prompt_prefix=lc.share_prompt_prefix
            and shares_prompt(packed is not None, self.policy.checkpointing, self.device),
            logits_to_keep=self.policy.logits_to_keep,
            size=lc.micro_batch_size,
            packed=packed,
            budget=lc.micro_batch_tokens,
        )

    def _micro_batches(self, samples: list[TrainSample]) -> list[list[TrainSample]]:
        return self.batcher.micro_batches(samples)

    # ------------------------------------------------------------------------------------------------ training

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step over `samples` (gradient accumulation in micro-batches). Returns metrics."""
        t0 = time.perf_counter()
        a = self.algorithm
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        samples, n_seq, n_tok, n_signal = self.step_samples(samples)
        # Loss and metrics stay on the device until the step is launched: a float() between forward and backward
        # makes the CPU wait for the forward to drain before it can queue the backward
        sums: dict[str, torch.Tensor | float] = {}
        total_loss: torch.Tensor | float = 0.0
        tokens = 0
        batches = self._micro_batches(samples)
        for mb in batches:
            mask, old, adv = self.batcher.completion_batch(mb)
            ref = None
            # the reference before the policy's forward: a reference that swaps weights must not touch its graph
            if a.loss_kl_coef > 0:
                with torch.no_grad(), self.policy.reference() as ref_model:
                    ref = self.batcher.logprobs(ref_model, mb, a.temperature, min_p=a.min_p)[0]
            logp, entropy, n_positions = self.batcher.logprobs(  # [B, C]
                self.model, mb, a.temperature, min_p=a.min_p, entropy=entropy_use(a)
            )
            loss, metrics = micro_batch_loss(a, self.loss_fn, self.agg_fn, logp, entropy, ref, mask, old, adv)
            weight = micro_batch_weight(mb, n_seq, n_tok, self.agg_unit)
            (loss * weight).backward()
            total_loss = total_loss + loss.detach() * weight
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v * weight
            tokens += n_positions
        return self.finish_step(total_loss, sums, n_signal, len(batches), tokens, t0)

    def step_samples(self, samples: list[TrainSample]) -> tuple[list[TrainSample], int, int, int]:
        """The samples a step forwards under the current algorithm group, and the step's sequence, token and
        with-signal counts (summed over the data-parallel learners)."""
        a = self.algorithm
        n_tok = loss_tokens(samples)
        # sequences with no loss token (masked truncated responses) count in no normaliser, as in the aggregations
        samples = [s for s in samples if loss_tokens([s]) > 0]
        n_seq = len(samples)
        if a.loss_kl_coef == 0 and a.entropy_coef == 0:
            # A sample with advantage 0 adds exactly 0 to the policy loss and its gradient; it only counts in the
            # normaliser (n_seq / n_tok above, computed before this filter), so skipping its forward is exact.
            samples = [s for s in samples if s.advantage != 0.0 or any(s.token_advantages)]
        n_seq, n_tok, n_signal = self.dp.sum_counts(n_seq, n_tok, len(samples))
        return samples, n_seq, n_tok, n_signal

    def finish_step(
        self,
        total_loss: torch.Tensor | float,
        sums: dict[str, torch.Tensor | float],
        n_signal: int,
        micro_batches: int,
        tokens: int,
        t0: float,
    ) -> dict[str, float]:
        """With the step's gradients in the trainable parameters' `.grad`: the data-parallel reduction, clipping, the
        optimizer step (skipped when non-finite), version + 1, and the step's metrics."""
        a = self.algorithm
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if self.dp.world_size > 1:
            sums = to_host({"train/loss": total_loss, **sums})
            total_loss, sums = self.dp.sum_grads_and_metrics(trainable, sums.pop("train/loss"), sums, n_signal)
        params = [p for p in trainable if p.grad is not None]
        max_norm = a.max_grad_norm
        if not params:
            grad_norm: torch.Tensor | float = 0.0
        elif max_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        else:
            grad_norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
        # never let a NaN/inf step reach the weights: the fused AdamW skips its whole update (and its step count)
        # where `found_inf` is 1, decided on the device; the metrics' transfer below is the step's one wait
        loss_t, norm_t = (torch.as_tensor(x, device=self.device, dtype=torch.float32) for x in (total_loss, grad_norm))
        skipped_t = (~(torch.isfinite(loss_t) & torch.isfinite(norm_t))).float()
        if params:
            self.optimizer.found_inf = skipped_t
            self.optimizer.step()
        sums = to_host({"train/loss": loss_t, "train/grad_norm": norm_t, "train/skipped_nonfinite": skipped_t, **sums})
        total_loss, grad_norm, skipped = (
            sums.pop(k) for k in ("train/loss", "train/grad_norm", "train/skipped_nonfinite")
        )
        self.version += 1
        dt = time.perf_counter() - t0
        return {
            **sums,
            "train/loss": total_loss,
            "train/samples_with_signal": float(n_signal),
            # forwards per step: on a GPU a small model's step costs about the same per micro-batch whatever its size
            "train/micro_batches": float(micro_batches),
            "train/grad_norm": grad_norm,
            "train/skipped_nonfinite": skipped,
            "perf/learner_tokens_per_s": tokens / dt,
            "time/learn_s": dt,
            **self._gpu_memory(),
        }

    def _gpu_memory(self) -> dict[str, float]:
        """The step's peak GPU memory; colocated with a sleeping engine (`cluster.colocate`), the allocator's cache
        is returned to the GPU so that the engine can wake into it."""
        if not torch.cuda.is_available():
            return {}
        peak = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
        if self.colocate:
            torch.cuda.empty_cache()
        return {"memory/learner_peak_gb": peak}

    @torch.no_grad()
    def sequence_logprobs(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], reference: bool = False
    ) -> list[list[float]]:
        """Logprobs of given completions under the current policy, or under the reference policy (the adapter
        disabled) with `reference=True`; for the sync probe and a KL penalty folded into the reward."""
        self.model.eval()
        samples = [TrainSample(p, c, [0.0] * len(c), 0.0) for p, c in zip(prompt_ids, completion_ids)]
        out: list[list[float]] = []
        with self.policy.reference() if reference else contextlib.nullcontext(self.model) as model:
            for mb in self._micro_batches(samples):
                logp = self.batcher.logprobs(model, mb, self.algorithm.temperature, min_p=self.algorithm.min_p)[0]
                out.extend(logp[i, : len(s.completion_ids)].tolist() for i, s in enumerate(mb))
        self.model.train()
        return out

    # ------------------------------------------------------------------------------------------------ generation

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, seeds: list[int] | None = None
    ) -> list[PromptRollout]:
        """Learner generation (`cluster.learner_chunk_size`): sample a share of
        the step's prompts with this learner's own model instead of waiting for the actors; the rollouts carry
        this learner's adapter version and the processed-distribution logprobs, as an actor's do."""
        from rl.rollout.hf import hf_generate

        if not hasattr(self, "_gen_tokenizer"):  # built on first use: most runs never generate here
            from transformers import AutoTokenizer

            m = self.model_cfg
            self._gen_tokenizer = AutoTokenizer.from_pretrained(m.path, trust_remote_code=m.trust_remote_code)
        if self._gen_rng is None:  # draws one seed per prompt on the host (hf_generate), whatever the model's device
            self._gen_rng = torch.Generator().manual_seed(self.seed + 1 + self.dp.rank)
        self.model.eval()
        try:
            return hf_generate(
                self.model, self._gen_tokenizer, prompts, sampling, self._gen_rng, self.version, seeds=seeds
            )
        finally:
            self.model.train()

    # ------------------------------------------------------------------------------------------------ sync, state

    def init_process_group(self, address: str, port: int, world_size: int, rank: int) -> None:
        """Join the learners' torch.distributed group (rl/learner/parallel.py); rank 0 publishes the adapter."""
        self.dp.init(address, port, world_size, rank)

    def get_adapter(self, for_sync: bool = False) -> Adapter:
        """The current policy update as bytes; `for_sync`: in the precision the actors load it at (saved adapters
        and checkpoints keep the training precision)."""
        dtype = self.sync_dtype if for_sync else None
        t0 = time.perf_counter()
        adapter = export.policy_bytes(self.model, self.version, full_weights=self.model_cfg.full_finetune, dtype=dtype)
        adapter.export_s = time.perf_counter() - t0  # includes waiting for this learner's queued GPU work
        return adapter

    def get_version(self) -> int:
        return self.version

    def ipc_weights(self) -> dict:
        """The policy as CUDA IPC handles (`cluster.weight_sync=ipc`): full weights, or the adapter in the actors'
        precision; valid until `release_ipc_weights`."""
        if self.model_cfg.full_finetune:
            return self._ipc.handles(self.model, self.device)
        return self._ipc.adapter_handles(self.model, self.device, self.sync_dtype)

    def release_ipc_weights(self) -> None:
        self._ipc.release()

    def state_dict(self) -> dict:
        """What a checkpoint needs to continue training exactly, as plain data (crosses Ray): the adapter (its
        version included), the AdamW state (torch.save bytes) and this process's torch generator state."""
        return {
            "adapter": self.get_adapter(),
            "optimizer": export.optimizer_bytes(self.optimizer),
            "torch_rng": torch.get_rng_state().numpy().tobytes(),
        }

    def load_state(self, state: dict) -> None:
        """Restore `state_dict()`'s output: weights copied in place (the optimizer keeps its parameters)."""
        adapter = state["adapter"]
        export.load_policy_bytes(self.model, adapter, self.device, full_weights=self.model_cfg.full_finetune)
        export.load_optimizer_bytes(self.optimizer, state["optimizer"], self.device)
        self.version = adapter.version
        torch.set_rng_state(torch.frombuffer(bytearray(state["torch_rng"]), dtype=torch.uint8))

    def adapter_checksum(self) -> float:
        """Sum of all trained parameters (float64): equal across learners means equal adapters (up to collisions)."""
        return float(sum(p.detach().double().sum() for p in self.model.parameters() if p.requires_grad))

    def close(self) -> None:
        self.dp.close()
