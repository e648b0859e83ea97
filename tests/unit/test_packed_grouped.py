"""A sweep pack's grouped learner step (rl/learner/grouped.py, PackedRole.train_jobs) on the tiny fp32 model: each
job leaves the step with the adapter, optimizer state and metrics of the same job stepped alone (on_job), whatever
its learning rate, algorithm knobs and seed; a job with lr 0 keeps its adapter; a job with no signal is stepped as
alone; packed rows are grouped along the tokens; the pack says in one line when its learner steps job after job.
And the pack's learner Gather (rl/runtime/packed.py): the jobs' k-th steps go to the learner as one call, and a job
blocked on its step is not waited for by the engine's Gather."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from rl import pack
from rl.app import learner_args
from rl.learner import Learner, grouped
from rl.runtime.groups import LocalGroup
from rl.runtime.packed import LOGPROBS, Gather, JobGroup, Merge, PackedRole
from rl.runtime.roles import RolloutActor
from rl.types import JobError
from tests.fakes import FakeMergingEngine
from tests.helpers import LEARNER_TEST_OVERRIDES, make_samples, run_spec, typed_config

# rows are samples in both (no KV-cache prompt sharing), several micro-batches per job
PADDED = ("learner.share_prompt_prefix=false", "learner.micro_batch_size=4", "learner.micro_batch_tokens=0")
JOBS = (
    ("run.seed=0", "algorithm.lr=1e-3"),
    (  # another loss aggregation, a KL to the reference, an entropy bonus, its own temperature and clipping
        "run.seed=1",
        "algorithm.lr=3e-3",
        "algorithm.loss_agg=token_mean",
        "algorithm.kl_coef=0.05",
        "algorithm.entropy_coef=0.01",
        "algorithm.temperature=0.7",
        "algorithm.max_grad_norm=0.05",
    ),
    ("run.seed=2", "algorithm.lr=0", "algorithm.policy_loss=cispo"),
)
TIMINGS = ("time/", "perf/")


def shared_learner(model, jobs, *shared: str) -> PackedRole:
    """A PackedRole learner for `jobs` (each its overrides); each job's lora_B drawn at random (PEFT starts it at
    zero, where a KL's gradient is the rounding of logp - ref alone and AdamW's first update magnifies it)."""
    role = PackedRole(Learner, [learner_args(run_spec(model, *LEARNER_TEST_OVERRIDES, *shared, *j)) for j in jobs])
    for job, state in enumerate(role.states):
        gen = torch.Generator().manual_seed(job)
        for name, t in state["tensors"].items():
            if "lora_B" in name:
                t.normal_(0, 0.05, generator=gen)
    return role


def step(role: PackedRole, batches: list, grouped: bool) -> list[dict]:
    if grouped:
        return role.train_jobs([(j, (s,)) for j, s in enumerate(batches)])
    return [role.on_job(j, "train_step", s) for j, s in enumerate(batches)]


def optimizer_state(role: PackedRole, job: int) -> list[torch.Tensor]:
    opt = role.states[job]["attrs"]["optimizer"]
    out = []
    for p in opt.param_groups[0]["params"]:
        state = opt.state.get(p, {})
        out += [state[k].float().reshape(-1) for k in ("exp_avg", "exp_avg_sq", "step") if k in state]
    return out


def assert_same_job(a: PackedRole, b: PackedRole, job: int, tol: float, adapter_tol: float) -> None:
    """The job's optimizer moments within `tol` of their largest value, its adapter within `adapter_tol` (AdamW moves
    an element whose gradient is about its eps by a share of the lr that rounding decides), its version and RNG."""
    got, want = optimizer_state(a, job), optimizer_state(b, job)
    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert float((x - y).abs().max()) <= tol * float(y.abs().max())
    for name, t in a.states[job]["tensors"].items():
        torch.testing.assert_close(t, b.states[job]["tensors"][name], rtol=0, atol=adapter_tol, msg=name)
    assert a.states[job]["attrs"]["version"] == b.states[job]["attrs"]["version"]
    assert torch.equal(a.states[job]["rng"], b.states[job]["rng"])  # the step drew nothing from the job's RNG


def assert_same_metrics(grouped: dict, alone: dict, tol: float) -> None:
    assert set(grouped) - set(alone) == {"pack/grouped_jobs"}
    for key, value in alone.items():
        if not key.startswith(TIMINGS):
            assert grouped[key] == pytest.approx(value, rel=tol, abs=tol), key


def batches_for(step_no: int) -> list:
    return [make_samples(groups=3 if j < 2 else 2, group_size=4, seed=10 * step_no + j) for j in range(len(JOBS))]


@pytest.mark.parametrize("per_forward", [1, 2, 3], ids=["one_micro_batch", "two_micro_batches", "every_micro_batch"])
def test_a_grouped_step_gives_each_job_its_solo_steps_adapter_optimizer_and_metrics(tiny_model, per_forward):
    """With each job's k-th micro-batch in grouped forward k, or several of each job's in one forward
    (learner.pack_micro_batches: 2 gives jobs of 3 and 2 micro-batches forwards of 2+2+2 and 1+1 micro-batches; 3
    gives one forward of them all): each job's step as its solo step."""
    shared = (*PADDED, f"learner.pack_micro_batches={per_forward}")
    grouped, alone = shared_learner(tiny_model, JOBS, *shared), shared_learner(tiny_model, JOBS, *PADDED)
    start = {n: t.clone() for n, t in grouped.states[2]["tensors"].items()}
    for step_no in range(2):
        batches = batches_for(step_no)
        got, want = step(grouped, batches, True), step(alone, batches, False)
        for job in range(len(JOBS)):
            assert got[job]["pack/grouped_jobs"] == len(JOBS)
            assert got[job]["train/micro_batches"] == (3 if job < 2 else 2)
            assert_same_metrics(got[job], want[job], 1e-4)
    for job in range(len(JOBS)):
        assert_same_job(grouped, alone, job, 1e-5, 3e-5)
    moved = [float((grouped.states[0]["tensors"][n] - start[n]).abs().max()) for n in start]
    assert max(moved) > 1e-4  # job 0 trained (its seed drew other factors, so compare each with itself)
    for name, t in grouped.states[2]["tensors"].items():  # lr 0: the adapter it started with
        assert torch.equal(t, start[name]), name


def test_a_job_with_no_signal_is_stepped_as_alone(tiny_model):
    jobs = JOBS[:1] + (("run.seed=3", "algorithm.lr=1e-3"),)
    grouped, alone = shared_learner(tiny_model, jobs, *PADDED), shared_learner(tiny_model, jobs, *PADDED)
    flat = make_samples(groups=2, group_size=4, seed=7)
    for s in flat:
        s.advantage = 0.0
    batches = [make_samples(groups=2, group_size=4, seed=5), flat]
    got, want = step(grouped, batches, True), step(alone, batches, False)
    for job in range(2):
        assert_same_metrics(got[job], want[job], 1e-4)
        assert_same_job(grouped, alone, job, 1e-5, 3e-5)
    assert got[1]["train/samples_with_signal"] == 0 and got[1]["train/micro_batches"] == 0
    assert optimizer_state(grouped, 1) == []  # no gradient: no optimizer step, as alone


def test_a_grouped_step_with_prompt_sharing_on_matches_to_float_rounding(tiny_model):
    """The CPU default shares each group's prompt in the solo step (the KV-cache forward); the grouped forward runs
    full rows: the same values up to float rounding."""
    shared = ("learner.micro_batch_size=4", "learner.micro_batch_tokens=0")
    grouped, alone = shared_learner(tiny_model, JOBS[:2], *shared), shared_learner(tiny_model, JOBS[:2], *shared)
    assert alone.role.batcher.share_prompt_prefix
    batches = batches_for(0)[:2]
    got, want = step(grouped, batches, True), step(alone, batches, False)
    for job in range(2):
        assert_same_metrics(got[job], want[job], 1e-3)
        assert_same_job(grouped, alone, job, 1e-4, 3e-5)


@pytest.mark.parametrize("per_forward", [1, 2])
def test_packed_rows_are_grouped_along_the_tokens_and_match_the_solo_steps(tiny_model, per_forward):
    """learner.micro_batch_tokens > 0 (a PEFT learner's default): each job's micro-batch packed as alone, prompts
    shared, the jobs' rows concatenated along the tokens (with learner.pack_micro_batches=2, two of each job's)."""
    packed = ("learner.micro_batch_tokens=32",)
    shared = (*packed, f"learner.pack_micro_batches={per_forward}")
    grouped, alone = shared_learner(tiny_model, JOBS, *shared), shared_learner(tiny_model, JOBS, *packed)
    assert grouped.role.batcher.packed and grouped.role.batcher.share_prompt_prefix
    for step_no in range(2):
        batches = batches_for(step_no)
        got, want = step(grouped, batches, True), step(alone, batches, False)
        for job in range(len(JOBS)):
            assert got[job]["pack/grouped_jobs"] == len(JOBS) and got[job]["train/micro_batches"] > 1
            assert_same_metrics(got[job], want[job], 1e-4)
    for job in range(len(JOBS)):
        assert_same_job(grouped, alone, job, 1e-5, 3e-5)


def test_a_bf16_learners_grouped_step_rounds_each_lora_layer_as_the_layer_does(tiny_model):
    """bf16 base, fp32 LoRA factors: PEFT's Linear adds the LoRA delta to the base output in fp32 and rounds the sum
    once; the grouped layers round the same way, so with packed rows (each job's row as alone) the step is the solo
    step's to float32 rounding, where rounding the delta first moves an adapter by 1e-3."""
    shared = ("model.learner_dtype=bfloat16", "learner.micro_batch_tokens=32")
    grouped, alone = shared_learner(tiny_model, JOBS[:2], *shared), shared_learner(tiny_model, JOBS[:2], *shared)
    batches = batches_for(0)[:2]
    got, want = step(grouped, batches, True), step(alone, batches, False)
    for job in range(2):
        assert_same_metrics(got[job], want[job], 1e-5)
        assert_same_job(grouped, alone, job, 1e-5, 1e-6)


def test_a_job_whose_step_raises_fails_alone_and_its_mates_step_as_alone(tiny_model):
    """A malformed sample of job 1 makes the grouped step raise mid-forward: no job's state had changed, so the step
    runs its jobs one after another; job 1 gets its error (raised in its own thread by JobGroup.result), job 0 its
    solo step; the LoRA layers' own forward is back."""
    grouped, alone = shared_learner(tiny_model, JOBS[:2], *PADDED), shared_learner(tiny_model, JOBS[:2], *PADDED)
    batches = batches_for(0)[:2]
    batches[1][0].old_logprobs = []
    got = grouped.train_jobs([(j, (s,)) for j, s in enumerate(batches)])
    assert isinstance(got[1], JobError) and isinstance(got[1].error, Exception)
    want = alone.on_job(0, "train_step", batches[0])
    assert got[0]["pack/grouped_jobs"] == 1.0
    assert_same_metrics(got[0], want, 1e-6)
    assert_same_job(grouped, alone, 0, 1e-6, 1e-7)
    from peft.tuners.lora import LoraLayer

    layers = [m for m in grouped.role.model.modules() if isinstance(m, LoraLayer)]
    assert layers and not any("forward" in m.__dict__ for m in layers)


def test_a_jobs_error_from_a_merged_call_is_raised_in_that_jobs_thread_alone():
    """JobGroup.result on a merged call (a Gather's ticket): a JobError in a job's place is raised for that job;
    its mate gets its result."""

    class Merging:
        def train_step(self, samples):
            raise AssertionError("merged calls only")

    class Role:
        def train_jobs(self, calls):
            return [JobError(ValueError("job 1's loss")) if job == 1 else f"metrics {job}" for job, _ in calls]

    inner = LocalGroup([Role()])
    gather = Gather(inner, [0, 1], Merge("train_step", Role.train_jobs, 1))
    stop = threading.Event()
    views: list[JobGroup] = [JobGroup(inner, job, stop, gather) for job in (0, 1)]
    handles = [v.submit(0, Merging.train_step, [job]) for job, v in enumerate(views)]
    assert views[0].result(handles[0]) == "metrics 0"
    with pytest.raises(ValueError, match="job 1's loss"):
        views[1].result(handles[1])


def probe_pair(group_size: int, seed: int) -> tuple[list, list]:
    samples = make_samples(groups=1, group_size=group_size, seed=seed)
    return [s.prompt_ids for s in samples], [s.completion_ids for s in samples]


def never_alone(monkeypatch) -> None:
    """The grouped scoring must not fall back to scoring its jobs one after another (it does so, with a warning,
    when its forward raises)."""

    def alone(learner, job):
        raise AssertionError("the grouped probe scoring fell back to job after job")

    monkeypatch.setattr(grouped, "_logprobs_alone", alone)


@pytest.mark.parametrize("layout", [PADDED, ("learner.micro_batch_tokens=32",)], ids=["padded", "packed"])
def test_the_jobs_sync_probes_are_scored_in_one_forward_as_each_alone(tiny_model, layout, monkeypatch):
    """The pack's sync probes (PackedRole.logprobs_jobs, rl/learner/grouped.py logprobs_grouped): each job's
    completions scored through its own adapter and at its own temperature in one grouped forward, the logprobs of
    the same job's `sequence_logprobs` alone to float rounding; a job absent from a call is not scored."""
    role = shared_learner(tiny_model, JOBS, *layout)
    probes = [probe_pair(2 + j, 20 + j) for j in range(len(JOBS))]
    alone = [role.on_job(j, "sequence_logprobs", *probe) for j, probe in enumerate(probes)]
    never_alone(monkeypatch)
    together = role.logprobs_jobs([(j, probe) for j, probe in enumerate(probes)])
    for got, want in zip(together, alone):
        assert [len(x) for x in got] == [len(x) for x in want]
        for x, y in zip(got, want):
            assert x == pytest.approx(y, abs=1e-5)
    assert len({round(together[j][0][0], 4) for j in range(len(JOBS))}) == len(JOBS)  # three adapters, not one
    assert role.logprobs_jobs([(2, probes[2]), (0, probes[0])])[0][0] == pytest.approx(together[2][0], abs=1e-5)


def test_two_jobs_with_equal_settings_and_the_same_probe_are_each_scored_in_the_grouped_forward(
    tiny_model, monkeypatch
):
    """Jobs that differ only in their seed share their algorithm group, and the probe's prompts are the same for
    every job: each job's part of the grouped forward is its own however equal its fields (a lookup by equality
    compared the jobs' factors and raised, and the scoring went job after job)."""
    role = shared_learner(tiny_model, (("run.seed=0",), ("run.seed=1",)), *PADDED)
    probe = probe_pair(2, 20)
    alone = [role.on_job(j, "sequence_logprobs", *probe) for j in (0, 1)]
    never_alone(monkeypatch)
    together = role.logprobs_jobs([(0, probe), (1, probe)])
    for got, want in zip(together, alone):
        for x, y in zip(got, want):
            assert x == pytest.approx(y, abs=1e-5)
    assert together[0] != together[1]  # two adapters


def test_the_pack_sends_its_jobs_probe_scoring_to_the_learner_as_one_call(tiny_model):
    """Beside the steps' Gather, a Gather of the learner's `sequence_logprobs` calls: the jobs' k-th probe scoring
    goes to the learner as one call (a KL reference's scoring, `reference=True`, stays each job's own)."""
    role = shared_learner(tiny_model, JOBS[:2], *PADDED)
    calls: list[int] = []
    scored = role.logprobs_jobs
    role.logprobs_jobs = lambda jobs: calls.append(len(jobs)) or scored(jobs)  # type: ignore[method-assign]  # counted
    inner = LocalGroup([role])
    steps = Gather(inner, [0, 1], Merge("train_step", PackedRole.train_jobs, 1))
    probes = Gather(inner, [0, 1], LOGPROBS, beside=steps)
    stop = threading.Event()
    views: list[JobGroup] = [JobGroup(inner, j, stop, [steps, probes]) for j in (0, 1)]
    samples = make_samples(groups=1, group_size=2, seed=3)
    pair = ([s.prompt_ids for s in samples], [s.completion_ids for s in samples])
    first = views[0].submit(0, Learner.sequence_logprobs, *pair)
    assert calls == []  # job 1 has not scored its probe yet
    second = views[1].submit(0, Learner.sequence_logprobs, *pair)
    assert calls == [2]
    assert views[0].result(first) != views[1].result(second)  # each through its own adapter
    ref = views[0].result(views[0].submit(0, Learner.sequence_logprobs, *pair, True))
    assert calls == [2] and len(ref) == 2


@pytest.mark.parametrize("sizes", [[2, 2, 2], [1, 3, 2], [3, 0, 3]], ids=["equal", "unequal", "one_absent"])
def test_lora_in_the_inputs_dtype_gives_each_row_its_own_jobs_adapter(tiny_model, sizes):
    """RowAdapters(in_input_dtype=True), the Unsloth learner's grouped forward: each job's rows come out as the model
    with that job's adapter in place gives them, to bf16 rounding (the batched matmuls where the jobs have equal
    spans, one pair per job otherwise); every job in the forward gets a gradient in its slice of the stacked
    factors', an absent one zeros."""
    from rl.learner.row_lora import RowAdapters, StackedFactors

    role = shared_learner(tiny_model, JOBS, "model.learner_dtype=bfloat16")
    model = role.role.model
    ids = torch.randint(10, 4000, (sum(sizes), 9), generator=torch.Generator().manual_seed(0))
    want = []
    for job, n in enumerate(sizes):
        if not n:
            continue
        role._enter(job)
        start = sum(sizes[:job])
        with torch.no_grad():
            want.append(model(input_ids=ids[start : start + n]).logits.float())
    stack = StackedFactors(model, [state["tensors"] for state in role.states], grad=True)
    with RowAdapters(stack, in_input_dtype=True) as adapters:
        adapters.rows(sizes)
        logits = model(input_ids=ids).logits.float()
        logits.logsumexp(-1).sum().backward()
    got = logits.detach()
    scale = float(torch.cat(want).abs().max())
    assert float((got - torch.cat(want)).abs().max()) <= 0.02 * scale
    for job, n in enumerate(sizes):
        grads = [g for name, g in stack.grads(job).items() if "lora_A" in name]
        assert all(g is not None for g in grads)
        assert all(bool(g.abs().sum() > 0) for g in grads) if n else all(bool(g.abs().sum() == 0) for g in grads)


# ------------------------------------------------------------------------------------------------ the pack's choice


@pytest.mark.parametrize(
    ("settings", "setting", "grouped", "line"),
    [
        ({}, True, True, None),
        ({"cluster.use_gpu": True}, "auto", True, None),
        ({}, "auto", False, "(hydra.launcher.grouped_learner=auto on a CPU learner; true groups them there too)"),
        ({"model.learner_backend": "unsloth", "cluster.use_gpu": True}, "auto", True, None),
        ({"model.lora_dropout": 0.1}, True, False, "(model.lora_dropout>0: each job's dropout masks come from its own"),
        ({}, False, False, "(hydra.launcher.grouped_learner=false)"),
    ],
    ids=["peft", "auto_gpu", "auto_cpu", "unsloth", "lora_dropout", "off"],
)
def test_a_pack_groups_its_learner_steps_where_its_learner_can_and_says_so_where_not(
    monkeypatch, tmp_path, capsys, settings, setting, grouped, line
):
    """`hydra.launcher.grouped_learner` (`setting`): true groups where the learner can, auto only on a GPU, false
    never; where the steps go one after another the pack says why in one line."""

    def build_runtime(cfg, pack=None, log_dir=None):
        role = PackedRole(FakeMergingEngine, [{"seed": c.run.seed} for c in pack])
        return SimpleNamespace(actors=LocalGroup([role]), learners=LocalGroup([role])), lambda: None

    monkeypatch.setattr("rl.app.build_runtime", build_runtime)
    p = pack.Pack([0, 1], tmp_path, grouped_learner=setting)
    for job in (0, 1):
        p.cfgs[job] = typed_config(**{"run.seed": job, **settings})
    p.start()
    p.close()
    said = [x for x in capsys.readouterr().out.splitlines() if "one after another" in x]
    assert (p.phases[0].train is not None) == grouped
    assert len(said) == (line is not None)
    assert line is None or said[0].startswith("pack: the learner steps the jobs one after another " + line)


# ------------------------------------------------------------------------------------------------ the learner Gather

TRAIN = Merge("train", PackedRole.train_jobs, 1)  # FakePackedRole's step is `train`


def two_gathers(n: int):
    engine = PackedRole(FakeMergingEngine, [dict(seed=j) for j in range(n)])
    learner = PackedRole(FakeMergingEngine, [dict(seed=j) for j in range(n)])
    generate = Gather(LocalGroup([engine]), list(range(n)))
    train = Gather(LocalGroup([learner]), list(range(n)), TRAIN, beside=generate)
    stop = threading.Event()
    actors = [JobGroup(generate.inner, j, stop, generate) for j in range(n)]
    learners = [JobGroup(train.inner, j, stop, train) for j in range(n)]
    return engine, learner, train, actors, learners


def test_the_jobs_kth_steps_go_to_the_learner_as_one_call():
    _, learner, _, _, views = two_gathers(2)
    first = views[0].submit(0, FakeMergingEngine.train, 1.0)
    assert learner.role.grouped_calls == []  # job 1 has not stepped yet
    second = views[1].submit(0, FakeMergingEngine.train, 2.0)
    assert learner.role.grouped_calls == [2]
    assert [views[0].result(first), views[1].result(second)] == [1, 1]
    assert learner.on_job(1, "factor_values") != learner.on_job(0, "factor_values")


def test_a_job_blocked_on_its_step_is_not_waited_for_by_the_engine():
    """Job 1 waits for its step, which waits for job 0's; job 0 makes one more generate call first (an evaluation,
    a dynamic-sampling round): it goes to the engine alone instead of waiting for job 1's next generate call."""
    engine, learner, train, actors, learners = two_gathers(2)
    waiting = learners[1].submit(0, FakeMergingEngine.train, 1.0)
    out: dict[str, int] = {}
    t = threading.Thread(target=lambda: out.update(step=learners[1].result(waiting)))
    t.start()
    try:
        with train.cond:  # job 1's thread is blocked on its unsent step
            assert train.cond.wait_for(lambda: 1 in train.board.blocked, timeout=60)
        extra = actors[0].submit(0, RolloutActor.generate, [7], None)
        assert engine.role.engine_calls == [1] and actors[0].result(extra) == [(7, 0)]
        learners[0].result(learners[0].submit(0, FakeMergingEngine.train, 1.0))
    finally:
        t.join(timeout=60)
    assert not t.is_alive() and out == {"step": 1} and learner.role.grouped_calls == [2]


def test_a_job_that_leaves_releases_its_mates_waiting_steps():
    _, learner, train, _, views = two_gathers(3)
    waiting = [views[j].submit(0, FakeMergingEngine.train, 1.0) for j in (0, 1)]
    assert learner.role.grouped_calls == []
    train.leave(2)  # job 2 ended (finished, failed or stopped): its mates' steps no longer wait for it
    assert learner.role.grouped_calls == [2] and [views[j].result(h) for j, h in zip((0, 1), waiting)] == [1, 1]


# ------------------------------------------------------------------------------------------------------ phases


@pytest.mark.parametrize(
    ("jobs", "setting", "merged", "expected"),
    [(8, 1, True, 1), (8, 2, True, 2), (2, 3, True, 2), (8, 2, False, 1)],
    ids=["one", "two", "capped", "unmerged"],
)
def test_a_pack_steps_in_the_phases_its_setting_gives(jobs, setting, merged, expected):
    """`hydra.launcher.phases`: at most one job a phase, and one phase where nothing of the pack is merged."""
    assert pack.phase_count(jobs, setting, merged=merged) == expected


def test_each_phase_merges_its_own_jobs_calls_and_never_waits_for_another_phase(monkeypatch, tmp_path, capsys):
    """Four jobs in two phases (slots 0, 2 and 1, 3): the k-th generate calls and learner steps of a phase's jobs go
    to the role as one call, as soon as that phase's jobs have them; a job of the other phase is not waited for."""

    def build_runtime(cfg, pack=None, log_dir=None):
        role = PackedRole(FakeMergingEngine, [{"seed": c.run.seed} for c in pack])
        return SimpleNamespace(actors=LocalGroup([role]), learners=LocalGroup([role])), lambda: None

    monkeypatch.setattr("rl.app.build_runtime", build_runtime)
    monkeypatch.setattr(pack, "TRAIN", TRAIN)  # FakeMergingEngine's step is `train`
    p = pack.Pack([10, 11, 12, 13], tmp_path, grouped_learner=True, phases=2)
    for job in p.jobs:
        p.cfgs[job] = typed_config(**{"run.seed": job, "cluster.lora_mode": "native"})
    p.start()
    try:
        assert [ph.slots for ph in p.phases] == [[0, 2], [1, 3]]
        assert "pack: the jobs step in 2 phases (#10, #12 | #11, #13; hydra.launcher.phases)" in capsys.readouterr().out
        assert p.runtimes is not None
        engine = p.runtimes[10].actors.inner.members[0].role
        views = {job: p.runtimes[job].actors for job in p.jobs}
        first = views[10].submit(0, RolloutActor.generate, [1], None)
        assert engine.engine_calls == []  # job 12, its phase mate, has not called yet
        other = views[11].submit(0, RolloutActor.generate, [2], None)
        assert engine.engine_calls == []  # job 13 neither: job 11's phase waits for it, not for job 10's
        mate = views[12].submit(0, RolloutActor.generate, [3], None)
        assert engine.engine_calls == [2]  # jobs 10 and 12 as one call, without jobs 11 and 13
        assert views[10].result(first) == [(1, 0)] and views[12].result(mate) == [(3, 0)]
        p.ended(13)  # job 13 ends: its phase mate's call goes alone
        assert engine.engine_calls == [2, 1] and views[11].result(other) == [(2, 0)]
        learners = {job: p.runtimes[job].learners for job in (10, 12)}
        steps = [learners[j].submit(0, FakeMergingEngine.train, 1.0) for j in (10, 12)]
        assert [learners[j].result(h) for j, h in zip((10, 12), steps)] == [1, 1]
        assert engine.grouped_calls == [2]
    finally:
        p.close()
