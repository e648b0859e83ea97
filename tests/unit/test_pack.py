"""Sweep packs without Ray or vLLM: which jobs share a pack and the one line that says why others do not
(rl/pack.py split), the settings a pack refuses (refusal), the pack's start in its jobs' threads (Pack), and one
role shared by several jobs (rl/runtime/packed.py PackedRole, JobGroup) on a fake role: each call runs with its own
job's attributes, tensors and RNG. The launcher's one-line refusals through train.py (a second each).
A packed sweep with real roles is tests/integration/test_packs.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from rl import pack
from rl.errors import StartupError
from rl.runtime.groups import LocalGroup
from rl.runtime.packed import BusyClock, Gather, JobGroup, PackedRole
from rl.runtime.roles import RolloutActor
from tests.fakes import FakeMergingEngine, FakePackedRole
from tests.helpers import run_train, typed_config

# ------------------------------------------------------------------------------------------------ split

# keys a pack's jobs may set each their own way (rl/pack.py): one pack whatever their values
PER_JOB = {
    "algorithm.lr": [1e-5, 3e-4],
    "algorithm.kl_coef": [0.0, 0.05],
    "algorithm.group_size": [4, 8],
    "run.seed": [0, 1],
    "run.steps": [2, 5],
    "run.prompts_per_step": [2, 4],
    "eval.size": [0, 8],
    "checkpoint.interval": [0, 1],
}


def configs(key: str, values: list) -> list:
    return [typed_config(**{key: v}) for v in values]


@pytest.mark.parametrize("key", list(PER_JOB))
def test_jobs_that_differ_in_a_per_job_key_share_one_pack(key):
    packs, notes = pack.split(configs(key, PER_JOB[key]), max_jobs=8)
    assert packs == [[0, 1]] and notes == []


# keys a pack's jobs share (the model, cluster and learner groups, run.deterministic) and two values each
SHARED = {
    "model.lora_rank": (8, 16),
    "model.lora_targets": ("[q_proj,v_proj]", "[q_proj,k_proj,v_proj]"),
    "model.max_new_tokens": (16, 32),
    "model.path": ("org/base-a", "org/base-b"),
    "model.lora_alpha": (16, 32),
    "cluster.num_actors": (1, 2),
    "cluster.rollout_backend": ("vllm", "hf"),
    "learner.micro_batch_size": (4, 8),
    "run.deterministic": (False, True),
}


@pytest.mark.parametrize("key", list(SHARED))
def test_a_sweep_over_a_shared_key_is_split_with_one_line_naming_it(key):
    a, b = SHARED[key]
    cfgs = [typed_config(**{key: v}) for v in (a, b, a, b, b)]
    packs, notes = pack.split(cfgs, max_jobs=8)
    assert packs == [[0, 2], [1, 3, 4]]
    shown = {x: pack.shared_values(c)[key] for x, c in zip((a, b), cfgs)}
    assert notes == [
        f"pack: job(s) #1, #3, #4 differ from #0 in {key} ({shown[b]!r} vs {shown[a]!r}): they train in a pack of "
        "their own"
    ]


def test_the_line_names_the_first_differing_key_and_each_group_gets_one():
    cfgs = [
        typed_config(),
        typed_config(**{"model.lora_rank": 8, "model.max_new_tokens": 64}),  # two keys: the first in order is named
        typed_config(**{"cluster.num_actors": 2}),
    ]
    packs, notes = pack.split(cfgs, max_jobs=8)
    assert packs == [[0], [1], [2]]
    assert [n.split(" (")[0] for n in notes] == [
        "pack: job(s) #1 differ from #0 in model.lora_rank",
        "pack: job(s) #2 differ from #0 in cluster.num_actors",
    ]


def test_max_jobs_bounds_a_pack_without_a_line():
    cfgs = [typed_config(**{"run.seed": s}) for s in range(5)]
    assert pack.split(cfgs, max_jobs=2) == ([[0, 1], [2, 3], [4]], [])
    assert pack.split(cfgs, max_jobs=1) == ([[0], [1], [2], [3], [4]], [])


def test_what_a_pack_shares_is_its_groups_and_run_deterministic_only():
    keys = set(pack.shared_values(typed_config()))
    groups = {k.split(".")[0] for k in keys if k != "run.deterministic"}
    assert groups == set(pack.SHARED_GROUPS) and "run.deterministic" in keys
    assert "model.path" in keys and "model.actor_path" not in keys  # filled by the resolve step from shared keys


# ------------------------------------------------------------------------------------------------ refusal

# (the settings, the key the line must name): each is a valid config a pack cannot train
REFUSED = [
    ({"model.full_finetune": True}, "model.full_finetune"),
    ({"cluster.num_learners": 2}, "cluster.num_learners"),
    (
        {"cluster.rollout_mode": "continuous", "cluster.staleness": 1, "algorithm.tis_cap": 2.0},
        "cluster.rollout_mode",
    ),
    ({"cluster.colocate": True, "cluster.use_gpu": True}, "cluster.colocate"),
    (
        {
            "cluster.weight_sync": "ipc",
            "cluster.use_gpu": True,
            "cluster.gpus_per_actor": 0.5,
            "cluster.gpus_per_learner": 0.5,
        },
        "cluster.weight_sync",
    ),
    ({"cluster.num_teachers": 1}, "cluster.num_teachers"),
]


@pytest.mark.parametrize(("settings", "key"), REFUSED, ids=[k for _, k in REFUSED])
def test_each_refusal_is_one_line_naming_its_key(settings, key):
    line = pack.refusal(typed_config(**settings))
    assert line is not None and "\n" not in line
    assert line.startswith(f"hydra/launcher=pack: {key}")
    assert line.endswith("or run the sweep without hydra/launcher=pack")


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"cluster.rollout_backend": "hf"},
        {"cluster.lora_mode": "native"},
        {"cluster.lora_mode": "merged"},
        {"cluster.mode": "local", "cluster.rollout_backend": "hf"},
    ],
    ids=["defaults", "hf", "native", "merged", "local"],
)
def test_a_packable_config_is_not_refused(settings):
    assert pack.refusal(typed_config(**settings)) is None


@pytest.mark.parametrize(
    ("settings", "cores", "expected"),
    [
        ({}, 2, {"lora_mode": "merged", "actor_threads": 1, "learner_threads": 1}),
        ({"cluster.num_actors": 3}, 8, {"lora_mode": "merged", "actor_threads": 2, "learner_threads": 2}),
        ({"cluster.ray_num_cpus": 4}, 16, {"lora_mode": "merged", "actor_threads": 2, "learner_threads": 2}),
        ({"cluster.actor_threads": 2, "cluster.lora_mode": "native"}, 2, {"learner_threads": 1}),
        ({"cluster.address": "auto"}, 2, {"lora_mode": "merged"}),
        ({"cluster.use_gpu": True, "cluster.gpus_per_actor": 0.5, "cluster.gpus_per_learner": 0.5}, 2,
         {"lora_mode": "native"}),
    ],
    ids=["cpu", "three_actors", "ray_num_cpus", "threads_set", "remote_ray", "cuda"],
)  # fmt: skip
def test_a_pack_sets_what_its_jobs_left_to_the_machine(settings, cores, expected):
    """The LoRA mode by device; on a CPU pack of a local Ray, the cores split between the roles that run at once."""
    got = pack.auto_settings(typed_config(**settings), cores)
    assert {k: getattr(v, "value", v) for k, v in got.items()} == expected


# ------------------------------------------------------------------------------------------------ PackedRole


def packed(*seeds: int, scales: tuple[float, ...] = ()) -> PackedRole:
    """One FakePackedRole shared by a job per seed (each with its scale, 1 by default)."""
    scales = scales or (1.0,) * len(seeds)
    return PackedRole(FakePackedRole, [{"seed": s, "scale": x} for s, x in zip(seeds, scales)])


def solo(seed: int, scale: float = 1.0) -> FakePackedRole:
    """The job as a role of its own: what the pack must give the job, call for call."""
    role = FakePackedRole(seed=seed, scale=scale)
    role.add_job(0, seed=seed, scale=scale)
    return role


def solo_after(seed: int, *xs: float) -> list[float]:
    """A role of its own's factor after `train(x)` for each of `xs`."""
    role = solo(seed)
    for x in xs:
        role.train(x)
    return role.factor_values()


def test_each_call_runs_with_its_jobs_own_attributes_and_tensors():
    shared = packed(0, 1, scales=(1.0, 2.0))
    alone = [solo(0), solo(1, 2.0)]
    for job, x in [(0, 1.0), (1, 0.5), (0, 0.25), (0, 3.0), (1, -1.0)]:
        assert shared.on_job(job, "train", x) == alone[job].train(x)
    for job in (0, 1):
        assert shared.on_job(job, "factor_values") == alone[job].factor_values()
        state = shared.states[job]["attrs"]
        assert (state["version"], state["scale"], state["seen"]) == (
            alone[job].version,
            alone[job].scale,
            alone[job].seen,
        )
    assert shared.on_job(0, "factor_values") != shared.on_job(1, "factor_values")  # seeds 0 and 1 drew differently
    assert shared.jobs() == 2


def test_a_jobs_tensors_are_its_own_storage_swapped_in_without_a_copy_and_the_base_is_shared():
    shared = packed(0, 1, 2)
    seen = [shared.on_job(job, "storage") for job in range(3)]
    assert len({s["base"] for s in seen}) == 1  # one base for every job
    assert len({s["factor"] for s in seen}) == 3  # one factor each
    for job in range(3):  # the role works on the job's own tensor, not on a copy of it
        assert seen[job]["factor"] == shared.states[job]["tensors"]["factor"].data_ptr()
        assert shared.on_job(job, "storage") == seen[job]


def test_a_tensor_made_after_a_job_joined_starts_at_zero_for_the_jobs_that_have_not_loaded_it():
    shared = packed(0, 1)
    assert shared.on_job(0, "slot_values") is None
    shared.on_job(0, "load_slot", [1.0, 2.0])
    assert shared.on_job(1, "slot_values") == [0.0, 0.0]  # LoRA factors of zero: the base model, unchanged
    shared.on_job(1, "load_slot", [5.0, 6.0])
    assert shared.on_job(0, "slot_values") == [1.0, 2.0]
    assert shared.on_job(1, "slot_values") == [5.0, 6.0]


def test_each_job_draws_from_its_own_rng_whatever_the_order_of_calls():
    shared = packed(3, 4)
    order = [0, 0, 1, 0, 1, 1, 0]
    got = [shared.on_job(j, "draw") for j in order]
    for job, seed in enumerate((3, 4)):
        alone = solo(seed)  # torch's RNG is process-wide: the job's draws alone, one job at a time
        assert [x for x, j in zip(got, order) if j == job] == [alone.draw() for _ in range(order.count(job))]


def test_a_failed_call_keeps_what_it_changed_in_its_own_job_only():
    shared = packed(0, 1)
    with pytest.raises(ValueError, match="failed after changing"):
        shared.on_job(0, "fail_after_train", 1.0)
    assert shared.states[0]["attrs"]["version"] == 1 and shared.on_job(0, "factor_values") == solo_after(0, 1.0)
    assert shared.states[1]["attrs"]["version"] == 0 and shared.on_job(1, "factor_values") == solo_after(1)


def test_each_jobs_view_reports_the_shared_roles_busy_time_over_its_own_steps():
    """A pack's jobs share their roles: each job's idle fractions are the shared roles' over that job's step, so
    each view's pop_busy_s is the busy time collected since that job last asked, whichever job's call it was (the
    first job to ask took it all, and its mates' actors showed idle 1.0)."""
    shared = packed(0, 1)
    inner = LocalGroup([shared])
    clock = BusyClock(inner)
    views = [JobGroup(inner, job, threading.Event(), clock=clock) for job in (0, 1)]
    views[0].call(FakePackedRole.train, [(1.0,)])
    first = views[0].pop_busy_s()
    assert first > 0 and views[1].pop_busy_s() == first  # job 1's step saw the shared role busy as long
    assert views[0].pop_busy_s() == 0 == views[1].pop_busy_s()
    views[1].call(FakePackedRole.train, [(1.0,)])
    second = views[1].pop_busy_s()
    assert second > 0 and views[0].pop_busy_s() == second


def test_a_job_group_sends_each_call_to_its_job_and_stops_when_the_pack_stops():
    shared = packed(0, 1)
    stop = threading.Event()
    views = [JobGroup(LocalGroup([shared]), job, stop) for job in (0, 1)]
    assert views[0].call(FakePackedRole.train, [(1.0,)]) == [1]
    assert views[0].broadcast(FakePackedRole.train, 1.0) == [2]
    assert views[1].result(views[1].submit(0, FakePackedRole.train, 1.0)) == 1
    assert len(views[0]) == 1 and views[0].ready(0)
    views[0].close()  # a job's view leaves the shared role running
    assert shared.role.closed == 0
    stop.set()
    with pytest.raises(KeyboardInterrupt):
        views[1].submit(0, FakePackedRole.train, 1.0)
    assert shared.states[1]["attrs"]["version"] == 1  # the stopped call never reached the role
    shared.close()
    assert shared.role.closed == 1


# ------------------------------------------------------------------------------------------------ Pack


def join_in_thread(p: pack.Pack, job: int, cfg, out: dict) -> threading.Thread:
    """Job `job`'s thread, as the launcher starts it: joins the pack and keeps what it got (its runtime, or the
    exception)."""

    def run():
        try:
            out[job] = p.join(job, cfg)[0]
        except BaseException as e:  # noqa: BLE001 - the test reads what the job's thread got
            out[job] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    p.wait_settled(job)
    return t


def test_each_job_of_a_pack_gets_its_runtime_on_the_shared_roles(monkeypatch, tmp_path):
    """Jobs #4 and #7 of a sweep join; the roles start once, for both (slots 0 and 1), and each job's runtime
    reaches its own state on them; closing the pack tears the roles down once."""
    built, torn = [], []

    def build_runtime(cfg, pack=None, log_dir=None):
        built.append(([c.run.seed for c in pack], log_dir))
        role = PackedRole(FakePackedRole, [{"seed": c.run.seed} for c in pack])
        return SimpleNamespace(actors=LocalGroup([role]), learners=LocalGroup([role])), lambda: torn.append(1)

    monkeypatch.setattr("rl.app.build_runtime", build_runtime)
    p, got = pack.Pack([4, 7], tmp_path / "logs"), {}
    threads = [join_in_thread(p, job, typed_config(**{"run.seed": job}), got) for job in (4, 7)]
    p.start()
    for t in threads:
        t.join(timeout=60)
    assert built == [([4, 7], tmp_path / "logs")]
    assert got[7].learners.call(FakePackedRole.train, [(1.0,)]) == [1]
    assert got[7].actors.call(FakePackedRole.factor_values, [()]) == [solo_after(7, 1.0)]
    assert got[4].learners.call(FakePackedRole.factor_values, [()]) == [solo_after(4)]
    got[4].learners.close()
    assert torn == []
    p.close()
    p.close()
    assert torn == [1]


def test_a_pack_whose_roles_fail_to_start_tells_every_waiting_job(monkeypatch, tmp_path):
    def build_runtime(cfg, pack=None, log_dir=None):
        raise RuntimeError("no engine today")

    monkeypatch.setattr("rl.app.build_runtime", build_runtime)
    p, got = pack.Pack([0, 1], tmp_path), {}
    threads = [join_in_thread(p, job, typed_config(), got) for job in (0, 1)]
    with pytest.raises(RuntimeError, match="no engine today"):
        p.start()
    for t in threads:
        t.join(timeout=60)
    assert all(isinstance(got[j], StartupError) for j in (0, 1))
    assert "the pack's roles did not start: no engine today" in str(got[0])


def test_an_interrupted_pack_stops_the_jobs_waiting_for_its_roles(tmp_path):
    p, got = pack.Pack([0, 1], tmp_path), {}
    threads = [join_in_thread(p, job, typed_config(), got) for job in (0, 1)]
    p.interrupt()
    for t in threads:
        t.join(timeout=60)
    assert all(isinstance(got[j], KeyboardInterrupt) for j in (0, 1))
    assert p.stop.is_set()


# ------------------------------------------------------------------------------------------------ the launcher


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            ["cluster.num_learners=2"],
            "hydra/launcher=pack: cluster.num_learners=2: a pack trains on one learner (set cluster.num_learners=1)",
        ),
        (["hydra.launcher.max_jobs=0"], "hydra.launcher.max_jobs must be a whole number >= 1 (got 0)"),
        (["hydra.launcher.grouped_learner=2"], "hydra.launcher.grouped_learner must be true, false or auto (got 2)"),
        (["hydra.launcher.phases=0"], "hydra.launcher.phases must be a whole number >= 1 (got 0)"),
    ],
    ids=["refused", "max_jobs", "grouped_learner", "phases"],
)
def test_the_launcher_refuses_in_one_line_before_any_job_starts(tmp_path, settings, line):
    """Through train.py (the default model: nothing is loaded before the refusal)."""
    sweep = tmp_path / "sweep"
    proc = run_train(["-m", "run.seed=0,1", "hydra/launcher=pack", f"hydra.sweep.dir={sweep}", *settings])
    assert proc.returncode == 2
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and line in errors[0], proc.stderr[-2000:]
    assert not (sweep / "0").exists() and not (sweep / "packs").exists()


def test_the_launcher_reads_each_jobs_config_with_its_directory_so_a_pack_resumes():
    """run.resume=auto needs run.output_dir: the launcher's view of a job has the job's directory there, as train.py
    gives the job itself (the command an interrupted pack prints continues it)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.utils import setup_globals
    from omegaconf import open_dict

    from hydra_plugins.rlft_pack_launcher.pack_launcher import job_config
    from rl.config.schema import register_configs
    from tests.helpers import CONF

    register_configs()
    setup_globals()  # the ${now:...} of the default sweep directory
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = compose("train", ["run.resume=auto", "hydra.sweep.dir=/sweeps/a"], return_hydra_config=True)
    with open_dict(config):
        config.hydra.job.num = 3  # as the launcher numbers its jobs
    cfg = job_config(config)
    assert (cfg.run.output_dir, cfg.run.resume) == ("/sweeps/a/3", "auto")
    assert pack.refusal(cfg) is None


def merging_pack(n: int) -> tuple[PackedRole, Gather, list[JobGroup]]:
    role = PackedRole(FakeMergingEngine, [dict(seed=j) for j in range(n)])
    inner = LocalGroup([role])
    gather = Gather(inner, list(range(n)))
    stop = threading.Event()
    return role, gather, [JobGroup(inner, j, stop, gather) for j in range(n)]


def test_the_jobs_kth_generate_calls_go_to_the_engine_as_one_call():
    role, gather, views = merging_pack(3)
    role.on_job(1, "train", 1.0)  # job 1 is at version 1: its requests say so after the merge too
    first = [v.submit(0, RolloutActor.generate, [10 * j, 10 * j + 1], None) for j, v in enumerate(views[:2])]
    assert role.role.engine_calls == [] and views[0].wait(first, 0.0) == []  # job 2 has not called yet
    third = views[2].submit(0, RolloutActor.generate, [20], None)
    assert role.role.engine_calls == [3]  # the third call sent all three at once
    assert [views[j].result(h) for j, h in enumerate(first)] == [[(0, 0), (1, 0)], [(10, 1), (11, 1)]]
    assert views[2].result(third) == [(20, 0)]
    assert views[0].wait(first, 0.0) == [0, 1]


def test_a_job_that_leaves_is_no_longer_waited_for_and_a_call_with_items_goes_alone():
    role, gather, views = merging_pack(2)
    waiting = views[0].submit(0, RolloutActor.generate, [1], None)
    gather.leave(1)  # job 1 ended (finished, failed or stopped)
    assert role.role.engine_calls == [1] and views[0].result(waiting) == [(1, 0)]
    # a multi-turn call (items given) is the job's own call, never merged
    alone = views[0].submit(0, RolloutActor.generate, [2], None, None, [{"q": 1}])
    assert views[0].result(alone) == [(2, 0)] and role.role.engine_calls == [1, 1]  # its own engine call


class CountingGroup(LocalGroup):
    """A LocalGroup that counts the results fetched from it (a Ray group deserializes each fetch)."""

    def __init__(self, members: list):
        super().__init__(members)
        self.fetched = 0

    def result(self, handle):
        self.fetched += 1
        return super().result(handle)


def test_a_merged_calls_results_are_fetched_once_for_all_its_jobs_and_let_go_after_the_last():
    """The jobs of a merged call read its results from one fetch: a Ray group's results of a pack of 8 were
    deserialized once per job, all of them in each job's thread, and their busy time counted 8 times."""
    role = PackedRole(FakeMergingEngine, [dict(seed=j) for j in range(3)])
    inner = CountingGroup([role])
    gather = Gather(inner, [0, 1, 2])
    views = [JobGroup(inner, j, threading.Event(), gather) for j in range(3)]
    handles = [v.submit(0, RolloutActor.generate, [j], None) for j, v in enumerate(views)]
    assert [v.result(h) for v, h in zip(views, handles)] == [[(0, 0)], [(1, 0)], [(2, 0)]]
    assert inner.fetched == 1
    assert handles[0].token.sent.value is None  # read by every job: nothing held
