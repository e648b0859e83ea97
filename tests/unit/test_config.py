"""Every config composes and validates; bad input fails with one line naming the key; --help needs no vLLM."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rl import resolve as specs
from rl.config.schema import ConfigError, TrainConfig, register_configs
from tests.helpers import CONF, REPO, run_train

register_configs()


def group_options() -> list[tuple[str, str]]:
    return [
        (g.name, f.stem)
        for g in sorted(CONF.iterdir())
        if g.is_dir() and g.name not in ("hydra", "experiment")
        for f in sorted(g.glob("*.yaml"))
    ]


@pytest.mark.parametrize(("group", "option"), group_options())
def test_every_config_option_composes_into_the_typed_schema_and_its_specs(group, option, tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        # 12 prompts split evenly over 1, 2 or 3 learners (the default 8 x 8 samples do not split over 1a3l's 3)
        batch = ["run.prompts_per_step=12"] if group == "cluster" else []
        if (group, option) == ("algorithm", "sft"):  # trains on a demonstrations file, which must exist
            (tmp_path / "demos.jsonl").write_text("")
            batch = [f"algorithm.demos={tmp_path / 'demos.jsonl'}"]
        if (group, option) == ("algorithm", "distill"):  # scores with a teacher engine
            batch = ["cluster.num_teachers=1"]
        cfg = compose(config_name="train", overrides=[f"{group}={option}", *batch])
    if group in ("reward", "env"):
        assert "_target_" in cfg[group]
        # some options need the user to fill a path (`???`, e.g. env=jsonl env.train=...): typed part only
        for key in ("reward", "env"):
            cfg[key] = {}
    if cfg.model.load_in_4bit or cfg.model.learner_backend == "unsloth":
        cfg.cluster.use_gpu = True  # a GPU-only model file: the config check asks for GPUs (tested below)
    typed = OmegaConf.to_object(cfg)
    assert isinstance(typed, TrainConfig)
    run_dir = tmp_path / "run"  # beside the demonstrations file: a run writes only into a folder of its own
    run = specs.resolve(typed, run_dir, model_path="/fake/model")  # registry names resolve, autos are filled
    assert run.cluster.lora_mode in ("merged", "native") and run.model.learner_backend in ("peft", "unsloth")
    assert run.model.learner_dtype != "auto" and run.learner.micro_batch_tokens is not None
    assert run.eval.save_dir == str(run_dir / "eval") and run.run.output_dir == str(run_dir)


@pytest.mark.parametrize("option", sorted(f.stem for f in (CONF / "cluster").glob("*.yaml") if f.stem != "local"))
def test_every_ray_topology_places_the_roles_its_name_says_on_two_cores(option):
    """`<A>a<L>l` asks a bundle for each of its A actors and L learners, and they fit a 2-core machine together:
    the topologies that no integration test trains (tests/integration/test_topologies.py PLANNED_ONLY) place too."""
    from rl.runtime.placement import role_plans

    actors, learners = map(int, re.fullmatch(r"(\d)a(\d)l", option).groups())
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = OmegaConf.to_object(
            compose(config_name="train", overrides=[f"cluster={option}", "run.prompts_per_step=12"])
        )
    plans, bundles = role_plans(cfg.cluster)
    expected = [("actor", i) for i in range(actors)] + [("learner", i) for i in range(learners)]
    assert [(r.role, r.index) for r in plans] == expected
    assert len(bundles) == actors + learners and sum(b["CPU"] for b in bundles) <= 2


@pytest.mark.parametrize("name", sorted(f.stem for f in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes(name):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"+experiment={name}"])
    for key in ("reward", "env"):
        assert "_target_" in cfg[key]
        cfg[key] = {}
    assert isinstance(OmegaConf.to_object(cfg), TrainConfig)


def test_default_config_is_the_demo():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="train"))
    assert cfg.model.path == "embedded:smollm2-135m-instruct"
    assert cfg.cluster.mode.value == "ray" and cfg.cluster.num_actors == 1 and cfg.cluster.num_learners == 1
    assert cfg.algorithm.advantage == "grpo"


def test_cross_field_check_names_the_key():
    with pytest.raises(ConfigError, match=r"algorithm.group_size must be >= 2"):
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), {"algorithm": {"group_size": 1}}))


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ({}, r"run.prompts_per_step \* algorithm.group_size = 3 \* 8 = 24 samples do not split evenly"),
        (
            {"policy_loss": "sft", "demos": "demos.jsonl"},
            r"algorithm=sft trains on run.prompts_per_step=3 demonstrations a step, which do not split evenly over "
            r"cluster.num_learners=5: make run.prompts_per_step a multiple of 5",
        ),
    ],
)
def test_a_batch_that_does_not_split_over_the_learners_names_the_keys_that_set_it(algorithm, expected):
    settings = {"algorithm": algorithm, "cluster": {"num_learners": 5}, "run": {"prompts_per_step": 3}}
    with pytest.raises(ConfigError, match=expected) as failure:
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), settings))
    assert ("group_size" in str(failure.value)) == (not algorithm)  # sft has one sample per demonstration


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.pathh=x", "unknown config key 'model.pathh'"),
        ("stepz=3", "unknown config key 'stepz'"),
        ("+algorithm.clip_hig=0.3", "unknown config key 'algorithm.clip_hig' (added with +): check its spelling"),
        ("steps=3", "'steps' is now 'run.steps': write run.steps=..."),
        ("eval_size=0", "'eval_size' is now 'eval.size'"),
        ("+save_interval=2", "'save_interval' is now 'checkpoint.interval'"),
        ("-m seed=0,1", "'seed' is now 'run.seed'"),
        ("algorithm.group_size=abc", "algorithm.group_size"),
        ("cluster.mode=bogus", "cluster.mode"),
        ("model=nope", "Could not find 'model/nope'"),
        ("algorithm.group_size=1", "algorithm.group_size must be >= 2"),
        ("model.path=/nonexistent", "model.path='/nonexistent' does not exist"),
        ("cluster.address=127.0.0.1:1", "could not join Ray at cluster.address='127.0.0.1:1'"),
        ("model.learner_backend=unsloth", "model.learner_backend=unsloth needs CUDA GPUs"),
        (
            "model.learner_backend=fast",
            "model.learner_backend: Invalid value 'fast', expected one of [auto, peft, unsloth]",
        ),
        (
            "algorithm.policy_loss=clipd",
            "algorithm.policy_loss='clipd' is not a known policy loss; valid names: cispo,",
        ),
        ("algorithm.loss_agg=mean", "algorithm.loss_agg='mean' is not a known loss aggregation; valid names:"),
        ("algorithm.advantage=ppo", "algorithm.advantage='ppo' is not a known advantage estimator; valid names:"),
        (
            "algorithm=dapo algorithm.overlong_buffer=100",
            "algorithm.overlong_buffer=100 exceeds model.max_new_tokens=32: lower it",
        ),
        ("cluster.weight_sync=ipc", "cluster.weight_sync=ipc shares CUDA memory between processes"),
        ("model.full_finetune=true model.load_in_4bit=true", "model.full_finetune=true cannot train 4-bit"),
        ("run.output_dir=/dev/null/run", "run.output_dir=/dev/null/run: cannot write there (Not a directory)"),
        ("run.output_dir=/dev/null", "run.output_dir=/dev/null is a file: give a folder"),
        ("reward.foo=1", "reward.foo: no such key in the reward config: check its spelling, or add an argument its"),
        ("reward.extract=answer_tag", "(a reward scored in workers takes its own as reward.reward.extract)"),
    ],
)
def test_bad_input_fails_with_one_line_naming_the_key(override, expected):
    proc = run_train(override.split(), timeout=120)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("error: ") and expected in err[0]


def test_every_job_of_a_sweep_is_checked_before_the_first_runs(tmp_path):
    """`-m` with a bad value in its last job fails at once, naming the job, before any job runs (Hydra alone runs
    the jobs before it first: hours of a real sweep). The jobs are Hydra's basic sweeper's, in its order."""
    from rl.entry import sweep_jobs

    conf = str(CONF)
    assert sweep_jobs(conf, ["algorithm=grpo,dapo", "run.seed=range(0,2)", "run.steps=3"]) == [
        ["algorithm=grpo", "run.seed=0", "run.steps=3"],
        ["algorithm=grpo", "run.seed=1", "run.steps=3"],
        ["algorithm=dapo", "run.seed=0", "run.steps=3"],
        ["algorithm=dapo", "run.seed=1", "run.steps=3"],
    ]
    assert sweep_jobs(conf, ["algorithm=glob(g*,exclude=grpo)", "run.seed=0,1"]) == [
        ["algorithm=gspo", "run.seed=0"],
        ["algorithm=gspo", "run.seed=1"],
    ]
    assert sweep_jobs(conf, ["run.seed=0,1", "run.seed=2"]) == [["run.seed=2"]]  # the last value of a key, as Hydra
    assert sweep_jobs(conf, ["run.steps=interval(1,2)"]) is None  # only a sweeper plugin expands an interval
    with pytest.raises(ConfigError, match=r"^no viable alternative at input '\[0,1'"):  # one line, not Hydra's three
        sweep_jobs(conf, ["run.seed=[0,1"])
    with pytest.raises(
        ConfigError, match=r"^algorithm=glob\(zz\*\) sweeps over nothing: no value matches; available: cispo"
    ):
        sweep_jobs(conf, ["algorithm=glob(zz*)"])
    proc = run_train(["-m", "algorithm.lr=1e-3,-1", "plan=true", f"hydra.sweep.dir={tmp_path}"], timeout=120)
    assert proc.returncode == 2 and "fits" not in proc.stdout  # no job ran, not even the good first one
    assert (
        proc.stderr.strip() == "error: sweep job #1 (algorithm.lr=-1 plan=True): algorithm.lr must be >= 0 (got -1.0)"
    )
    proc = run_train(["-m", "algorithm=glob(gr*)", "run.sed=1", f"hydra.sweep.dir={tmp_path}"], timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith(
        "error: sweep job #0 (algorithm=grpo run.sed=1): unknown config key 'run.sed'"
    ), proc.stderr  # a glob is expanded and checked like a list, not left to Hydra's multi-line error


def test_sweep_jobs_resume_in_their_own_directories_and_never_share_one(tmp_path):
    """A sweep job without run.output_dir has its Hydra job directory, so run.resume=auto passes the check (an
    interrupted sweep continues job by job); one run.output_dir for two jobs would mix their runs."""
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    proc = run_train(["-m", "run.seed=0,1", "run.resume=auto", "plan=true", sweep], timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("fits") == 2, proc.stderr
    proc = run_train(["-m", "algorithm=grpo,dapo", f"run.output_dir={tmp_path / 'one'}", "plan=true", sweep])
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: sweep job #1 (algorithm=dapo run.output_dir={tmp_path / 'one'} plan=True): run.output_dir="
        f"{tmp_path / 'one'} is sweep job #0's run directory too: leave run.output_dir unset (each job writes into "
        "its own directory under hydra.sweep.dir) or sweep it"
    )


def test_a_failed_sweep_job_leaves_the_jobs_after_it_and_the_summary(tmp_path):
    """A job ending with its one-line error (here at its run directory) does not end the sweep: the next job runs,
    the summary is written with a row per job, and the command exits 1 with a line naming the failed jobs."""
    sweep = tmp_path / "sweep"
    proc = run_train(["-m", "run.output_dir=/dev/null/a,/dev/null/b", f"hydra.sweep.dir={sweep}"], timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr
    assert [line.split(":")[0] for line in err] == ["error"] * 3 and "/dev/null/b: cannot write there" in err[1]
    assert err[2] == (
        "error: 2 sweep job(s) failed (their errors are above): #0 (run.output_dir=/dev/null/a), "
        "#1 (run.output_dir=/dev/null/b)"
    )
    rows = (sweep / "sweep_summary.csv").read_text().splitlines()[1:]
    assert [r.split(",")[2] for r in rows] == ["no steps"] * 2


def test_an_old_key_in_a_yaml_file_names_its_new_spelling():
    """An experiment file written before the keys moved into groups fails with the same one line as the CLI."""
    from rl.entry import one_line_config_error

    with pytest.raises(Exception) as e:
        OmegaConf.merge(OmegaConf.structured(TrainConfig), {"eval_size": 3})
    assert one_line_config_error(e.value, TrainConfig).startswith("'eval_size' is now 'eval.size'")


def test_a_key_added_with_plus_must_be_in_the_schema_of_its_group():
    """Hydra lets `+key=value` append to a typed group and the typed object drops the key, so a typo'd key would be
    ignored; only reward/env (a `_target_`'s keyword arguments) take keys the schema does not list."""
    from rl.entry import compose_config

    for override, key in (("+run.stepz=3", "run.stepz"), ("+cluster.x.y=1", "cluster.x"), ("+stepz=1", "stepz")):
        with pytest.raises(ConfigError, match=rf"^unknown config key '{key}' \(added with \+\)"):
            compose_config(str(CONF), "train", [override], TrainConfig)
    cfg = compose_config(str(CONF), "train", ["+reward.scale=2", "+env.extra=1"], TrainConfig)
    assert (cfg.reward.scale, cfg.env.extra) == (2, 1)


def test_the_resolve_step_returns_the_schema_with_every_auto_filled(tmp_path):
    """One schema: the resolved object is the same dataclass, the user's values kept, only the autos filled."""
    typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), {"run": {"steps": 3}}))
    run = specs.resolve(typed, tmp_path, model_path="/fake/model")
    assert type(run) is TrainConfig and run.run.steps == 3 and run.model.path == "/fake/model"
    assert (typed.model.learner_backend, run.model.learner_backend) == ("auto", "peft")
    assert (typed.learner.micro_batch_tokens, run.learner.micro_batch_tokens) == (None, 4096)
    assert run.algorithm.loss_agg_norm_length == run.model.max_new_tokens and run.cluster.lora_mode == "merged"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), {}),  # synchronous: the roles alternate, each with every core
        (("cluster.staleness=1",), {"actor_threads": 1, "learner_threads": 1}),
        (
            ("cluster.rollout_mode=continuous", "cluster.staleness=2", "algorithm.tis_cap=2"),
            {"actor_threads": 1, "learner_threads": 1},
        ),
        (("cluster.staleness=1", "cluster.learner_threads=2"), {"learner_threads": 2, "actor_threads": 1}),
        (("cluster.staleness=1", "cluster.address=auto"), {}),  # a remote Ray's cores are not this machine's
    ],
    ids=["sync", "staleness", "continuous", "one_set", "remote_ray"],
)
def test_a_cpu_run_whose_roles_overlap_splits_the_cores_between_them(overrides, expected, tmp_path, monkeypatch):
    """On 2 cores, where a role of each kind computes at the same time, each gets one core unless its key is set."""
    monkeypatch.setattr(specs.os, "cpu_count", lambda: 2)
    run = specs.from_overrides(str(tmp_path), *overrides)
    got = {k: getattr(run.cluster, k) for k in ("actor_threads", "learner_threads") if getattr(run.cluster, k)}
    assert got == expected


@pytest.mark.parametrize("native", [True, False], ids=["bf16_cpu", "avx2_cpu"])
def test_the_auto_dtypes_are_bf16_where_the_hardware_computes_it_and_fp32_on_other_cpus(native, tmp_path, monkeypatch):
    """model.dtype and model.learner_dtype default to auto: bf16 on GPUs and on a CPU with native bf16, fp32 on a
    CPU that emulates it (there bf16 made the demo's step 9x slower); a value given is kept on either; the plan
    sizes the roles in the same dtypes."""
    from rl.preflight import memory
    from rl.preflight.shapes import ModelShape

    monkeypatch.setattr(specs, "cpu_computes_bf16", lambda: native)
    cpu = "bfloat16" if native else "float32"
    m = specs.from_overrides(str(tmp_path)).model
    assert (m.dtype, m.learner_dtype) == (cpu, cpu)
    m = specs.from_overrides(str(tmp_path), "cluster.use_gpu=true").model
    assert (m.dtype, m.learner_dtype) == ("bfloat16", "bfloat16")
    m = specs.from_overrides(str(tmp_path), "model.dtype=float16", "model.learner_dtype=bfloat16").model
    assert (m.dtype, m.learner_dtype) == ("float16", "bfloat16")
    shape = ModelShape(
        vocab=1000, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, tied_embeddings=True
    )
    cfg = OmegaConf.to_object(OmegaConf.structured(TrainConfig))  # unresolved: the plan's autos
    roles = memory.plan_for_config(cfg, shape, 16 * 1024**3)
    assert f"weights ({cpu})" in roles["actor"].parts and f"weights ({cpu})" in roles["learner"].parts


def test_a_4bit_learners_actors_load_its_dequantized_base(tmp_path):
    """model.actor_base=learner (default): beside a 4-bit learner the actors load its NF4 base dequantized, a cache
    folder keyed by the model, backend and versions (made on a GPU before the roles start: rl/app.py);
    `original` keeps model.path; an explicit model.actor_path is used as given."""
    gpu4 = ("cluster.use_gpu=true", "model.load_in_4bit=true", "model.learner_backend=peft")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    matched = specs.from_overrides(str(model), *gpu4)
    assert "m-nf4-dequantized-" in matched.model.actor_path and matched.model.actor_path != matched.model.path
    assert specs.from_overrides(str(model), *gpu4, "model.actor_base=original").model.actor_path == str(model)
    assert specs.from_overrides(str(model)).model.actor_path == str(model)  # 16-bit learner: the same weights
    unsloth = specs.from_overrides(str(model), *gpu4[:2], "model.learner_backend=unsloth").model.actor_path
    assert unsloth != matched.model.actor_path  # another quantizer's codes, another folder
    given = specs.from_overrides(str(model), *gpu4, f"model.actor_path={model}").model.actor_path
    assert given == str(model)
    with pytest.raises(ConfigError, match="model.actor_path='/nonexistent/folder' does not exist"):
        specs.from_overrides(str(model), *gpu4, "model.actor_path=/nonexistent/folder")


def test_native_lora_slots_take_a_rank_vllm_allows(tmp_path):
    """vLLM refuses a max_lora_rank outside its fixed set (1, 8, 16, 32, ...): model.lora_rank=4 with native LoRA
    failed the actor's start. The slot is the smallest allowed rank that holds the adapter, and plan=true sizes it
    so."""
    import typing

    from vllm.config.lora import MaxLoRARanks

    from rl.model_path import VLLM_LORA_RANKS, lora_slot_rank
    from tests.helpers import actor_engine_kwargs as engine_kwargs

    assert VLLM_LORA_RANKS == tuple(sorted(typing.get_args(MaxLoRARanks)))  # the set plan=true uses is vLLM's
    assert [lora_slot_rank(r) for r in (1, 2, 4, 8, 12, 16, 24, 64, 300)] == [1, 8, 8, 8, 16, 16, 32, 64, 320]
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = specs.from_overrides(str(model), "model.lora_rank=4", "cluster.lora_mode=native")
    assert engine_kwargs(cfg)["max_lora_rank"] == 8
    from rl.preflight.plan import plan_for_config
    from rl.preflight.shapes import DTYPE_BYTES, ModelShape

    shape = ModelShape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, vocab=32000)
    actor = plan_for_config(cfg, shape, 80 * 2**30)["actor"]
    slot = shape.lora_params(8, list(cfg.model.lora_targets)) * DTYPE_BYTES[cfg.model.dtype.value]
    assert actor.parts["LoRA slot"] == slot  # the plan counts it too, in the engine's dtype


def test_a_packs_engine_runs_every_jobs_batch_at_once(tmp_path):
    """A pack of N jobs serves N adapter slots and admits N times vLLM's default running sequences for the device,
    so that N batches the size of a solo run's decode together (at the default they queued in waves); a solo engine
    keeps vLLM's default (test_plan.py: the plan counts the larger profiling batch)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from rl.rollout.vllm import engine_kwargs

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = specs.from_overrides(str(model), "cluster.lora_mode=native")
    seqs = EngineArgs.get_batch_defaults(1)[1][UsageContext.LLM_CLASS]
    solo = engine_kwargs(cfg.model, cfg.cluster, max_seq_length=cfg.max_seq_length, seed=0)
    pack = engine_kwargs(cfg.model, cfg.cluster, max_seq_length=cfg.max_seq_length, seed=0, lora_slots=8)
    assert "max_num_seqs" not in solo and pack["max_loras"] == 8 and pack["max_num_seqs"] == 8 * seqs
    big = engine_kwargs(cfg.model, cfg.cluster, max_seq_length=cfg.max_seq_length, seed=0, lora_slots=64)
    assert big["max_num_batched_tokens"] >= big["max_num_seqs"] == 64 * seqs  # vLLM refuses fewer tokens than seqs


def test_quantized_actors_load_the_model_in_nf4_with_native_lora(tmp_path):
    """model.actor_base=quantized: the actors load model.path and vLLM quantizes it to NF4 (engine argument
    quantization=bitsandbytes), with vLLM's LoRA (auto -> native: nothing can be merged into NF4 weights); the plan
    counts the actor's weights at 4 bits. Settings that cannot hold fail in one line naming the knob."""
    from rl.preflight.plan import plan_for_config
    from rl.preflight.shapes import ModelShape
    from tests.helpers import actor_engine_kwargs as engine_kwargs

    gpu4 = ("cluster.use_gpu=true", "model.load_in_4bit=true", "model.learner_backend=peft")
    shared_gpu = ("cluster.gpus_per_actor=0.5", "cluster.gpus_per_learner=0.5")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = specs.from_overrides(str(model), *gpu4, "model.actor_base=quantized")
    assert cfg.model.actor_path == str(model) and cfg.cluster.lora_mode == "native"
    kwargs = engine_kwargs(cfg)
    assert kwargs["quantization"] == "bitsandbytes" and kwargs["enable_lora"] and kwargs["model"] == str(model)
    assert "quantization" not in engine_kwargs(specs.from_overrides(str(model), *gpu4))  # learner: bf16 weights
    shape = ModelShape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64, vocab=32000)
    weights = {
        base: next(
            v for k, v in plan_for_config(c, shape, 80 * 2**30)["actor"].parts.items() if k.startswith("weights")
        )
        for base, c in (("quantized", cfg), ("learner", specs.from_overrides(str(model), *gpu4)))
    }
    assert weights["quantized"] < 0.5 * weights["learner"]
    for bad, knob in [
        (("model.actor_base=quantized",), "model.load_in_4bit=true"),
        ((*gpu4, "model.actor_base=quantized", "cluster.lora_mode=merged"), "cluster.lora_mode=auto"),
        ((*gpu4, "model.actor_base=quantized", "cluster.weight_sync=ipc", *shared_gpu), "no adapter can be merged"),
    ]:
        with pytest.raises(ConfigError, match=knob):
            specs.from_overrides(str(model), *bad)


def test_help_works_without_vllm_or_unsloth():
    # Make `import vllm` / `import unsloth` / `import ray` fail: --help and --cfg must not need them.
    code = (
        "import sys, runpy; sys.modules.update({m: None for m in ('vllm', 'unsloth', 'ray', 'torch')}); "
        f"sys.argv = ['train.py', sys.argv[1]]; runpy.run_path({str(REPO / 'train.py')!r}, run_name='__main__')"
    )
    for flag in ("--help", "--cfg=job"):
        proc = subprocess.run([sys.executable, "-c", code, flag], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "model" in proc.stdout and "algorithm" in proc.stdout


def test_config_fields_are_documented():
    """Every setting carries a one-line description (cleanrl's habit) beside its declaration in the schema; the
    reference (`python -m rl.tools.keys`) reads them from there, so they are written once."""
    from rl.tools.keys import rows

    found = rows()
    assert {"run.seed", "algorithm.tis_cap", "learner.micro_batch_tokens", "plan"} <= {k for k, _, _ in found}
    assert [k for k, _, note in found if not note] == [], "settings without a description in rl/config/schema.py"


def test_the_key_reference_command_prints_one_group():
    proc = subprocess.run(
        [sys.executable, "-m", "rl.tools.keys", "eval"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("eval.") for line in lines)
    assert any(line.split()[:2] == ["eval.size", "64"] and "held-out prompts" in line for line in lines)
    typo = subprocess.run(
        [sys.executable, "-m", "rl.tools.keys", "evl"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert typo.returncode == 2 and typo.stderr.startswith("error: no config group or key evl; groups: model, ")
    keys = subprocess.run(  # keys by their full name, as the error's "group or key" says
        [sys.executable, "-m", "rl.tools.keys", "run.steps", "eval.size"], cwd=REPO, capture_output=True, text=True
    )
    assert keys.returncode == 0 and [line.split()[0] for line in keys.stdout.splitlines()] == ["run.steps", "eval.size"]
    target = subprocess.run([sys.executable, "-m", "rl.tools.keys", "reward"], cwd=REPO, capture_output=True, text=True)
    assert target.returncode == 2 and "reward and env have no fixed keys" in target.stderr


def test_the_learning_rate_defaults_to_the_kind_of_training(tmp_path):
    """algorithm.lr null: 2e-4 for a LoRA adapter, 1e-6 for a full fine-tune (the LoRA rate undoes a pretrained
    model's skills in a few steps, docs/benchmarks.md); a rate given is kept."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert specs.from_overrides(str(model)).algorithm.lr == 2e-4
    assert specs.from_overrides(str(model), "model.full_finetune=true").algorithm.lr == 1e-6
    assert specs.from_overrides(str(model), "model.full_finetune=true", "algorithm.lr=3e-6").algorithm.lr == 3e-6
