"""Padding-free packed micro-batches (micro_batch_tokens > 0) give the same loss and gradients as padded
ones, for losses normalised per token, per sequence and by a constant, with loss masks that have zeros inside a
completion (multi-turn environment tokens); fp32 on the tiny model, on CPU (the SDPA-per-segment attention)."""

from __future__ import annotations

import random
import traceback

import pytest
import torch

from rl.learner.packing import pack_micro_batches
from rl.types import TrainSample
from tests.helpers import make_learner

BUDGET = 48  # row tokens per packed micro-batch: several micro-batches, and one sample longer than a row


def varied_samples(learner, seed: int = 0) -> list[TrainSample]:
    """3 prompts (4, 9, 13 tokens) x 4 completions of 1-40 tokens; loss masks with zeros inside some completions
    and one fully masked; one zero advantage; behaviour logprobs near the policy's (so that GSPO's narrow clip
    range leaves gradient), each perturbed by up to 0.05."""
    rng = random.Random(seed)
    out = []
    for plen in (4, 9, 13):
        prompt = [rng.randrange(10, 4000) for _ in range(plen)]
        for n in rng.sample([1, 3, 7, 12, 23, 40], 4):
            comp = [rng.randrange(10, 4000) for _ in range(n)]
            mask = [1] * n
            if n >= 7:  # an "environment" span inside the completion: not trained on
                a = rng.randrange(1, n - 3)
                mask[a : a + 3] = [0, 0, 0]
            out.append(TrainSample(prompt, comp, [0.0] * n, rng.gauss(0, 1), mask))
    out[5].loss_mask = [0] * len(out[5].completion_ids)
    out[7].advantage = 0.0
    logps = learner.sequence_logprobs([s.prompt_ids for s in out], [s.completion_ids for s in out])
    for s, lp in zip(out, logps):
        s.old_logprobs = [x + rng.uniform(-0.05, 0.05) for x in lp]
    return out


def grads(learner) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.requires_grad and p.grad is not None}


CASES = {
    "grpo": ["algorithm=grpo"],  # clipped ratio, mean over sequences of token means
    "dapo": ["algorithm=dapo"],  # token mean over the batch
    "dr_grpo": ["algorithm=dr_grpo"],  # token sums over a constant
    "gspo": ["algorithm=gspo"],  # sequence-level ratio
    "pg_kl_entropy": ["algorithm=pg", "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01"],  # reference forward
}


@pytest.mark.parametrize("case", list(CASES))
def test_packed_step_equals_padded_step(tiny_model, case):
    base = [*CASES[case], "algorithm.max_grad_norm=0"]  # no clipping: compare raw gradients
    padded = make_learner(
        tiny_model,
        *base,
        "learner.share_prompt_prefix=false",
        "learner.micro_batch_tokens=0",
        "learner.micro_batch_size=3",
    )
    samples = varied_samples(padded)
    want = padded.train_step(samples)
    want_grads = grads(padded)
    assert want["train/grad_norm"] > 0
    for share in ("false", "true"):
        packed = make_learner(
            tiny_model, *base, f"learner.share_prompt_prefix={share}", f"learner.micro_batch_tokens={BUDGET}"
        )
        assert packed.batcher.packed == "sdpa" and len(packed._micro_batches(samples)) > 1
        got = packed.train_step(samples)
        # the loss and gradient are exact whatever the split; per-micro-batch metrics (ratio max, means weighted
        # by sequence share) depend on where the split falls, so they are not compared
        for key in ("train/loss", "train/grad_norm", "train/samples_with_signal", "train/skipped_nonfinite"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (share, key)
        got_grads = grads(packed)
        assert got_grads.keys() == want_grads.keys()
        for name, g in want_grads.items():
            assert torch.allclose(got_grads[name], g, rtol=1e-4, atol=1e-7), (share, name)


def test_packed_sequence_logprobs_equal_padded(tiny_model):
    padded = make_learner(tiny_model, "learner.share_prompt_prefix=false")
    packed = make_learner(tiny_model, "learner.micro_batch_tokens=30")
    samples = varied_samples(padded)
    prompts, comps = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    want, got = padded.sequence_logprobs(prompts, comps), packed.sequence_logprobs(prompts, comps)
    assert [len(x) for x in got] == [len(c) for c in comps]
    assert max(abs(a - b) for x, y in zip(got, want) for a, b in zip(x, y)) < 1e-5


def test_packed_micro_batches_fill_the_token_budget():
    def s(prompt, n):
        return TrainSample(prompt, [1] * n, [0.0] * n, 1.0)

    p, q = [7] * 10, [8] * 10
    samples = [s(p, 5), s(p, 5), s(p, 30), s(q, 5), s(q, 100), s(q, 5)]
    # each sample costs its prompt and completion: 15, 15 | 40 | 15 | 110 (over budget: alone) | 15
    assert [len(b) for b in pack_micro_batches(samples, 40, share_prompt_prefix=False)] == [2, 1, 1, 1, 1]
    # a shared prompt costs once per row: 15 + 5 + 30 = 50 > 40 | 40 | 15 | 110 | ...
    assert [len(b) for b in pack_micro_batches(samples, 50, share_prompt_prefix=True)] == [3, 1, 1, 1]


def test_packing_refuses_a_model_whose_attention_ignores_the_segments(tiny_model):
    """transformers' own SDPA keeps packed sequences apart by their position ids, but not a completion that
    continues a shared prompt (its positions do not restart): the start-up check catches it."""
    learner = make_learner(tiny_model, "learner.micro_batch_tokens=64")
    learner.model.get_base_model().set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="does not keep packed sequences apart.*micro_batch_tokens=0"):
        learner.batcher.check_packing(learner.model)


def test_auto_packs_on_cpu_and_falls_back_to_padded_where_the_model_refuses(tiny_model, monkeypatch):
    """learner.micro_batch_tokens=null (auto, the default) packs a PEFT learner's rows (CPU and GPU budgets) and pads with
    Unsloth and in deterministic GPU runs; where the model's attention would mix packed sequences, the learner trains
    padded with a warning, whether auto chose the budget or the config gave it (resolved, either is a number; Unsloth,
    whose attention would mix them, is refused packed rows at config load)."""
    from rl.resolve import CPU_PACKED_TOKENS, GPU_PACKED_TOKENS, from_overrides
    from tests.helpers import LEARNER_TEST_OVERRIDES

    auto = make_learner(tiny_model)
    assert auto.batcher.packed == "sdpa" and auto.learner_cfg.micro_batch_tokens == CPU_PACKED_TOKENS

    def gpu_tokens(*keys: str) -> int:
        cfg = from_overrides(str(tiny_model), *LEARNER_TEST_OVERRIDES, "cluster.use_gpu=true", *keys)
        return cfg.learner.micro_batch_tokens

    assert gpu_tokens("model.learner_backend=peft", "learner.micro_batch_size=64") == GPU_PACKED_TOKENS
    # never more than the padded micro-batch's worst case: 16 x (256 prompt + 32 new tokens) by default
    assert gpu_tokens("model.learner_backend=peft") == 16 * (256 + 32)
    assert gpu_tokens("model.learner_backend=unsloth") == 0
    assert gpu_tokens("model.learner_backend=peft", "run.deterministic=true") == 0
    assert gpu_tokens("model.learner_backend=peft", "learner.micro_batch_tokens=0") == 0
    monkeypatch.setattr("rl.learner.packing.use_packed_attention", lambda model: None)  # plain SDPA: mixes them
    with pytest.warns(UserWarning, match=f"learner.micro_batch_tokens={CPU_PACKED_TOKENS}: padded micro-batches"):
        learner = make_learner(tiny_model)
    assert learner.batcher.packed is None and learner.train_step(varied_samples(learner))["train/loss"] != 0
    with pytest.warns(UserWarning, match="micro_batch_tokens=64: padded.*does not keep packed sequences apart"):
        explicit = make_learner(tiny_model, "learner.micro_batch_tokens=64")
    assert explicit.batcher.packed is None


@pytest.mark.parametrize("tokens", [0, BUDGET])
def test_a_step_reads_device_values_only_at_its_end(tiny_model, monkeypatch, tokens):
    """On a GPU every read of a tensor's value (bool(), int(), .item(), .tolist()) makes the host wait for the GPU;
    between micro-batches that drains its queue. A step reads one value set, its metrics at the end: our code reads
    none before, and in packed rows transformers reads none either (it gets the 4D placeholder mask instead of
    looking for packed sequences in the position ids). Padded rows keep transformers' own check of the padding
    mask (one per forward), which no argument avoids without giving up SDPA's causal kernel."""
    learner = make_learner(tiny_model, f"learner.micro_batch_tokens={tokens}", "learner.micro_batch_size=4")
    samples = varied_samples(learner)
    learner.train_step(samples)
    reads = []

    def counted(name: str):
        orig = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = next(f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename)
            reads.append(f"{name} at {caller.filename}:{caller.lineno}")
            return orig(self, *args, **kwargs)

        return read

    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    metrics = learner.train_step(samples)
    monkeypatch.undo()
    assert metrics["train/micro_batches"] > 1
    ours = [r for r in reads if "/transformers/" not in r]
    assert len(ours) == 1 and ours[0].startswith("tolist at") and "batching.py" in ours[0], reads
    if tokens:
        assert reads == ours, reads
