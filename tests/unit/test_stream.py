"""Continuous generation (cluster.rollout_mode=continuous, rl/runtime/stream.py and rl/loop/continuous.py) with fake
roles, no Ray and no model: samples generated in segments continue across adapter loads with per-token versions,
groups are taken in the order they finish, the per-sample staleness bound drops and counts, a dead actor's segment
goes to a live one, and a resumed run trains every prompt once."""

from __future__ import annotations

import pickle

import pytest

from rl import resolve as specs
from rl.config.schema import ConfigError
from rl.errors import RunStopped
from rl.loop.continuous import ContinuousSampler
from rl.loop.driver import make_sampler, prompt_data, train
from rl.metrics import MetricsLogger
from rl.runtime.groups import LocalGroup, MemberDied
from rl.runtime.runtime import Runtime
from rl.runtime.stream import NewGroup, Stream
from rl.types import Adapter, Completion, PromptRollout, Sampling
from tests.fakes import FAKE, Env, FakeLearner, NumberTokenizer, length_reward
from tests.helpers import metric_rows, typed_config

CONTINUOUS = ("cluster.rollout_mode=continuous", "cluster.staleness=1", "algorithm.tis_cap=2.0")


def target_length(prompt_id: int) -> int:
    """How many tokens the fake model writes for prompt <id>: a long tail (every fifth prompt, 0 first, is long)."""
    return 9 if prompt_id % 5 == 0 else 1 + prompt_id % 3


class SegmentActor:
    """Writes target_length(prompt) tokens (each its adapter version) over as many segments as the caps cut it
    into; `die_on` call numbers raise MemberDied as a killed Ray actor would (and come back at version 0)."""

    def __init__(self, die_on: tuple[int, ...] = ()):
        self.version, self.calls, self.die_on, self.loads = 0, 0, die_on, 0
        self.segments: list[tuple[int, int]] = []  # (prompt id, tokens done before the segment)

    def continue_samples(self, prompts, sampling, caps, seeds):
        assert sampling.n == 1 and len(set(seeds)) == len(seeds)
        self.calls += 1
        if self.calls in self.die_on:
            self.version = 0
            raise MemberDied("rollout actor", 0, "ActorDiedError: SIGKILL")
        out = []
        for p, cap in zip(prompts, caps):
            done = len(p) - 1  # prompts are one token long (NumberTokenizer)
            self.segments.append((p[0], done))
            k = min(cap, target_length(p[0]) - done)
            finish = "stop" if done + k == target_length(p[0]) else "length"
            out.append(PromptRollout(p, [Completion([7] * k, [-1.0] * k, finish, "")], self.version))
        return out

    def generate(self, prompts, sampling, seeds=None):  # the sync probe's calls
        return [PromptRollout(p, [Completion([7], [-1.0], "stop", "x")] * sampling.n, self.version) for p in prompts]

    def load_adapter(self, adapter):
        self.version, self.loads = adapter.version, self.loads + 1
        return {"seconds": 0.0}

    def state_dict(self):
        return {}

    def load_state(self, state):
        pass


def decode(ids):
    return ["x" * len(t) for t in ids]


class DecodingTokenizer(NumberTokenizer):
    def batch_decode(self, ids, skip_special_tokens=True):
        return decode(ids)


def make_stream(actor, published=(0,), *, bound=1, capacity=3, draws=None, n=2, segment=2):
    runtime = Runtime(LocalGroup([actor]), LocalGroup([FakeLearner()]), continuous_config().cluster)
    runtime.versions.published = list(published)
    queue = list(draws if draws is not None else range(10))

    def draw():
        return NewGroup([queue.pop(0)], {"answer": ""}, seed=len(queue)) if queue else None

    sampling = Sampling(n=n, max_tokens=10)
    return runtime, Stream(
        runtime.pool, runtime.versions, sampling, segment_tokens=segment, groups_in_flight=capacity, bound=bound,
        episodes=False, draw=draw, decode=decode,
    )  # fmt: skip


def continuous_config(*overrides: str):
    return specs.from_overrides("/fake/model", "model.max_prompt_tokens=9", *FAKE, *CONTINUOUS, *overrides)


def test_groups_are_taken_in_the_order_they_finish_and_samples_come_in_segments():
    actor = SegmentActor()
    _, stream = make_stream(actor, draws=[0, 1, 2, 3])
    first = stream.take(2)
    # prompt 0 (9 tokens, 5 segments of 2) was drawn first and finishes after the short prompts 1 and 2
    assert [g.new.prompt[0] for g in first] == [1, 2]
    rest = stream.take(2)
    assert sorted(g.new.prompt[0] for g in rest) == [0, 3]
    long = next(g for g in rest if g.new.prompt[0] == 0)
    assert [done for p, done in actor.segments if p == 0] == [0, 0, 2, 2, 4, 4, 6, 6, 8, 8]  # 2 samples x 5
    r = stream.rollout(long)
    assert [len(c.token_ids) for c in r.completions] == [9, 9] and [c.text for c in r.completions] == ["x" * 9] * 2
    assert all(c.finish_reason == "stop" and c.versions == [0] * 9 for c in r.completions)
    # continued: prompt 0's 2 samples 4 times each, prompt 2's (3 tokens) once each; prompts 1 and 3 fit one segment
    assert stream.pop_counts()["async/segments_continued"] == 10


def test_an_adapter_load_between_segments_gives_one_sample_tokens_of_two_versions():
    actor = SegmentActor()
    runtime, stream = make_stream(actor, draws=[0, 1, 2], capacity=3)
    stream.take(1)  # prompt 1 done; prompt 0 has 2 of 9 tokens (the calls run as they are sent, without Ray)
    runtime.versions.published.append(1)  # a sync: the actor loads version 1 before its next call
    actor.load_adapter(Adapter(1, {}, b""))
    groups = stream.take(2)
    long = stream.rollout(next(g for g in groups if g.new.prompt[0] == 0))
    versions = long.completions[0].versions
    assert versions[0] == 0 and versions[-1] == 1 and len(versions) == 9  # continued across the update
    assert long.adapter_version == 0  # a rollout's version is its oldest token's


def test_a_sample_older_than_the_bound_is_dropped_and_counted():
    actor = SegmentActor()
    runtime, stream = make_stream(actor, draws=[0, 1, 2, 4], capacity=2, bound=1)
    stream.take(1)  # prompt 1; prompt 0 is 2 tokens in, at version 0
    for v in (1, 2):  # two syncs: version 0 is now 2 syncs old, past the bound of 1
        runtime.versions.published.append(v)
        actor.load_adapter(Adapter(v, {}, b""))
    taken = stream.take(2)
    assert 0 not in [g.new.prompt[0] for g in taken]
    assert [g.new.prompt[0] for g in stream.pop_dropped()] == [0]
    assert stream.pop_counts()["async/dropped_stale_groups"] == 1
    assert all(stream.lag(g) <= 1 for g in taken)


def test_a_dead_actors_segment_goes_to_a_live_one_and_no_sample_is_lost(capsys):
    actor = SegmentActor(die_on=(2,))
    runtime, stream = make_stream(actor, draws=[0, 1, 2], capacity=3)
    runtime.pool.max_restarts = 1
    taken = stream.take(3)
    assert sorted(g.new.prompt[0] for g in taken) == [0, 1, 2]
    assert all(
        len(c.token_ids) == target_length(r.prompt_ids[0]) for r in map(stream.rollout, taken) for c in r.completions
    )
    assert runtime.pool.restarts == 1 and "died during continue_samples" in capsys.readouterr().out


class EpisodeActor(SegmentActor):
    """A multi-turn env's actor: whole episodes per call (model tokens 1, env tokens 0 in the mask)."""

    def generate(self, prompts, sampling, seeds=None, items=None):
        assert items is not None and len(items) == len(prompts)
        self.calls += 1
        ep = Completion([7, 8, 7], [-1.0, 0.0, -1.0], "stop", "x", mask=[1, 0, 1])
        return [PromptRollout(p, [ep] * sampling.n, self.version) for p in prompts]


def test_multi_turn_episodes_run_whole_in_one_call_with_the_calls_version():
    actor = EpisodeActor()
    runtime = Runtime(LocalGroup([actor]), LocalGroup([FakeLearner()]), continuous_config().cluster)
    queue = [0, 1, 2]

    def draw():
        return NewGroup([queue.pop(0)], {"answer": "", "k": len(queue)}, seed=len(queue)) if queue else None

    stream = Stream(
        runtime.pool, runtime.versions, Sampling(n=2, max_tokens=10), segment_tokens=1, groups_in_flight=3, bound=1,
        episodes=True, draw=draw, decode=decode,
    )  # fmt: skip
    rollouts = [stream.rollout(g) for g in stream.take(3)]
    assert actor.segments == []  # no segment calls: the episodes ran whole
    assert [c.mask for r in rollouts for c in r.completions] == [[1, 0, 1]] * 6
    assert all(c.versions == [0, 0, 0] for r in rollouts for c in r.completions)


def run_continuous(tmp_path, actor, learner, *, steps, save_interval=0, resume=None, extra=(), n_prompts=5):
    dotted = dict(x.split("=", 1) for x in (*FAKE, *CONTINUOUS, "cluster.segment_tokens=2", *extra))
    cfg = typed_config(
        **dotted,
        **{"run.steps": steps, "eval.size": 0, "checkpoint.interval": save_interval, "run.output_dir": str(tmp_path)},
        **{"run.resume": resume or "null", "run.probe_floor_limit": 0.3, "run.sync_probe_threshold": 0.1},
        **{"model.max_new_tokens": 10, "model.max_prompt_tokens": 9},
    )
    cfg = specs.resolve(cfg, tmp_path, model_path="/fake/model")
    runtime = Runtime(LocalGroup([actor]), LocalGroup([learner]), cfg.cluster)
    logger = MetricsLogger(tmp_path, kind="none", total_steps=steps)
    try:
        train(cfg, runtime, DecodingTokenizer(), Env(n_prompts), length_reward, logger, resolved={})
    finally:
        logger.close()
    return metric_rows(tmp_path, timings=True)


def test_the_loop_trains_groups_as_they_finish_within_the_bound(tmp_path):
    learner = FakeLearner()
    rows = run_continuous(tmp_path, SegmentActor(), learner, steps=6, extra=("cluster.staleness=2",))
    assert [len(step) for step in learner.trained] == [2] * 6
    assert all(r["async/staleness_max"] <= 2 for r in rows)
    assert all(sum(r[f"async/lag_{k}"] for k in range(3)) == 4 for r in rows)  # 2 prompts x 2 samples a step
    assert sum(r["async/partial_rollouts"] for r in rows) > 0  # some samples spanned an adapter update
    assert sum(r["async/segments_continued"] for r in rows) > 0
    assert all(r["perf/samples_per_s"] > 0 and "perf/actor_tokens_per_s" in r for r in rows)


def test_prompts_trained_out_of_order_are_neither_repeated_nor_skipped_after_a_resume(tmp_path):
    # 40 prompts: within these steps no prompt is drawn twice, so a prompt id names its draw
    loose = ("cluster.staleness=4",)  # nothing is dropped as stale
    first = FakeLearner(die_at=5)
    with pytest.raises(RunStopped, match=r"last checkpoint: .*step_0004"):
        run_continuous(tmp_path, SegmentActor(), first, steps=6, save_interval=2, extra=loose, n_prompts=40)
    ckpt = tmp_path / "checkpoints" / "step_0004"
    saved = pickle.loads((ckpt / "trainer.pkl").read_bytes())["data"]
    draws = prompt_data(Env(40).train_items(), NumberTokenizer(), continuous_config()).next_batch(20)
    before = [p for step in first.trained[:4] for p in step]
    oldest = saved["cursor"]  # the oldest draw still in flight at the checkpoint: a long prompt
    assert target_length(draws[oldest]) == 9 and saved["skip"]  # and draws after it were trained already
    assert sorted(before) == sorted(draws[:oldest] + [draws[k] for k in saved["skip"]])
    again = FakeLearner()
    run_continuous(tmp_path, SegmentActor(), again, steps=6, resume=str(ckpt), extra=loose, n_prompts=40)
    trained = before + [p for step in again.trained for p in step]
    assert len(trained) == len(set(trained)) == 12  # none twice
    assert trained != [p for p in draws if p in trained]  # taken as they finished, not in draw order
    last = max(draws.index(p) for p in trained)
    untrained = [p for p in draws[:last] if p not in trained]
    assert len(untrained) <= 4  # none skipped: what is not trained was still in flight (cluster.groups_in_flight)


def test_a_checkpoint_taken_before_a_resume_passed_its_skipped_draws_keeps_them():
    """Resumed with draws 5 and 7 to skip and checkpointed again before drawing that far: the new checkpoint still
    names them, so a second resume does not train them twice."""
    cfg = continuous_config()
    data = prompt_data(Env(40).train_items(), NumberTokenizer(), cfg)
    runtime = Runtime(LocalGroup([SegmentActor()]), LocalGroup([FakeLearner()]), cfg.cluster)
    sampler = make_sampler(cfg, runtime, data, length_reward, steps=6, tokenizer=DecodingTokenizer())
    state = sampler.state_dict() | {"cursor": 4, "skip": [5, 7]}
    sampler.load_state(state)
    assert sampler.state_dict()["skip"] == [5, 7]


def test_continuous_keys_are_checked():
    with pytest.raises(ConfigError, match="cluster.staleness >= 1"):
        continuous_config("cluster.staleness=0")
    with pytest.raises(ConfigError, match="algorithm.tis_cap"):
        continuous_config("algorithm.tis_cap=0")
    with pytest.raises(ConfigError, match="run.deterministic=false or cluster.rollout_mode=batch"):
        continuous_config("run.deterministic=true")
    with pytest.raises(ConfigError, match="cluster.mode=ray"):
        continuous_config("cluster.mode=local")
    with pytest.raises(ConfigError, match="cluster.colocate=false"):
        continuous_config("cluster.colocate=true", "cluster.use_gpu=true")
    with pytest.raises(ConfigError, match="cluster.groups_in_flight=1 is below run.prompts_per_step=2"):
        continuous_config("cluster.groups_in_flight=1")
    assert (
        continuous_config().groups_in_flight == 4
        and continuous_config("cluster.groups_in_flight=3").groups_in_flight == 3
    )
    assert ContinuousSampler.overlapped
