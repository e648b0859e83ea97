"""A sweep pack's grouped learner step: several jobs' train steps (rl/runtime/packed.py) in one forward and one
backward per micro-batch, each sample through its own job's LoRA factors.

The pack's learner is where a pack must gain: on a GPU a small model's step costs about the same per micro-batch
whatever its size (launch-bound), so N jobs stepped one after another cost N steps. Here each job's samples are cut
into micro-batches exactly as its solo step cuts them (the same filters, counts and per-micro-batch weights, from
Learner.step_samples); grouped micro-batch k is the concatenation of every job's k-th micro-batch (a job with fewer
drops out), or with `learner.pack_micro_batches` m of micro-batches km ... km+m-1 of every job, each job's
consecutive (fewer forwards of more rows: each micro-batch keeps its own loss and weight). One forward over the
grouped rows runs every PEFT LoRA layer per row range (`RowAdapters`: base(x) plus, for each job's rows, B_j A_j x *
scaling with the job's own factors, stacked per layer as leaves: `StackedFactors`), the logprobs are split back per
job, and each job's loss is its own algorithm's (loss.py micro_batch_loss: its loss, aggregation, knobs, entropy
bonus and KL), weighted as in its solo step; one backward of the sum gives each job's factors their own
gradients. Then each job in turn is swapped into the learner for its clipping, non-finite skip, optimizer step,
version and metrics (Learner.finish_step).

Rows: with padded micro-batches a row is a sample; the grouped micro-batch is every job's rows padded to the
longest (padding is masked: equal to the job's solo step up to float rounding), and always as full rows: the CPU
solo step's prompt-prefix sharing (a KV-cache forward that runs a group's prompt as one row) is not used, since the
per-row adapters need one row per sample (equal up to rounding too). With packed rows (learner.micro_batch_tokens >
0, a PEFT learner's default: every sequence of a micro-batch in one row) each job's micro-batch is packed as its solo
step packs it, prompts shared within it, and the jobs' rows are concatenated along the tokens (packing.concat): a
job's span is a token range, split along that dimension. The KL reference's logprobs come from one forward of the
same grouped rows with the adapter off, before the policies'.

An Unsloth model's fused LoRA kernels read the layer's one active adapter and bypass its forward, and its compiled
decoder blocks keep the forwards they traced: before its first grouped step the learner puts PEFT's forwards back
and runs the blocks uncompiled (models.plain_lora_forwards), for the rest of the pack; the base's 4-bit kernels and
Unsloth's gradient checkpointing stay.

The sync probes of the pack's jobs are scored the same way (`logprobs_grouped`): one no-grad forward over every
job's probe rows, each through its own factors, where one forward per job ran one after another.

Job after job instead (`refusal`, `model_refusal` and `prepare` say why, in one line): LoRA dropout (each job's masks
must come from its own RNG stream), data-parallel learners, a trainable tensor outside the LoRA layers, and an
Unsloth that keeps its fused kernels. With no dropout the step draws nothing from
torch's RNG, so each job's RNG state stays as its solo step leaves it.

The grouped LoRA layers themselves (`RowAdapters`, `StackedFactors`) are rl/learner/row_lora.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rl.config.choices import LearnerBackend
from rl.config.schema import AlgorithmConfig, LearnerConfig, ModelConfig
from rl.learner import packing
from rl.learner.batching import Batcher, position_logprobs
from rl.learner.loss import entropy_use, micro_batch_loss, micro_batch_weight
from rl.learner.models import plain_lora_forwards
from rl.learner.row_lora import RowAdapters, StackedFactors, lora_layers
from rl.types import JobError, TrainSample

log = logging.getLogger(__name__)


class JobStep(Protocol):
    """One job's part of a grouped step: its samples, and how its state (attributes, tensors, RNG) is swapped into
    the learner (`enter`) and read back (`leave`)."""

    samples: list[TrainSample]

    def enter(self) -> None: ...

    def leave(self) -> None: ...


def refusal(model: ModelConfig, learner: LearnerConfig, num_learners: int) -> str | None:
    """Why a pack's learner with these settings steps its jobs one after another (None: it groups them)."""
    if model.lora_dropout > 0:
        return "model.lora_dropout>0: each job's dropout masks come from its own RNG stream"
    if num_learners > 1:
        return f"cluster.num_learners={num_learners}: the grouped step runs on one learner"
    if model.full_finetune:
        return "model.full_finetune=true: the jobs have no adapters of their own"
    return None


def model_refusal(learner: Any) -> str | None:
    """`refusal` for a built Learner, plus what only its model shows: every trainable tensor must be a plain LoRA
    layer's A or B (no bias, no variant such as DoRA)."""
    why = refusal(learner.model_cfg, learner.learner_cfg, learner.dp.world_size)
    if why is not None:
        return why
    covered = set()
    for name, module, adapter in lora_layers(learner.model):
        a, b = module.lora_A[adapter], module.lora_B[adapter]
        if module.lora_variant or a.bias is not None or b.bias is not None:
            return f"the LoRA layer {name} is not a plain A, B pair"
        covered |= {f"{name}.lora_A.{adapter}.weight", f"{name}.lora_B.{adapter}.weight"}
    outside = sorted(set(learner.pack_tensors()) - covered)
    return f"{outside[0]} is trained outside the LoRA layers" if outside else None


def prepare(learner: Any) -> str | None:
    """`model_refusal`, then (an Unsloth model) its LoRA layers' own forwards back (models.plain_lora_forwards);
    once per learner, the answer kept on it."""
    if "grouped_refusal" not in learner.__dict__:
        why = model_refusal(learner)
        if why is None and learner.model_cfg.learner_backend == LearnerBackend.unsloth:
            why = plain_lora_forwards(learner.model)
        learner.grouped_refusal = why
    return learner.grouped_refusal


@dataclass(eq=False)
class _Rows:
    """One job's part of a grouped forward: its algorithm (temperature, min-p), micro-batches and LoRA factors (each
    job's part is itself: two jobs with equal fields are still two)."""

    algorithm: AlgorithmConfig
    batches: list[list[TrainSample]]
    factors: dict[str, torch.Tensor]  # the job's LoRA factors by parameter name (its own storage)


@dataclass(eq=False)
class _Plan(_Rows):
    """One job's step: its rows, loss (from its algorithm group), counts and running sums."""

    loss_fn: Callable
    agg_fn: Callable
    unit: str
    n_seq: int
    n_tok: int
    n_signal: int
    refs: dict[int, torch.Tensor] = field(default_factory=dict)
    sums: dict[str, Any] = field(default_factory=dict)
    total_loss: Any = 0.0
    tokens: int = 0


def train_grouped(learner: Any, jobs: Sequence[JobStep]) -> list[dict[str, float] | JobError]:
    """Each job's `train_step(job.samples)` as described at the top, in one forward and backward per grouped
    micro-batch; job after job where `model_refusal` says why. Each job's metrics are its solo step's keys plus
    `pack/grouped_jobs` (the jobs that shared the forward); a job whose step raised gets its error (JobError), which
    its own call raises, and its pack mates their metrics."""
    if len(jobs) < 2 or prepare(learner) is not None:
        return [_step_alone(learner, job) for job in jobs]
    t0 = time.perf_counter()
    try:
        plans, stack = _forward_backward(learner, jobs)
    except Exception as e:
        # no job's state has changed yet (its adapter, optimizer and version change in finish_step): each job's
        # step alone instead, so that a job whose samples or loss raise fails alone and its pack mates go on
        log.warning("the grouped learner step failed (%s); this step runs its jobs one after another", e)
        return [_step_alone(learner, job) for job in jobs]
    out: list[dict[str, float] | JobError] = []
    for j, (job, p) in enumerate(zip(jobs, plans)):
        job.enter()
        try:
            params = learner.pack_tensors()
            # the job's own Parameters now hold its storage (its optimizer's keys); a job without rows has no
            # gradient, as alone, where its slice of the stacks' gradients would be zeros
            for n, grad in stack.grads(j).items():
                params[n].grad = grad if p.batches else None
            # time/learn_s (and the tokens/s over it): the grouped step's time up to this job's optimizer step
            metrics = learner.finish_step(p.total_loss, p.sums, p.n_signal, len(p.batches), p.tokens, t0)
        except Exception as e:  # this job's own step (its clipping, optimizer, metrics): it fails alone
            out.append(JobError(e))
            continue
        finally:
            job.leave()
        out.append(metrics | {"pack/grouped_jobs": float(len(jobs))})
    return out


def _forward_backward(learner: Any, jobs: Sequence[JobStep]) -> tuple[list[_Plan], StackedFactors]:
    """Every job's plan (samples, micro-batches, factors) and the grouped forwards and backwards, which leave each
    job's gradients in its slices of the stacked factors' (returned); nothing of a job's own state changes."""
    plans = []
    for job in jobs:
        job.enter()
        try:
            samples, n_seq, n_tok, n_signal = learner.step_samples(job.samples)
            factors = {n: p.data for n, p in learner.pack_tensors().items()}
            plans.append(
                _Plan(
                    learner.algorithm,
                    learner._micro_batches(samples),
                    factors,
                    learner.loss_fn,
                    learner.agg_fn,
                    learner.agg_unit,
                    n_seq,
                    n_tok,
                    n_signal,
                )
            )
        finally:
            job.leave()
    learner.model.train()
    forward = _GroupedForward(learner)
    groups = _forward_groups(plans, learner.learner_cfg.pack_micro_batches)
    if any(p.algorithm.loss_kl_coef > 0 for p in plans):
        # before the policies' forwards (a reference that swaps weights must not touch their graph), over the same
        # rows as theirs: where a job's adapter is the reference, its logprobs and the reference's are then equal to
        # the last bit, as in its solo step (AdamW's first update would magnify a rounding difference)
        with torch.no_grad(), learner.policy.reference() as ref_model:
            for group in groups:
                if any(e.plan.algorithm.loss_kl_coef > 0 for e in group):
                    for e, (ref, *_) in zip(group, forward(ref_model, group, 0, lambda a: "none")):
                        if e.plan.algorithm.loss_kl_coef > 0:
                            e.plan.refs[e.k] = ref
    unsloth = learner.model_cfg.learner_backend == LearnerBackend.unsloth
    stack = StackedFactors(learner.model, [p.factors for p in plans], grad=True)
    with RowAdapters(stack, in_input_dtype=unsloth) as adapters:
        for group in groups:
            # one span per job: a job's micro-batches in the forward are consecutive rows through its factors once
            total: torch.Tensor | float = 0.0
            split = forward(learner.model, group, 0, entropy_use, adapters, plans)
            for e, (logp, entropy, mask, old, adv, n_positions) in zip(group, split):
                p, mb, a = e.plan, e.batches[0], e.algorithm
                loss, metrics = micro_batch_loss(a, p.loss_fn, p.agg_fn, logp, entropy, p.refs.get(e.k), mask, old, adv)
                weight = micro_batch_weight(mb, p.n_seq, p.n_tok, p.unit)
                total = total + loss * weight
                p.total_loss = p.total_loss + loss.detach() * weight
                for name, v in metrics.items():
                    p.sums[name] = p.sums.get(name, 0.0) + v * weight
                p.tokens += n_positions  # the forward's positions in the job's rows
            assert isinstance(total, torch.Tensor)
            total.backward()  # each job's factors get the gradient of its own loss only
    return plans, stack


@dataclass(eq=False)
class _Entry(_Rows):
    """Micro-batch `k` of a job's step (`plan`) in one grouped forward: its rows are that micro-batch alone."""

    plan: _Plan
    k: int


def _forward_groups(plans: list[_Plan], per_job: int) -> list[list[_Entry]]:
    """The grouped forwards of a step, in order: forward g holds micro-batches g*per_job ... (g+1)*per_job - 1 of
    every job that has them (learner.pack_micro_batches), a job's together and the jobs in order, so that each job's
    rows are one span (RowAdapters). per_job 1: every job's k-th micro-batch, forward k."""
    depth = max(len(p.batches) for p in plans)
    groups = []
    for start in range(0, depth, per_job):
        ks = range(start, min(start + per_job, depth))
        groups.append(
            [_Entry(p.algorithm, [p.batches[k]], p.factors, p, k) for p in plans for k in ks if k < len(p.batches)]
        )
    return groups


def _alone(job: JobStep, call: Callable[[], Any]) -> Any:
    """`call()` with `job`'s adapter and state entered: what a job outside a grouped step runs (its step or its
    probe's logprobs), its error returned as a JobError so that its pack mates go on."""
    job.enter()
    try:
        return call()
    except Exception as e:  # raised in the job's own thread (JobGroup.result), its pack mates unaffected
        return JobError(e)
    finally:
        job.leave()


def _step_alone(learner: Any, job: JobStep) -> dict[str, float] | JobError:
    return _alone(job, lambda: learner.train_step(job.samples) | {"pack/grouped_jobs": 1.0})


def _logprobs_alone(learner: Any, job: JobStep) -> list[list[float]] | JobError:
    return _alone(job, lambda: learner.sequence_logprobs(*job.samples))


def logprobs_grouped(learner: Any, jobs: Sequence[JobStep]) -> list[list[list[float]] | JobError]:
    """Each job's `sequence_logprobs(prompts, completions)` (`job.samples`: that pair) in one no-grad forward per
    grouped micro-batch, each row through its own job's factors: the sync probes of a pack's jobs after a grouped
    step score their samples in one forward, where one forward per job ran one after another. Job after job where
    the step would be (`prepare`)."""
    if len(jobs) < 2 or prepare(learner) is not None:
        return [_logprobs_alone(learner, job) for job in jobs]
    rows = []
    for job in jobs:
        job.enter()
        try:
            pair: Any = job.samples  # this call's samples: (prompts, completions)
            prompts, completions = pair
            samples = [TrainSample(p, c, [0.0] * len(c), 0.0) for p, c in zip(prompts, completions)]
            factors = {n: p.data for n, p in learner.pack_tensors().items()}
            rows.append(_Rows(learner.algorithm, learner._micro_batches(samples), factors))
        finally:
            job.leave()
    out: list[list[list[float]]] = [[] for _ in rows]
    forward = _GroupedForward(learner)
    unsloth = learner.model_cfg.learner_backend == LearnerBackend.unsloth
    learner.model.eval()
    try:
        stack = StackedFactors(learner.model, [r.factors for r in rows])
        with torch.no_grad(), RowAdapters(stack, in_input_dtype=unsloth) as adapters:
            for k in range(max(len(r.batches) for r in rows)):
                part = [j for j, r in enumerate(rows) if k < len(r.batches)]
                split = forward(learner.model, [rows[j] for j in part], k, lambda a: "none", adapters, rows)
                for j, (logp, *_) in zip(part, split):
                    out[j].extend(logp[i, : len(s.completion_ids)].tolist() for i, s in enumerate(rows[j].batches[k]))
    except Exception as e:
        log.warning("the grouped sync-probe forward failed (%s); its jobs are scored one after another", e)
        return [_logprobs_alone(learner, job) for job in jobs]
    finally:
        learner.model.train()
    scored: list[list[list[float]] | JobError] = list(out)
    return scored


class _GroupedForward:
    """One forward of the k-th micro-batches of some jobs, split back per job. Padded micro-batches: their rows
    concatenated, padded to the longest (rows are samples); packed rows: each job's micro-batch packed as its solo
    step packs it (its prompts shared within it) and the rows concatenated along the tokens (packing.concat), each
    job's LoRA span a token range."""

    def __init__(self, learner: Any):
        self.learner, self.packed = learner, learner.batcher.packed
        self.padded = Batcher(learner.device, share_prompt_prefix=False, logits_to_keep=learner.policy.logits_to_keep)

    def __call__(
        self,
        model: Any,
        part: Sequence[_Rows],
        k: int,
        entropy: Callable[[AlgorithmConfig], str],
        adapters: RowAdapters | None = None,
        plans: Sequence[_Rows] | None = None,
    ) -> list[tuple]:
        """Per job of `part`: its completion-aligned logprobs and entropy [B_j, C_j] (under its own temperature and
        min-p), its loss mask, behaviour logprobs and advantages, and the token positions its rows took in the
        forward. `adapters`: told each job of `plans` its span first (0 for a job not in `part`)."""
        mbs = [p.batches[k] for p in part]
        batcher = self.learner.batcher
        if self.packed:
            singles = [packing.pack(mb, batcher.share_prompt_prefix, self.learner.device, self.packed) for mb in mbs]
            spans = [r.input_ids.shape[1] for r in singles]
            if adapters is not None and plans is not None:
                adapters.rows(_spans(plans, part, spans), dim=1)
            logits = batcher.row_logits(model, packing.concat(singles, [len(mb) for mb in mbs]))  # [1, T, V]
            widths = [r.targets.shape[1] for r in singles]
        else:
            spans = [len(mb) for mb in mbs]
            if adapters is not None and plans is not None:
                adapters.rows(_spans(plans, part, spans), dim=0)
            logits, targets, index, n_positions = self.padded.logits(model, [s for mb in mbs for s in mb])
            widths = spans
        out, start = [], 0
        for j, (p, mb) in enumerate(zip(part, mbs)):
            a, end = p.algorithm, start + widths[j]
            mask, old, adv = batcher.completion_batch(mb)  # [B_j, C_j]
            if self.packed:
                row = singles[j]
                logp, ent = position_logprobs(
                    logits[:, start:end], row.targets, a.temperature, min_p=a.min_p, entropy=entropy(a)
                )
                logp = packing.unpack(logp, row, tuple(mask.shape))
                ent = None if ent is None else packing.unpack(ent, row, tuple(mask.shape))
                positions = spans[j]
            else:
                logp, ent = position_logprobs(
                    logits[start:end], targets[start:end], a.temperature, min_p=a.min_p, entropy=entropy(a)
                )
                at = index[start:end, : mask.shape[1]]
                logp, ent = torch.gather(logp, 1, at), None if ent is None else torch.gather(ent, 1, at)
                positions = n_positions * len(mb) // len(targets)
            out.append((logp, ent, mask, old, adv, positions))
            start = end
        return out


def _spans(plans: Sequence[_Rows], part: Sequence[_Rows], spans: list[int]) -> list[int]:
    """Each of `plans`' rows in the forward: the spans of its items of `part` (itself, or its micro-batches' entries,
    which are consecutive), 0 where it has none."""
    size: dict[int, int] = {}
    for p, n in zip(part, spans):
        key = id(p.plan if isinstance(p, _Entry) else p)
        size[key] = size.get(key, 0) + n
    return [size.get(id(p), 0) for p in plans]
