"""The PEFT learner on a tiny random model: prompt-prefix sharing is exact, the adapter round-trips, and a step
moves the adapter only when there is signal."""

from __future__ import annotations

import copy
import math
import sys

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_module

from rl.app import learner_args
from rl.learner import Learner
from rl.resolve import from_overrides
from rl.types import Sampling, TrainSample
from tests.helpers import LEARNER_TEST_OVERRIDES, make_learner, make_samples


def test_shared_prefix_logprobs_equal_full_forward(tiny_model):
    from rl.learner.batching import Batcher

    learner = make_learner(tiny_model)
    group = make_samples(groups=1, group_size=4)
    mask, _, _ = learner.batcher.completion_batch(group)
    shared, full = (Batcher(learner.device, share_prompt_prefix=s, logits_to_keep=True) for s in (True, False))
    with torch.no_grad():
        a, ent_a, _ = shared.logprobs(learner.model, group, entropy="metric")
        b, ent_b, _ = full.logprobs(learner.model, group, entropy="metric")
    real = mask > 0
    assert torch.allclose(a[real], b[real], atol=1e-4)
    assert torch.allclose(ent_a[real], ent_b[real], atol=1e-4)


def test_padded_logprobs_are_each_samples_own(tiny_model):
    """A right-padded micro-batch of different prompt and completion lengths gives every sample the logprobs (and
    entropies) of its own forward alone: the per-position values land on the right completion tokens."""
    from rl.learner.batching import Batcher

    learner = make_learner(tiny_model)
    samples = [
        TrainSample([5, 6, 7, 8, 9], [10, 11], [0.0] * 2, 1.0),
        TrainSample([12, 13], [14, 15, 16, 17, 18], [0.0] * 5, 1.0),
        TrainSample([19, 20, 21], [22, 23, 24], [0.0] * 3, 1.0),
    ]
    for keep in (True, False):
        batcher = Batcher(learner.device, share_prompt_prefix=False, logits_to_keep=keep)
        with torch.no_grad():
            logp, ent, _ = batcher.logprobs(learner.model, samples, 0.7, entropy="metric")
            for i, s in enumerate(samples):
                alone, alone_ent, _ = batcher.logprobs(learner.model, [s], 0.7, entropy="metric")
                c = len(s.completion_ids)
                assert torch.allclose(logp[i, :c], alone[0], atol=1e-4), (keep, i)
                assert torch.allclose(ent[i, :c], alone_ent[0], atol=1e-4), (keep, i)


def test_shared_prefix_step_matches_unshared_step(tiny_model):
    samples = make_samples()
    a = make_learner(
        tiny_model, "learner.share_prompt_prefix=true", "learner.micro_batch_tokens=0", "learner.micro_batch_size=4"
    )
    b = make_learner(
        tiny_model, "learner.share_prompt_prefix=false", "learner.micro_batch_tokens=0", "learner.micro_batch_size=4"
    )
    assert_same_step(a, b, samples, grad_norm_rel=1e-3)


def test_the_kv_cache_prompt_is_shared_only_where_it_pays():
    """share_prompt_prefix: packed rows always hold a group's prompt once; padded micro-batches share it through a
    KV cache only on CPU, and never under gradient checkpointing (use_cache is off there)."""
    from rl.learner.learner import shares_prompt

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert shares_prompt(packed=True, checkpointing=True, device=cuda)
    assert shares_prompt(packed=False, checkpointing=False, device=cpu)
    assert not shares_prompt(packed=False, checkpointing=False, device=cuda)
    assert not shares_prompt(packed=False, checkpointing=True, device=cpu)


def assert_same_step(a, b, samples, grad_norm_rel):
    """Learners a and b, built alike, take one step on `samples`: the same loss, gradient norm and update."""
    ma, mb = a.train_step(samples), b.train_step(samples)
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-5)
    assert ma["train/grad_norm"] == pytest.approx(mb["train/grad_norm"], rel=grad_norm_rel)
    pa = dict(a.model.named_parameters())
    for name, p in b.model.named_parameters():
        if p.requires_grad:
            assert torch.allclose(p, pa[name], atol=1e-6), name


def test_micro_batches_never_mix_prompts(tiny_model):
    learner = make_learner(tiny_model, "learner.micro_batch_tokens=0", "learner.micro_batch_size=3")
    samples = make_samples(groups=2, group_size=4)
    batches = learner._micro_batches(samples)
    assert [len(b) for b in batches] == [3, 1, 3, 1]
    assert all(len({tuple(s.prompt_ids) for s in b}) == 1 for b in batches)
    assert learner.train_step(samples)["train/micro_batches"] == 4  # the step reports how many forwards it ran


def test_zero_advantage_batch_leaves_adapter_unchanged(tiny_model):
    learner = make_learner(tiny_model)
    before = learner.adapter_checksum()
    samples = [TrainSample(s.prompt_ids, s.completion_ids, s.old_logprobs, 0.0) for s in make_samples()]
    metrics = learner.train_step(samples)
    assert metrics["train/samples_with_signal"] == 0
    assert learner.adapter_checksum() == before
    moved = learner.train_step(make_samples())
    assert moved["train/grad_norm"] > 0 and learner.adapter_checksum() != before


def test_adapter_round_trips_through_bytes(tiny_model):
    from safetensors.torch import load

    learner = make_learner(tiny_model)
    adapter = learner.get_adapter()
    tensors = load(adapter.weights)
    assert adapter.config["r"] == 16 and sorted(adapter.config["target_modules"]) == ["q_proj", "up_proj", "v_proj"]
    assert any("lora_B" in k and float(v.abs().sum()) > 0 for k, v in tensors.items())


def test_the_adapter_unpickles_without_peft(tiny_model):
    """What crosses Ray at every sync is plain data: unpickling it (in the driver, in an actor) imports no PEFT or
    transformers, whose import would land on the first sync (a PEFT enum in the config did that)."""
    import pickle
    import subprocess

    from tests.helpers import REPO, repo_env

    adapter = make_learner(tiny_model).get_adapter(for_sync=True)
    assert adapter.config["peft_type"] == "LORA" and adapter.config["target_modules"] == ["q_proj", "up_proj", "v_proj"]
    probe = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print(sorted(m for m in ('peft', 'transformers') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], input=pickle.dumps(adapter), capture_output=True, cwd=REPO, env=repo_env()
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().strip() == "[]"


def test_sync_adapter_travels_in_the_engine_dtype_and_saved_adapters_keep_fp32(tiny_model):
    from safetensors.torch import load

    learner = make_learner(tiny_model, "model.dtype=bfloat16")  # a bf16 vLLM engine: factors sent in bf16
    full, wire = load(learner.get_adapter().weights), load(learner.get_adapter(for_sync=True).weights)
    assert {v.dtype for v in full.values()} == {torch.float32} and {v.dtype for v in wire.values()} == {torch.bfloat16}
    assert all(torch.equal(wire[k], full[k].to(torch.bfloat16)) for k in full)


def test_the_exported_adapter_is_pefts_state_dict_after_steps_and_loads(tiny_model):
    """The export finds the adapter's parameters once and then reads the live tensors: after a training step and
    after `load_state` (an in-place copy) the bytes still hold exactly what PEFT's state dict holds."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load

    def assert_exported_is_peft(learner):
        wire = load(learner.get_adapter().weights)
        peft = get_peft_model_state_dict(learner.model)
        assert wire.keys() == peft.keys() and all(torch.equal(wire[k], peft[k].cpu()) for k in peft)

    learner = make_learner(tiny_model)
    assert_exported_is_peft(learner)
    learner.train_step(make_samples())
    assert_exported_is_peft(learner)
    learner.load_state(make_learner(tiny_model, "run.seed=1").state_dict())
    assert_exported_is_peft(learner)


def test_full_finetune_trains_every_parameter_against_a_frozen_reference(tiny_model):
    """Full fine-tuning: no LoRA, every parameter moves; the KL reference is a frozen copy of the initial weights
    (not the live model), and the weights round-trip through get_adapter / load_state."""
    learner = full_learner(tiny_model, "algorithm.kl_coef=0.1")
    assert not any("lora" in n for n, _ in learner.model.named_parameters())
    ref_model = learner.policy.ref_model
    assert ref_model is not None and not any(p.requires_grad for p in ref_model.parameters())
    samples = make_samples()
    prompts, comps = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    before = learner.sequence_logprobs(prompts, comps)
    start = learner.get_adapter()
    assert start.config["full_weights"]
    metrics = learner.train_step(samples)
    assert metrics["train/skipped_nonfinite"] == 0 and "policy/kl_ref" in metrics
    after = learner.sequence_logprobs(prompts, comps)
    reference = learner.sequence_logprobs(prompts, comps, reference=True)
    assert max(abs(x - y) for a, b in zip(before, after) for x, y in zip(a, b)) > 1e-4  # the policy moved
    assert max(abs(x - y) for a, b in zip(before, reference) for x, y in zip(a, b)) < 1e-5  # the reference did not

    other = full_learner(tiny_model, "run.seed=1")
    assert other.policy.ref_model is None  # no KL, no copy
    other.load_state(learner.state_dict())
    assert other.adapter_checksum() == learner.adapter_checksum()
    with pytest.raises(RuntimeError, match="keeps no reference copy"):
        other.sequence_logprobs(prompts[:1], comps[:1], reference=True)


def full_learner(model, *overrides: str) -> Learner:
    return Learner(
        **learner_args(from_overrides(str(model), *LEARNER_TEST_OVERRIDES, "model.full_finetune=true", *overrides))
    )


def test_cuda_only_backends_fail_clearly_on_a_process_without_gpu(tiny_model):
    """The config refuses them without cluster.use_gpu (tests/unit/test_config.py); a learner process that was
    promised a GPU and sees none says so."""

    def on_gpu(*keys: str):
        return from_overrides(str(tiny_model), *LEARNER_TEST_OVERRIDES, "cluster.use_gpu=true", *keys)

    with pytest.raises(
        RuntimeError, match="model.learner_backend=unsloth needs a CUDA GPU, and this learner's process sees none"
    ):
        Learner(**learner_args(on_gpu("model.learner_backend=unsloth")))
    with pytest.raises(RuntimeError, match="model.load_in_4bit=true needs a CUDA GPU"):
        Learner(**learner_args(on_gpu("model.learner_backend=peft", "model.load_in_4bit=true")))
    assert from_overrides(str(tiny_model)).model.learner_backend == "peft"  # auto without GPUs


def test_nonfinite_loss_skips_the_optimizer_step(tiny_model):
    """The skip is decided on the device (the fused AdamW's `found_inf`): neither the weights nor AdamW's moments
    and step count see the NaN step, on a fresh optimizer and after a good step."""
    learner = make_learner(tiny_model)
    bad = make_samples()
    bad[0].advantage = float("nan")  # e.g. a NaN reward: its group's advantages are NaN
    for _ in range(2):  # first on a fresh optimizer, then after the good step that ends the loop
        before, state = learner.adapter_checksum(), copy.deepcopy(learner.optimizer.state_dict()["state"])
        metrics = learner.train_step(bad)
        assert metrics["train/skipped_nonfinite"] == 1.0 and not math.isfinite(metrics["train/loss"])
        assert learner.adapter_checksum() == before  # the weights never saw the NaN
        after = learner.optimizer.state_dict()["state"]
        for i, s in state.items():
            assert all(torch.equal(s[k], after[i][k]) for k in s), i
        assert learner.train_step(make_samples())["train/skipped_nonfinite"] == 0.0
        assert learner.adapter_checksum() != before
    assert int(learner.optimizer.state_dict()["state"][0]["step"]) == 2  # the two good steps only


@pytest.mark.parametrize("packed", [[], ["learner.micro_batch_tokens=64"]], ids=["padded", "packed"])
def test_learner_generation_logprobs_are_the_learners_own_at_the_temperature(tiny_model, packed):
    """Also with packing on: generation (left-padded, KV cache) goes through the packed learner's attention
    function without segments, and the packed sequence_logprobs rescore it."""
    learner = make_learner(tiny_model, "algorithm.temperature=0.7", *packed)
    learner.version = 3
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    rollouts = learner.generate(prompts, Sampling(n=2, temperature=0.7, max_tokens=6))
    assert [r.prompt_ids for r in rollouts] == prompts and {r.adapter_version for r in rollouts} == {3}
    comps = [(r.prompt_ids, c) for r in rollouts for c in r.completions]
    assert len(comps) == 4 and all(1 <= len(c.token_ids) == len(c.logprobs) <= 6 for _, c in comps)
    # the behaviour logprobs are the learner's own (processed: after temperature), so the first ratio is 1
    again = learner.sequence_logprobs([p for p, _ in comps], [c.token_ids for _, c in comps])
    for (_, c), lp in zip(comps, again):
        assert lp == pytest.approx(c.logprobs, abs=1e-4)
    assert learner.model.training  # back to training mode


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_from_the_shared_logsumexp_equals_the_separate_softmax(temperature):
    from rl.algorithms import token_entropy
    from rl.learner import token_logprobs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 50, generator=g) * 4
    targets = torch.randint(0, 50, (3, 5), generator=g)
    logp, entropy = token_logprobs(logits, targets, temperature, with_entropy=True)
    assert torch.equal(logp, token_logprobs(logits, targets, temperature))
    torch.testing.assert_close(entropy, token_entropy(logits / temperature), rtol=1e-4, atol=1e-4)
    assert not entropy.requires_grad


@pytest.mark.parametrize("share", ["true", "false"])
def test_cpu_short_eager_attention_gives_the_sdpa_step(tiny_model, share, monkeypatch):
    """The CPU learner's attention (eager for short backpropagated sequences, rl/learner/attention.py) gives SDPA's
    loss, gradients and update, and takes the eager path only where it is meant to."""
    from rl.learner import attention

    samples = make_samples()
    long_prompt = make_samples(groups=1, group_size=2, seed=3)
    long_prompt = [TrainSample(s.prompt_ids * 30, s.completion_ids, s.old_logprobs, s.advantage) for s in long_prompt]
    a = make_learner(
        tiny_model,
        f"learner.share_prompt_prefix={share}",
        "learner.micro_batch_tokens=0",
        "learner.micro_batch_size=4",
        "algorithm.kl_coef=0.05",
    )
    b = make_learner(
        tiny_model,
        f"learner.share_prompt_prefix={share}",
        "learner.micro_batch_tokens=0",
        "learner.micro_batch_size=4",
        "algorithm.kl_coef=0.05",
    )
    assert a.model.get_base_model().config._attn_implementation == attention.ATTENTION
    b.model.get_base_model().set_attn_implementation("sdpa")
    calls = []  # (path, keys, gradient on): what the model's attention really ran

    def spying(path, real):
        def spy(module, query, key, *args, **kw):
            calls.append((path, key.shape[-2], torch.is_grad_enabled()))
            return real(module, query, key, *args, **kw)

        return spy

    model_module = sys.modules[type(a.model.get_base_model().model.layers[0].self_attn).__module__]
    spied = [("eager", model_module, "eager_attention_forward"), ("sdpa", sdpa_module, "sdpa_attention_forward")]
    for path, owner, name in spied:
        monkeypatch.setattr(owner, name, spying(path, getattr(owner, name)))
    assert_same_step(a, b, samples + long_prompt, grad_norm_rel=1e-4)
    eager = [(k, grad) for path, k, grad in calls if path == "eager"]
    assert eager and all(k <= attention.EAGER_MAX_KEYS and grad for k, grad in eager)  # short ones with gradient
    sdpa = [(k, grad) for path, k, grad in calls if path == "sdpa"]
    assert any(k > attention.EAGER_MAX_KEYS for k, grad in sdpa)  # the long prompt's
    assert any(k <= attention.EAGER_MAX_KEYS and not grad for k, grad in sdpa)  # the no-grad reference's


def test_a_learner_started_from_an_adapter_trains_it_and_keeps_it_as_the_kl_reference(tiny_model, tmp_path):
    """model.init_adapter: the learner starts with the adapter's weights (its policy is the adapter's), and with a
    KL its reference is that starting policy, also after a step changed the adapter, not the base model."""
    from rl.loop.checkpoint import write_adapter
    from tests.helpers import run_spec

    donor = make_learner(tiny_model)  # random lora_B: an adapter that changes logprobs
    write_adapter(donor.get_adapter(), tmp_path / "start")
    samples = make_samples()
    prompts, completions = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    start = donor.sequence_logprobs(prompts, completions)
    base = donor.sequence_logprobs(prompts, completions, reference=True)
    overrides = (*LEARNER_TEST_OVERRIDES, f"model.init_adapter={tmp_path / 'start'}", "algorithm.kl_coef=0.1")
    learner = Learner(**learner_args(run_spec(tiny_model, *overrides, "algorithm.lr=1e-2")))
    assert learner.sequence_logprobs(prompts, completions) == start != base
    learner.train_step(samples)
    assert learner.sequence_logprobs(prompts, completions) != start  # the step trained the starting adapter
    assert learner.sequence_logprobs(prompts, completions, reference=True) == start


def test_the_reference_switches_the_adapter_off_as_peft_does_without_walking_the_model(tiny_model, monkeypatch):
    """The KL reference (adapter off) is the base model, as PEFT's `disable_adapter()` gives it; leaving it turns
    the adapter back on, also after an error inside, and leaves the adapter trainable. It flips the adapter layers'
    switches without walking the model's modules each time (PEFT's context walks every layer's parameters: tens of
    milliseconds a micro-batch at SmolLM2's size)."""
    learner = make_learner(tiny_model)
    samples = make_samples(groups=1, group_size=2)
    prompts, completions = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    policy = learner.sequence_logprobs(prompts, completions)
    ours = learner.sequence_logprobs(prompts, completions, reference=True)
    with learner.model.disable_adapter():
        peft = learner.sequence_logprobs(prompts, completions)
    assert ours == peft != policy
    walks = 0
    named_modules = torch.nn.Module.named_modules

    def counted(self, *args, **kwargs):
        nonlocal walks
        walks += 1
        return named_modules(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(torch.nn.Module, "named_modules", counted)
        with pytest.raises(ValueError), learner.policy.reference():
            raise ValueError("inside the reference")
    assert walks == 0
    assert learner.sequence_logprobs(prompts, completions) == policy
    lora = [p for n, p in learner.model.named_parameters() if "lora_" in n]
    assert lora and all(p.requires_grad for p in lora)
