"""Preflight plan (rl/preflight/plan.py, memory.py; `train.py plan=true`): parameter counts and memory of Qwen2.5
shapes against hand arithmetic and published numbers, the GPU map, the config-facing wrapper, and the CLI (no Ray,
no vLLM, no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from rl.config.schema import ConfigError, TrainConfig
from rl.preflight import machine, memory, plan, shapes
from tests.helpers import QWEN_05B, REPO, run_train

# config.json fields of Qwen/Qwen2.5-7B-Instruct (written by hand from the hub file; QWEN_05B is the 0.5B's)
QWEN_7B = {
    **QWEN_05B,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_dir(tmp_path, cfg, name="model"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_parameter_counts_match_hand_arithmetic_and_the_model_cards():
    small, big = shapes.ModelShape.from_hf_config(QWEN_05B), shapes.ModelShape.from_hf_config(QWEN_7B)
    # 0.5B: per layer q 896*896 + k,v 896*128 each + o 896*896 + MLP 3*896*4864 = 14,909,440 linear weights,
    # q/k/v biases 896+128+128, two norms; tied 151936x896 embedding; final norm
    linear = 24 * (896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864)
    assert small.block_linear_weights == linear == 357_826_560
    assert small.params == linear + 24 * 1152 + 24 * 2 * 896 + 896 + 151936 * 896 == 494_032_768  # card: 0.49B
    # 7B: untied head, so the 152064x3584 embedding counts twice
    linear = 28 * (3584 * 3584 * 2 + 3584 * 512 * 2 + 3 * 3584 * 18944)
    assert big.params == linear + 28 * 4608 + 28 * 2 * 3584 + 3584 + 2 * 152064 * 3584 == 7_615_616_512  # 7.61B
    # PEFT prints "trainable params: 8,798,208" for r=16 on all seven projections of Qwen2.5-0.5B
    assert small.lora_params(16, ALL_TARGETS) == 8_798_208
    assert big.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57_344  # K and V, 4 KV heads of 128, bf16
    assert big.flops_per_token() == 2 * big.params and big.flops_per_token(train=True) == 6 * big.params


def test_the_embedded_model_is_sized_from_its_gguf_before_the_first_run_converts_it(tmp_path, monkeypatch):
    """plan=true before any run: the embedded model's shape from its GGUF's metadata (SmolLM2-135M-Instruct's card:
    30 layers, hidden 576, 9 heads / 3 KV heads, tied embeddings), nothing converted or written to the cache."""
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path / "cache"))
    shape, source = shapes.load_shape("embedded:smollm2-135m-instruct")
    assert shape is not None and source.endswith(".gguf (its metadata; the first run converts it)")
    assert (shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads) == (30, 576, 1536, 9, 3)
    assert shape.vocab == 49152 and shape.tied_embeddings and shape.dtype == "bfloat16"
    assert 134e6 < shape.params < 135e6  # "135M"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("config", [QWEN_05B, QWEN_7B], ids=["0.5B", "7B"])
def test_weight_bytes_bf16_and_4bit(config):
    shape = shapes.ModelShape.from_hf_config(config)
    assert shape.weight_bytes(2) == 2 * shape.params
    # by hand: half a byte per linear weight of the blocks, bf16 for embeddings, head, norms and biases;
    # NF4's per-block constants add 0.127 bit per weight on top
    hand = 0.5 * shape.block_linear_weights + 2 * (shape.params - shape.block_linear_weights)
    four_bit = shape.weight_bytes(2, load_in_4bit=True)
    assert hand < four_bit < 1.03 * hand
    assert four_bit == pytest.approx(hand + shape.block_linear_weights * 0.127 / 8, rel=1e-4)


def test_7b_4bit_is_about_a_third_of_bf16():
    shape = shapes.ModelShape.from_hf_config(QWEN_7B)
    assert shape.weight_bytes(2) / 2**30 == pytest.approx(14.185, abs=0.001)
    assert shape.weight_bytes(2, load_in_4bit=True) / 2**30 == pytest.approx(5.166, abs=0.001)


def estimate(shape, **overrides):
    kwargs = dict(
        use_gpu=True,
        device_bytes=80 * 2**30,
        actor_dtype="bfloat16",
        learner_dtype="bfloat16",
        load_in_4bit=False,
        full_finetune=False,
        lora_rank=16,
        lora_targets=ALL_TARGETS,
        max_prompt_tokens=512,
        max_new_tokens=512,
        micro_batch_size=8,
        sequences_per_actor=64,
        gpus_per_actor=1,
        gpu_memory_utilization=0.5,
    )
    return memory.estimate_memory(shape, **{**kwargs, **overrides})


def test_learner_parts_lora_full_and_4bit():
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    lora = estimate(shape)["learner"]
    assert lora.parts["gradients"] == 4 * 8_798_208  # fp32 LoRA gradients
    assert lora.parts["AdamW moments"] == 2 * 4 * 8_798_208
    assert lora.parts["weights (bfloat16)"] == 2 * shape.params
    full = estimate(shape, full_finetune=True)["learner"]
    assert full.parts["gradients"] == 2 * shape.params and full.parts["AdamW moments"] == 4 * shape.params
    assert not any(k.startswith("LoRA") for k in full.parts)
    q4 = estimate(shape, load_in_4bit=True)["learner"]
    assert q4.parts["weights (4-bit NF4)"] == shape.weight_bytes(2, load_in_4bit=True)
    assert q4.parts["activations"] < lora.parts["activations"]  # 4-bit implies gradient checkpointing (Unsloth)
    with pytest.raises(ConfigError, match="model.full_finetune"):
        estimate(shape, load_in_4bit=True, full_finetune=True)


def test_activations_scale_with_tokens_and_checkpointing_saves_memory():
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    a = dict(seq_len=1024, completion_len=512, act_bytes=2)
    one = memory.activation_bytes(shape, sequences=1, checkpointing=False, **a)
    assert memory.activation_bytes(shape, sequences=4, checkpointing=False, **a) == pytest.approx(4 * one)
    ckpt = memory.activation_bytes(shape, sequences=1, checkpointing=True, **a)
    # without checkpointing every block keeps 4h + 2q + 2kv + 4i = 25,088 values per token; with it, each block
    # keeps its input (h = 896) and one block's worth is live again during its recomputation
    assert one - ckpt == 1024 * 2 * (24 * 25_088 - (24 * 896 + 25_088))
    assert ckpt < one / 1.8  # the rest is the logits (vocab 151,936), which checkpointing does not shrink


def test_actor_kv_cache_is_what_vllm_share_leaves():
    shape = shapes.ModelShape.from_hf_config(QWEN_7B)
    actor = estimate(shape)["actor"]
    assert actor.budget == 40 * 2**30  # 0.5 of 80 GiB
    assert actor.total == pytest.approx(actor.budget)
    assert actor.parts["KV cache"] == pytest.approx(
        actor.budget - sum(v for k, v in actor.parts.items() if k != "KV cache")
    )
    assert not actor.warnings
    starved = estimate(shape, gpu_memory_utilization=0.18)["actor"]  # 14.4 GiB < 14.2 GiB weights + the rest
    assert starved.parts["KV cache"] == 0 and "cluster.gpu_memory_utilization" in starved.warnings[0]


def test_cpu_actor_kv_cache_is_the_node_share_minus_what_the_engine_uses():
    """vLLM's CPU worker: the fraction is of one NUMA node and covers the engine's whole process (weights,
    libraries, buffers); the KV cache is the rest, and none left means the engine does not start."""
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    weights = shape.weight_bytes(2)
    node = 16 * 2**30
    cpu = estimate(shape, use_gpu=False, device_bytes=node, gpu_memory_utilization=0.2, native_lora=False)["actor"]
    assert cpu.budget == pytest.approx(0.2 * node)
    engine = memory.VLLM_CPU_BASE_BYTES + memory.VLLM_CPU_WEIGHT_FACTOR * weights
    assert cpu.parts["KV cache"] == pytest.approx(0.2 * node - engine)
    assert cpu.total == pytest.approx(cpu.budget) and not cpu.warnings
    starved = estimate(shape, use_gpu=False, device_bytes=node, gpu_memory_utilization=0.05, native_lora=False)["actor"]
    assert starved.parts["KV cache"] == 0
    (warning,) = starved.warnings
    fits = memory.vllm_cpu_fraction(engine, 64 * 1024 * shape.kv_bytes_per_token(2), node)
    assert "would fail to start (no KV cache): cluster.gpu_memory_utilization=0.05 gives it 0.80 GiB" in warning
    assert warning.endswith(f"set cluster.gpu_memory_utilization={fits:g} (64 sequences of 1024 tokens at once)")
    at_fit = estimate(shape, use_gpu=False, device_bytes=node, gpu_memory_utilization=fits, native_lora=False)["actor"]
    assert at_fit.parts["KV cache"] >= 64 * 1024 * shape.kv_bytes_per_token(2) and not at_fit.warnings


def test_vllm_cpu_fraction_rounds_up_and_keeps_headroom():
    gib = 2**30
    assert memory.vllm_cpu_fraction(1.0 * gib, 0.0, 10 * gib) == 0.11  # 1.1 GiB of 10
    assert memory.vllm_cpu_fraction(0.68 * gib, 0.001 * gib, 15.84 * gib) == 0.05
    assert memory.vllm_cpu_fraction(20 * gib, 0.0, 10 * gib) == 1.0


def write_node(root, node=0, cpus="0-1", total_kb=16_000_000, free_kb=6_000_000, file_kb=(1_000_000, 500_000)):
    d = root / f"devices/system/node/node{node}"
    d.mkdir(parents=True)
    (d / "cpulist").write_text(cpus + "\n")
    (d / "meminfo").write_text(
        f"Node {node} MemTotal:       {total_kb} kB\nNode {node} MemFree:        {free_kb} kB\n"
        f"Node {node} Active(file):   {file_kb[0]} kB\nNode {node} Inactive(file): {file_kb[1]} kB\n"
        f"Node {node} SReclaimable:     100000 kB\nNode {node} AnonPages:     9000000 kB\n"
    )


def test_numa_node_memory_reads_the_cpus_node_as_vllm_does(tmp_path):
    write_node(tmp_path, 0, "0-1", total_kb=16_000_000)
    write_node(tmp_path, 1, "2-3", total_kb=8_000_000, free_kb=2_000_000)
    first = machine.numa_node_memory(cpu=0, sys_root=str(tmp_path))
    assert (first.node, first.total) == (0, 16_000_000 * 1024)
    assert first.available == (6_000_000 + 1_000_000 + 500_000 + 100_000) * 1024  # free + file pages + reclaimable
    second = machine.numa_node_memory(cpu=3, sys_root=str(tmp_path))
    assert (second.node, second.total) == (1, 8_000_000 * 1024)
    cgroup = tmp_path / "fs/cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text(str(4 * 2**30))
    (cgroup / "memory.current").write_text(str(3 * 2**30))
    capped = machine.numa_node_memory(cpu=0, sys_root=str(tmp_path))
    assert (capped.total, capped.available) == (4 * 2**30, 2**30)  # the cgroup's limit and what is left under it
    (cgroup / "memory.max").write_text("max")
    assert machine.numa_node_memory(cpu=0, sys_root=str(tmp_path)).total == 16_000_000 * 1024


def test_cli_plan_cpu_warns_before_a_kv_cache_that_would_not_fit(tmp_path):
    model = model_dir(tmp_path, QWEN_05B)
    proc = run_train(["plan=true", f"model.path={model}", "cluster.gpu_memory_utilization=0.01"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "NUMA node 0 (where a vLLM CPU engine allocates)" in proc.stdout
    assert (
        "WARNING: actor: vLLM's CPU engine would fail to start (no KV cache): cluster.gpu_memory_utilization=0.01"
        in proc.stdout
    )
    assert "WARNING: as configured it will not start or not fit" in proc.stdout


def test_gpu_map_whole_fractional_and_tensor_parallel():
    assert plan.gpu_map(2, 1, 1, 1) == [["actor 0"], ["actor 1"], ["learner 0"]]
    assert plan.gpu_map(2, 0.5, 1, 1) == [["actor 0 (0.5)", "actor 1 (0.5)"], ["learner 0"]]
    assert plan.gpu_map(1, 2, 2, 1) == [["actor 0"], ["actor 0"], ["learner 0"], ["learner 1"]]


def test_plan_for_config_sizes_lora_full_finetune_and_4bit(tmp_path):
    cfg = TrainConfig()
    cfg.cluster.use_gpu = True
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    lora = memory.plan_for_config(cfg, shape, 80 * 2**30)["learner"]
    assert any(k.startswith("LoRA weights") for k in lora.parts)
    full_cfg = replace(cfg, model=replace(cfg.model, full_finetune=True))
    full = memory.plan_for_config(full_cfg, shape, 80 * 2**30)["learner"]
    assert full.parts["gradients"] == 2 * shape.params
    cfg.model = replace(cfg.model, load_in_4bit=True)
    assert "weights (4-bit NF4)" in memory.plan_for_config(cfg, shape, 80 * 2**30)["learner"].parts


def test_cli_plan_gpu_7b_prints_map_and_warns_when_it_does_not_fit(tmp_path):
    model = model_dir(tmp_path, QWEN_7B)
    args = [
        "plan=true",
        f"model.path={model}",
        "cluster=2a1l",
        "cluster.use_gpu=true",
        "plan_gpu_memory_gib=80",
        "model.max_prompt_tokens=512",
        "model.max_new_tokens=512",
        "learner.micro_batch_size=4",
        "cluster.gpu_memory_utilization=0.25",
        f"hydra.run.dir={tmp_path / 'hydra_run'}",
    ]
    proc = run_train([*args, "model.load_in_4bit=true"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "GPUs: need 3 (2 actor(s) x 1 + 1 learner(s) x 1)" in out
    assert "GPU 0: actor 0\n  GPU 1: actor 1\n  GPU 2: learner 0" in out
    assert "7.616 B parameters" in out and "weights (4-bit NF4) 5.17 GiB" in out
    assert out.rstrip().endswith("fits (by this estimate)")
    assert not (tmp_path / "hydra_run").exists()  # nothing started, nothing written
    small_gpu = run_train([*args, "plan_gpu_memory_gib=16", "learner.micro_batch_size=16"], timeout=120)
    assert small_gpu.returncode == 0, small_gpu.stderr
    assert "WARNING: GPU 2 (learner 0)" in small_gpu.stdout
    assert "WARNING: as configured it will not start or not fit" in small_gpu.stdout


def test_cli_plan_cpu_mode_imports_no_ray_vllm_or_transformers(tmp_path):
    """The plan starts nothing; it imports torch only for the algorithm registries (rl/algorithms/), whose names it
    checks as a run would before it starts."""
    model = model_dir(tmp_path, QWEN_05B)
    code = (
        "import sys, train\n"
        f"cfg = train.precheck_overrides(['plan=true', 'model.path={model}'])\n"
        "train.run_plan(cfg)\n"
        "print('heavy:', sorted(m for m in ('ray', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CPU mode (cluster.use_gpu=false)" in proc.stdout and "of the NUMA node's" in proc.stdout
    assert "heavy: []" in proc.stdout


def test_cli_plan_bad_config_exits_nonzero_with_one_line(tmp_path):
    proc = run_train(["plan=true", f"model.path={tmp_path / 'missing'}"], timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: model.path=") and len(proc.stderr.strip().splitlines()) == 1
    unknown = run_train(["plan=true", "algorithm.advantage=ppo"], timeout=120)  # the run would fail: so does the plan
    assert unknown.returncode == 2 and "fits" not in unknown.stdout
    assert unknown.stderr.strip() == (
        "error: algorithm.advantage='ppo' is not a known advantage estimator; valid names: dr_grpo, grpo, pg, "
        "reinforce_pp, rloo"
    )
    adapter = run_train(["plan=true", f"model.init_adapter={tmp_path / 'nope'}"], timeout=120)
    assert adapter.returncode == 2 and adapter.stderr.startswith(
        f"error: model.init_adapter={tmp_path / 'nope'}: no such"
    )
    hub = run_train(["plan=true", "model.path=nobody/not-cached-model"], timeout=120)
    assert hub.returncode == 0, hub.stderr  # a hub id is valid config; the plan says what it could not size
    assert "memory: unknown (no config.json for nobody/not-cached-model in the local HF cache" in hub.stdout


def test_gpus_needed_against_gpus_found(tmp_path, monkeypatch):
    cfg = TrainConfig()
    cfg.model.path = str(model_dir(tmp_path, QWEN_05B))
    cfg.cluster = replace(cfg.cluster, use_gpu=True, num_actors=2)
    monkeypatch.setattr(plan, "detect_gpus", lambda: (2, 80 * 2**30, "NVIDIA H100 80GB HBM3"))
    text, warnings = plan.format_plan(cfg)
    assert "need 3 (2 actor(s) x 1 + 1 learner(s) x 1); available: 2 on this machine" in text
    assert "80 GiB each (nvidia-smi: NVIDIA H100 80GB HBM3)" in text
    assert warnings == ["the roles need 3 GPUs and this machine has 2"]
    monkeypatch.setattr(plan, "detect_gpus", lambda: None)
    assert "plan_gpu_memory_gib" in plan.format_plan(cfg)[1][0]
    cfg.plan_gpu_memory_gib = 40.0  # planning for another machine: no complaint about this one
    text, warnings = plan.format_plan(cfg)
    assert warnings == [] and "40 GiB each (plan_gpu_memory_gib)" in text
    cfg.cluster.address = "auto"
    assert "available: the Ray cluster's" in plan.format_plan(cfg)[0]


def test_a_model_the_estimate_cannot_size_is_reported_not_failed(tmp_path):
    cfg = TrainConfig()
    cfg.model.path = str(model_dir(tmp_path, {**QWEN_05B, "num_experts": 60}))
    text, _ = plan.format_plan(cfg)
    assert "memory: unknown (" in text and "mixture of experts (num_experts)" in text


def test_colocated_plan_counts_one_gpu_per_pair_and_the_larger_phase(tmp_path, monkeypatch):
    cfg = TrainConfig()
    cfg.model.path = str(model_dir(tmp_path, QWEN_05B))
    cfg.cluster = replace(cfg.cluster, use_gpu=True, colocate=True, gpu_memory_utilization=0.6)
    monkeypatch.setattr(plan, "detect_gpus", lambda: (1, 80 * 2**30, "NVIDIA H100 80GB HBM3"))
    text, warnings = plan.format_plan(cfg)
    assert "need 1 (1 actor/learner pair(s) x 1, colocated)" in text and warnings == []
    assert "GPU 0: actor 0, learner 0" in text and "colocated, per GPU: generating" in text
    cfg.cluster = replace(cfg.cluster, gpu_memory_utilization=1.0)  # no room left for the learner's weights
    assert any(w.startswith("GPU 0 (actor 0, learner 0)") for w in plan.format_plan(cfg)[1])


def test_judge_teacher_engines_are_placed_after_the_learners():
    assert plan.gpu_map(1, 1, 1, 1, 2, 1) == [["actor 0"], ["learner 0"], ["teacher 0"], ["teacher 1"]]
    assert plan.gpu_map(1, 0.4, 1, 0.3, 1, 0.3) == [["actor 0 (0.4)", "learner 0 (0.3)", "teacher 0 (0.3)"]]
    assert plan.gpu_map(1, 0.5, 1, 0.5, 1, 0.5, colocate=True) == [["actor 0", "learner 0", "teacher 0 (0.5)"]]
    assert plan.gpu_map(1, 1, 1, 1, 1, 0.5, colocate=True) == [["actor 0", "learner 0"], ["teacher 0 (0.5)"]]


def test_plan_counts_the_judge_teacher_engines_gpus_and_memory(tmp_path, monkeypatch):
    """plan=true with cluster.num_teachers: the engines' GPUs in the need and the map, each engine's memory as
    its own vLLM share (teacher.path's shape, no LoRA slot: the adapter is merged), and a GPU they overfill named."""
    cfg = TrainConfig()
    cfg.model.path = str(model_dir(tmp_path, QWEN_05B))
    cfg.teacher.path = str(model_dir(tmp_path, QWEN_7B, "teacher"))
    shared = dict(use_gpu=True, gpus_per_actor=0.3, gpus_per_learner=0.3, gpus_per_teacher=0.4)
    cfg.cluster = replace(cfg.cluster, num_teachers=1, gpu_memory_utilization=0.25, **shared)
    cfg.cluster.teacher_memory_utilization = 0.35
    monkeypatch.setattr(plan, "detect_gpus", lambda: (1, 80 * 2**30, "NVIDIA H100 80GB HBM3"))
    text, warnings = plan.format_plan(cfg)
    assert "need 1 (1 actor(s) x 0.3 + 1 learner(s) x 0.3 + 1 judge/teacher engine(s) x 0.4)" in text
    assert "GPU 0: actor 0 (0.3), learner 0 (0.3), teacher 0 (0.4)" in text
    assert "judge/teacher model: " in text and "7.616 B parameters" in text
    roles = memory.plan_for_config(
        cfg, shapes.ModelShape.from_hf_config(QWEN_05B), 80 * 2**30, shapes.load_shape(cfg.teacher.path)[0]
    )
    teacher = roles["teacher"]
    assert teacher.budget == pytest.approx(0.35 * 80 * 2**30)
    assert teacher.parts["weights (bfloat16)"] == shapes.ModelShape.from_hf_config(QWEN_7B).weight_bytes(2)
    assert "LoRA slot" not in teacher.parts
    assert "vLLM takes cluster.teacher_memory_utilization=0.35" in teacher.notes[0]
    assert warnings == []
    cfg.cluster.teacher_memory_utilization = 0.6  # 0.25 + the learner + 0.6: more than the one GPU
    over = plan.format_plan(cfg)[1]
    assert len(over) == 1 and over[0].startswith("GPU 0 (actor 0 (0.3), learner 0 (0.3), teacher 0 (0.4))")
    assert "cluster.teacher_memory_utilization" in over[0]
    cfg.cluster.teacher_memory_utilization = 0.1  # 8 GiB: less than the 7B's 14.2 GiB of weights
    assert any(w.startswith("teacher: weights and activations") for w in plan.format_plan(cfg)[1])


def test_continuous_rollouts_size_the_actors_kv_cache_for_one_call_of_the_groups_in_flight(tmp_path):
    """cluster.rollout_mode=continuous keeps cluster.groups_in_flight groups (0: two batches) in flight, in
    STREAM_DEPTH calls queued per actor that its engine runs one at a time: with the default that is one step's
    sequences at once, with more groups in flight more, and the plan's KV need counts them."""
    cfg = TrainConfig()
    cfg.model.path = str(model_dir(tmp_path, QWEN_05B))
    cfg.cluster = replace(cfg.cluster, num_actors=2)
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    per_step = cfg.run.prompts_per_step * cfg.algorithm.group_size // 2
    assert cfg.actor_sequences == per_step
    batch = memory.plan_for_config(cfg, shape, 16 * 2**30)["actor"]
    cfg.cluster = replace(cfg.cluster, rollout_mode="continuous", staleness=1)
    cfg.algorithm.tis_cap = 2.0
    assert cfg.actor_sequences == per_step
    cfg.cluster = replace(cfg.cluster, groups_in_flight=4 * cfg.run.prompts_per_step)
    assert cfg.actor_sequences == 2 * per_step
    continuous = memory.plan_for_config(cfg, shape, 16 * 2**30)["actor"]
    assert f"{per_step} sequences x" in batch.notes[-1] and f"{2 * per_step} sequences x" in continuous.notes[-1]


def test_cpu_plan_reserves_the_teachers_cpus_and_names_their_memory_key(tmp_path):
    cfg = TrainConfig()
    cfg.model.path = str(model_dir(tmp_path, QWEN_05B))
    cfg.cluster = replace(cfg.cluster, num_teachers=1, cpus_per_teacher=0.5, teacher_memory_utilization=0.01)
    text, warnings = plan.format_plan(cfg)
    assert "the roles reserve 2.5 Ray CPUs" in text and "teacher (each): " in text
    assert any(w.startswith("teacher: vLLM's CPU engine would fail to start") for w in warnings)
    assert any("set cluster.teacher_memory_utilization=" in w for w in warnings)
    cfg.cluster.num_teachers = 0
    assert "teacher" not in plan.format_plan(cfg)[0]


def test_a_packs_engine_profiles_every_jobs_batch():
    """A pack's engine runs each job's batch at once (rl/rollout/vllm.py pack_batch_limits): vLLM's profiling run
    then computes the last-token logits of that many sequences, times the jobs."""
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    key = "activations (vLLM profile peak)"
    one, four = (estimate(shape, pack_jobs=n)["actor"].parts[key] for n in (1, 4))
    assert four - one == 3 * 1024 * shape.vocab * 4  # an 80 GiB GPU: vLLM's 1,024 sequences per job


def test_the_plan_profiles_with_vllms_defaults_for_the_gpu():
    """vLLM's defaults depend on the GPU (EngineArgs.get_batch_defaults): 16,384 step tokens and 1,024 sequences on
    one of 70 GiB or more, 8,192 and 256 below; the plan's profiling peak uses the same pair."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    assert memory.vllm_profile(80 * 2**30) == (16384, 1024) and memory.vllm_profile(40 * 2**30) == (8192, 256)
    assert memory.vllm_profile(80 * 2**30, 32) == (32 * 1024, 32 * 1024)
    tokens, seqs = EngineArgs.get_batch_defaults(1)  # no GPU here: vLLM's smaller pair (its CPU takes fewer tokens)
    assert memory.vllm_profile(0)[1] == seqs[UsageContext.LLM_CLASS]
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    key = "activations (vLLM profile peak)"
    small, large = (estimate(shape, device_bytes=g * 2**30)["actor"].parts[key] for g in (40, 80))
    assert large - small == (16384 - 8192) * (2 * shape.intermediate + 4 * shape.hidden) * 2 + 768 * shape.vocab * 4


@pytest.mark.parametrize("tokens", [0, 4096], ids=["padded", "packed"])
def test_a_pack_whose_learner_groups_its_jobs_counts_every_jobs_gradients_and_rows(tokens):
    """A sweep pack's grouped learner step (rl/learner/grouped.py) holds every job's gradients and one micro-batch of
    every job's rows; stepped one job after another, one job's of each."""
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    one = estimate(shape, micro_batch_tokens=tokens)["learner"]
    apart = estimate(shape, micro_batch_tokens=tokens, pack_jobs=4)["learner"]
    together = estimate(shape, micro_batch_tokens=tokens, pack_jobs=4, grouped=True)["learner"]
    assert (apart.parts["gradients"], apart.parts["activations"]) == (one.parts["gradients"], one.parts["activations"])
    assert together.parts["gradients (x4 jobs)"] == 4 * one.parts["gradients"]
    assert together.parts["activations"] == pytest.approx(4 * one.parts["activations"])
    assert together.parts["AdamW moments (x4 jobs)"] == apart.parts["AdamW moments (x4 jobs)"]
    # learner.pack_micro_batches=2: two micro-batches of every job's rows in one forward, the same gradients
    two = estimate(shape, micro_batch_tokens=tokens, pack_jobs=4, grouped=True, pack_micro_batches=2)["learner"]
    assert two.parts["activations"] == pytest.approx(8 * one.parts["activations"])
    assert two.parts["gradients (x4 jobs)"] == together.parts["gradients (x4 jobs)"]
    assert "x2 micro-batches a job (learner.pack_micro_batches)" in " ".join(two.notes)
