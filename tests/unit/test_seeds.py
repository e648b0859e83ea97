"""Per-prompt sampling seeds (rl/seeds.py prompt_seed): derived from the run seed and the prompt's draw number, they
travel with their prompt to whichever actor gets it (a dead actor's prompts, a stale sample's redo), so the
samples of a prompt are the same whatever the placement, the staleness, the dynamic-sampling rounds or a resume;
and HF generation with seeds is independent of the batch a prompt is in."""

from __future__ import annotations

import pytest

from rl.resolve import from_overrides
from rl.runtime.groups import LocalGroup
from rl.runtime.runtime import Runtime
from rl.seeds import SEED_BITS, prompt_seed
from rl.types import Sampling
from tests.fakes import FakeActor, FakeLearner, run_loop


class SeedActor(FakeActor):
    """A fake actor that records which seed came with each prompt."""

    def __init__(self, index: int = 0, die_on: tuple[int, ...] = (), log: list | None = None):
        super().__init__(index, die_on)
        self.log = log if log is not None else []

    def generate(self, prompts, sampling, seeds=None):
        out = super().generate(prompts, sampling, seeds)
        assert seeds is not None and len(seeds) == len(prompts)
        self.log.extend((p[0], s, sampling.n) for p, s in zip(prompts, seeds))
        return out


def test_prompt_seed_is_stable_distinct_and_in_range():
    assert prompt_seed(0, 5) == prompt_seed(0, 5)  # a hash of its inputs, not of the process (no hash())
    seeds = {prompt_seed(run, i, stream, step) for run in (0, 1) for i in range(200) for stream in ("train", "eval")
             for step in (0, 1)}  # fmt: skip
    assert len(seeds) == 2 * 200 * 2 * 2
    assert all(0 <= s < 2**SEED_BITS for s in seeds)


def test_seeds_travel_with_their_prompts_to_a_live_actor_when_one_dies():
    log: list = []
    actors = [SeedActor(0, die_on=(1,), log=log), SeedActor(1, log=log)]
    cfg = from_overrides("/m", "cluster.actor_max_restarts=1")
    runtime = Runtime(LocalGroup(actors), LocalGroup([FakeLearner()]), cfg.cluster)
    prompts, seeds = [[1], [2], [3], [4]], [11, 12, 13, 14]
    rollouts = runtime.generate(prompts, Sampling(n=2), seeds)
    assert [r.prompt_ids[0] for r in rollouts] == [1, 2, 3, 4] and {r.actor for r in rollouts} == {1}
    assert sorted(log) == [(1, 11, 2), (2, 12, 2), (3, 13, 2), (4, 14, 2)]  # actor 0's prompts kept their seeds


def test_learner_generation_gets_the_seeds_of_its_share():
    log: list = []

    class SeedLearner(FakeLearner):
        def generate(self, prompts, sampling, seeds=None):
            log.extend(("learner", p[0], s) for p, s in zip(prompts, seeds))
            return super().generate(prompts, sampling, seeds)

    actor = SeedActor()
    cfg = from_overrides("/m", "cluster.learner_chunk_size=1")
    runtime = Runtime(LocalGroup([actor]), LocalGroup([SeedLearner()]), cfg.cluster)
    runtime.generate([[1], [2], [3]], Sampling(n=1), [21, 22, 23])
    assert log == [("learner", 1, 21)] and actor.log == [(2, 22, 1), (3, 23, 1)]


def train_seeds(tmp_path, actors, *, learner=None, staleness=0, steps=4, **kw) -> None:
    cfg = from_overrides("/m", f"cluster.staleness={staleness}", "cluster.actor_max_restarts=1")
    runtime = Runtime(LocalGroup(actors), LocalGroup([learner or FakeLearner()]), cfg.cluster)
    run_loop(tmp_path, runtime, steps=steps, staleness=staleness, **kw)


def test_each_prompt_draw_gets_the_same_seed_whatever_the_actors_and_staleness(tmp_path):
    """run_loop's data: 5 prompts, 2 per step, seed 3; group size 2. The probe (2 fixed prompts, n=2) is told
    apart by its seeds (stream "probe")."""
    probe = {prompt_seed(3, i, "probe", step) for i in range(2) for step in range(5)}

    def training(log):
        return sorted(x for x in log if x[1] not in probe)

    one: list = []
    train_seeds(tmp_path / "one", [SeedActor(log=one)])
    two: list = []
    train_seeds(tmp_path / "two", [SeedActor(0, die_on=(2,), log=two), SeedActor(1, log=two)])
    ahead: list = []
    train_seeds(tmp_path / "ahead", [SeedActor(log=ahead)], staleness=1)
    assert training(one) == training(two) == training(ahead)
    draws = [x for x in one if x[1] not in probe]
    assert len(draws) == 8  # 4 steps x 2 prompts, the data repeats after 5: its draw number tells repeats apart
    assert [s for _, s, _ in draws] == [prompt_seed(3, k) for k in range(8)]
    # the probe (the sync check: floor at step 0, then after each step's sync) samples with its own seeds
    assert [s for _, s, _ in one if s in probe] == [prompt_seed(3, i, "probe", t) for t in range(5) for i in range(2)]


def test_a_resumed_run_sends_the_seeds_of_an_uninterrupted_one(tmp_path):
    """Staleness 1: the batch in flight at the checkpoint (step 2) is drawn and sent again on resume, same seeds."""
    from rl.errors import RunStopped

    probe = {prompt_seed(3, i, "probe", step) for i in range(2) for step in range(6)}
    straight: list = []
    train_seeds(tmp_path / "a", [SeedActor(log=straight)], steps=5, staleness=1)
    first: list = []
    with pytest.raises(RunStopped):
        train_seeds(tmp_path / "b", [SeedActor(log=first)], learner=FakeLearner(die_at=3), steps=5, staleness=1,
                    save_interval=2)  # fmt: skip
    resumed: list = []
    ckpt = str(tmp_path / "b" / "checkpoints" / "step_0002")
    train_seeds(tmp_path / "b", [SeedActor(log=resumed)], steps=5, staleness=1, resume=ckpt)
    straight, resumed = [x for x in straight if x[1] not in probe], [x for x in resumed if x[1] not in probe]
    assert len(straight) == 10 and resumed == straight[4:]  # draws 4-9: steps 3-5


@pytest.mark.parametrize("rollout", ["hf", "learner"])
def test_hf_samples_of_a_seeded_prompt_do_not_depend_on_its_batch(tiny_model, rollout):
    """HFRollout and learner generation: prompt B sampled alone equals prompt B sampled after A (seeded); without
    seeds it does not (the per-prompt seed is drawn from one generator, so it depends on the prompts before)."""
    from tests.helpers import make_learner

    if rollout == "hf":
        from rl.app import rollout_args
        from rl.rollout.hf import HFRollout

        engine = HFRollout(
            **rollout_args(from_overrides(str(tiny_model), "model.dtype=float32", "cluster.rollout_backend=hf"))
        )
    else:
        engine = make_learner(tiny_model)
    a, b = [1, 2, 3, 4, 5], [6, 7, 8, 9]
    sampling = Sampling(n=3, temperature=1.0, max_tokens=6)

    def tokens(rollouts):
        return [c.token_ids for c in rollouts[-1].completions]

    together = tokens(engine.generate([a, b], sampling, [101, 202]))
    alone = tokens(engine.generate([b], sampling, [202]))
    assert together == alone
    assert tokens(engine.generate([b], sampling, [203])) != alone  # the seed decides
