"""Bounded staleness and fault handling with fake roles (no Ray, no model): the versions an actor may use, a dead
actor's prompts going to a live one, batches sent ahead, and the driver loop's stops (NaN/inf loss, dead learner)."""

from __future__ import annotations

import pytest

from rl.config.schema import ConfigError, TrainConfig
from rl.errors import RunStopped
from rl.loop.driver import make_sampler, prompt_data
from rl.runtime.groups import LocalGroup
from rl.runtime.runtime import Runtime
from rl.runtime.sync import VersionMismatch
from rl.types import Completion, PromptRollout, Sampling
from tests.fakes import (
    Env,
    FakeActor,
    FakeLearner,
    NumberTokenizer,
    fake_config,
    fake_runtime,
    length_reward,
    run_loop,
)
from tests.helpers import metric_rows


def expected_batches(steps: int) -> list[list[int]]:
    """The prompt indices the data order serves, step by step (same seed as run_loop)."""
    data = prompt_data(Env(5).train_items(), NumberTokenizer(), fake_config())
    return [data.next_batch(2) for _ in range(steps)]


# ------------------------------------------------------------------------------------------------ versions


def test_staleness_bounds_the_versions_an_actor_may_use():
    actor = FakeActor()
    runtime = fake_runtime([actor], FakeLearner(), staleness=1)
    runtime.version, runtime.version = 1, 2  # two syncs published
    actor.version = 1  # one sync behind: allowed with staleness 1
    assert [r.adapter_version for r in runtime.generate([[5]], Sampling(n=1))] == [1]
    actor.version = 3  # never published
    with pytest.raises(VersionMismatch, match=r"actor 0 generated with adapter version 3, expected one of \[1, 2\]"):
        runtime.generate([[5]], Sampling(n=1))


def test_a_sample_older_than_the_bound_is_dropped_counted_and_generated_again(capsys):
    class CatchesUp(FakeActor):  # answers once with an old adapter, then has the current one
        def generate(self, prompts, sampling, seeds=None):
            out = super().generate(prompts, sampling, seeds)
            self.version = 2
            return out

    actor = CatchesUp()
    runtime = fake_runtime([actor], FakeLearner(), staleness=1)
    runtime.version, runtime.version = 1, 2
    rollouts = runtime.generate([[5], [6]], Sampling(n=3))
    assert [(r.prompt_ids, r.adapter_version) for r in rollouts] == [([5], 2), ([6], 2)]
    assert runtime.pop_counts() == {"fault/actor_restarts": 0.0, "async/dropped_stale": 6.0}
    assert "older than the staleness bound" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ faults


def test_dead_actor_prompts_go_to_a_live_actor_and_it_gets_the_adapter_again(capsys):
    actors = [FakeActor(0, die_on=(2,)), FakeActor(1)]
    runtime = fake_runtime(actors, FakeLearner(), restarts=2)
    runtime.generate([[1], [2]], Sampling(n=1))
    runtime.learners.members[0].version = 4
    runtime.sync()
    rollouts = runtime.generate([[1], [2], [3], [4]], Sampling(n=2))
    assert [r.prompt_ids[0] for r in rollouts] == [1, 2, 3, 4]  # every prompt, in order
    assert [r.actor for r in rollouts] == [1, 1, 1, 1] and {r.adapter_version for r in rollouts} == {4}
    assert actors[0].version == 4  # the restarted actor was sent the current adapter again
    assert runtime.pop_counts()["fault/actor_restarts"] == 1.0
    out = capsys.readouterr().out
    assert "rollout actor 0 died during generate (ActorDiedError: SIGKILL): Ray restarts it (restart 1 of 2)" in out
    assert "its 2 prompt(s) go to actor 1" in out
    assert "rollout actor 0 is back after its restart; adapter version 4 sent first" in out
    assert len(runtime.generate([[1], [2]], Sampling(n=1))) == 2 and actors[0].calls == 3  # back in service


def test_an_actor_past_its_restarts_is_left_out_and_the_last_one_dying_stops_the_run():
    actors = [FakeActor(0, die_on=(1,)), FakeActor(1, die_on=(3,))]
    runtime = fake_runtime(actors, FakeLearner(), restarts=0)
    assert len(runtime.generate([[1], [2]], Sampling(n=1))) == 2
    assert runtime.live_actors() == [1]
    with pytest.raises(RuntimeError, match="every rollout actor is dead"):
        runtime.generate([[1], [2]], Sampling(n=1))


# ------------------------------------------------------------------------------------------------ queue + loop


def test_sampler_sends_ahead_and_checkpoints_the_data_before_what_is_in_flight():
    data = prompt_data(Env(5).train_items(), NumberTokenizer(), fake_config())
    actor = FakeActor()
    runtime = fake_runtime([actor], FakeLearner(), staleness=1)
    sampler = make_sampler(fake_config("cluster.staleness=1"), runtime, data, length_reward, steps=2)
    assert sampler.overlapped and sampler.state_dict()["cursor"] == 0
    batch = sampler.next(1)
    assert data.cursor == 4 and len(actor.prompts) == 4  # its own batch and the next step's were sent
    assert [r.prompt_ids[0] for r in batch.rollouts] == expected_batches(1)[0]
    assert sampler.state_dict()["cursor"] == 2  # the next step's batch is in flight: not consumed
    assert "perf/rollout_tokens_per_s" not in batch.stats  # generated while the learners worked: no rate
    sampler.next(2)  # the last step: nothing more is sent
    assert data.cursor == 4


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_loop_trains_every_prompt_once_on_rollouts_at_most_k_syncs_old(tmp_path, staleness):
    learner = FakeLearner()
    rows = run_loop(tmp_path, fake_runtime([FakeActor()], learner, staleness=staleness), steps=5, staleness=staleness)
    assert learner.trained == expected_batches(5)
    assert [r["async/staleness_max"] for r in rows] == [min(s, staleness) for s in range(5)]
    # the sync probe is read every step; with staleness > 0 in the next step's row (step 1 has none)
    assert [r.get("sync/logprob_abs_diff") for r in rows] == [None if staleness else 0.0] + [0.0] * 4
    assert all(0.0 <= r["perf/actor_idle_frac"] <= 1.0 and 0.0 <= r["perf/learner_idle_frac"] <= 1.0 for r in rows)


def test_nonfinite_losses_are_skipped_and_logged_and_too_many_in_a_row_stop_the_run(tmp_path, capsys):
    learner = FakeLearner(losses=[float("nan"), 0.5, float("inf"), float("nan")])
    with pytest.raises(RunStopped) as stop:
        run_loop(tmp_path, fake_runtime([FakeActor()], learner), steps=6, max_nonfinite_steps=2)
    rows = metric_rows(tmp_path, timings=True)
    assert [r["train/skipped_nonfinite"] for r in rows] == [1.0, 0.0, 1.0, 1.0]  # step 2 reset the count
    out = capsys.readouterr().out
    assert "step 1: non-finite loss (nan), optimizer step skipped (1 in a row" in out
    assert "step 4: non-finite loss (nan), optimizer step skipped (2 in a row" in out
    msg = str(stop.value)
    assert "2 steps in a row had a non-finite loss" in msg and "stopped after step 4" in msg
    assert f"run.resume=auto run.output_dir={tmp_path}" in msg and "\n" not in msg


def test_a_dead_learner_stops_the_run_naming_the_checkpoint_and_how_to_resume(tmp_path):
    with pytest.raises(RunStopped, match=r"learner 0 died at step 2 \(ActorDiedError: out of memory\); no checkpoint"):
        run_loop(tmp_path, fake_runtime([FakeActor()], FakeLearner(die_at=2)), steps=3)


def test_learner_generation_takes_the_first_chunk_of_prompts_per_learner():
    actors, learner = [FakeActor(0), FakeActor(1)], FakeLearner()
    runtime = Runtime(LocalGroup(actors), LocalGroup([learner]), fake_config("cluster.learner_chunk_size=2").cluster)
    rollouts = runtime.generate([[1], [2], [3], [4], [5]], Sampling(n=1))
    assert [r.prompt_ids[0] for r in rollouts] == [1, 2, 3, 4, 5]
    assert [r.actor for r in rollouts] == [-1, -1, 0, 0, 1]  # learner 0 is -1
    assert learner.prompts == [[1], [2]] and actors[0].prompts == [[3], [4]] and actors[1].prompts == [[5]]
    learner.version = 7  # a learner that generates with a version never published is a sync bug
    with pytest.raises(VersionMismatch, match=r"learner 0 generated with adapter version 7, expected one of \[0\]"):
        runtime.generate([[1]], Sampling(n=1))


def test_prompts_in_flight_at_a_checkpoint_are_generated_again_on_resume(tmp_path):
    first = FakeLearner(die_at=4)  # the run stops in step 4; step 3 (and 4, staleness 2) were in flight at step 2
    with pytest.raises(RunStopped, match=r"last checkpoint: .*step_0002"):
        run_loop(tmp_path, fake_runtime([FakeActor()], first, staleness=2), steps=6, staleness=2, save_interval=2)
    again = FakeLearner()
    ckpt = str(tmp_path / "checkpoints" / "step_0002")
    run_loop(tmp_path, fake_runtime([FakeActor()], again, staleness=2), steps=6, staleness=2, resume=ckpt)
    # steps 1-2 before the checkpoint, then steps 3-6 from the data position before the batches in flight
    assert first.trained[:2] + again.trained == expected_batches(6)


def test_async_and_fault_keys_are_checked():
    from omegaconf import OmegaConf

    from rl.config.schema import ConfigError

    def typed(**overrides) -> TrainConfig:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), overrides))

    with pytest.raises(ConfigError, match="cluster.mode=local .* set cluster.staleness=0"):
        typed(cluster={"mode": "local", "staleness": 1})
    for key in ("staleness", "actor_max_restarts", "learner_chunk_size"):
        with pytest.raises(ConfigError, match=f"cluster.{key} must be >= 0"):
            typed(cluster={key: -1})
    with pytest.raises(ConfigError, match="run.max_nonfinite_steps must be >= 1"):
        typed(run={"max_nonfinite_steps": 0})
    assert typed(cluster={"staleness": 2}).cluster.staleness == 2


@pytest.mark.parametrize("staleness", [0, 1])
def test_dynamic_sampling_rounds_take_prompts_in_data_order(staleness):
    """An extra round takes the next batch of the queue (sent ahead, or sent now), so the prompts reach the learner
    in the order they were drawn and a checkpoint's data position never repeats or skips a trained prompt."""

    class FlatFirst(FakeActor):  # its first batch has all-equal rewards: filtered out by dynamic sampling
        def generate(self, prompts, sampling, seeds=None):
            out = super().generate(prompts, sampling, seeds)
            if self.calls == 1:
                out = [PromptRollout(r.prompt_ids, [Completion([7], [-1.0], "stop", "")] * 2, 0) for r in out]
            return out

    data = prompt_data(Env(5).train_items(), NumberTokenizer(), fake_config())
    runtime = fake_runtime([FlatFirst()], FakeLearner(), staleness=staleness)
    cfg = fake_config(
        f"cluster.staleness={staleness}",
        "algorithm.dynamic_sampling=true",
        "algorithm.filter_range=[0.01,0.99]",
        "algorithm.dynamic_sampling_max_rounds=2",
    )
    sampler = make_sampler(cfg, runtime, data, length_reward, steps=3)
    batch = sampler.next(1)
    assert [r.prompt_ids[0] for r in batch.rollouts] == expected_batches(2)[1]  # the second round's prompts
    assert batch.rewards == [0.0, 1.0, 0.0, 1.0] and batch.stats["data/sample_utilization"] == 0.5
    assert sampler.state_dict()["cursor"] == 4  # both rounds consumed, nothing in flight
    assert [r.prompt_ids[0] for r in sampler.next(2).rollouts] == expected_batches(3)[2]


class OffsetLearner(FakeLearner):
    """Its logprobs differ from the actors' by `floor` (a 4-bit learner against a bf16 actor) plus `drift` per
    adapter version (an actor that never receives the adapter falls further behind)."""

    def __init__(self, floor: float, drift: float):
        super().__init__()
        self.floor, self.drift = floor, drift

    def sequence_logprobs(self, prompt_ids, completion_ids, reference=False):
        return [[-1.0 - self.floor - self.drift * self.version] * len(c) for c in completion_ids]


def test_sync_probe_is_checked_against_its_floor_before_training(tmp_path, capsys):
    # a constant mismatch above the threshold (train()'s default 0.1 here) is the floor, not a sync failure
    rows = run_loop(tmp_path / "a", fake_runtime([FakeActor()], OffsetLearner(floor=0.25, drift=0.0)), steps=3)
    assert [r["sync/logprob_abs_diff"] for r in rows] == pytest.approx([0.25] * 3)
    assert "sync probe floor 0.2500: a step fails above 0.3500" in capsys.readouterr().out
    # a mismatch that grows with the adapter versions is caught once it exceeds floor + threshold
    with pytest.raises(RuntimeError, match=r"adapter sync check failed at step 1: .* = 0\.4000 > 0\.3500"):
        run_loop(tmp_path / "b", fake_runtime([FakeActor()], OffsetLearner(floor=0.25, drift=0.15)), steps=3)


def test_actors_on_another_base_than_the_learner_stop_the_run_at_start(tmp_path):
    """A floor above run.probe_floor_limit (a 4-bit learner beside full-precision actors: 0.5-1.1 nats per token)
    stops the run before any step, in one line naming the keys; with the limit off the run trains."""
    from rl.loop.probe import BaseMismatch

    with pytest.raises(BaseMismatch) as e:
        run_loop(tmp_path / "a", fake_runtime([FakeActor()], OffsetLearner(floor=0.64, drift=0.0)), steps=2)
    assert "= 0.6400 nats per token > run.probe_floor_limit=0.3" in str(e.value) and "model.actor_base" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "a" / "metrics.jsonl").read_text().strip()  # no step ran
    off = run_loop(
        tmp_path / "b", fake_runtime([FakeActor()], OffsetLearner(floor=0.64, drift=0.0)), steps=2, floor_limit=None
    )
    assert [r["step"] for r in off] == [1, 2]


def test_a_fresh_run_refuses_a_directory_that_holds_another_run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    with pytest.raises(
        ConfigError, match=r"already holds a run \(metrics.jsonl\): give run.resume=auto to continue it"
    ):
        run_loop(tmp_path, fake_runtime([FakeActor()], FakeLearner()), steps=2)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 0.5}\n'  # untouched


def test_resume_auto_without_a_checkpoint_starts_over_without_the_old_rows(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "reward/me')  # killed
    rows = run_loop(tmp_path, fake_runtime([FakeActor()], FakeLearner()), steps=2, resume="auto")
    assert [r["step"] for r in rows] == [1, 2] and "reward/me" not in rows[0]  # this run's rows only
    assert "starting at step 1 (2 rows of metrics.jsonl from before dropped)" in capsys.readouterr().out


def test_data_the_settings_leave_empty_or_a_curriculum_the_env_lacks_fails_before_any_role_starts(capsys):
    """rl/app.py loads the run's data before it starts Ray and the engines: prompts all longer than
    model.max_prompt_tokens, or curriculum=difficulty on an env without difficulty levels, is one line then."""
    from rl.config.errors import ConfigError
    from rl.loop.driver import load_data

    class LongPrompts:
        def __call__(self, text):
            return {"input_ids": [1] * 10}  # one more than fake_config's model.max_prompt_tokens

    with pytest.raises(ConfigError, match=r"all 5 are longer than model.max_prompt_tokens=9 .*raise model.max_prompt"):
        load_data(fake_config(), LongPrompts(), Env(5))
    with pytest.raises(ConfigError, match="curriculum=difficulty needs a reasoning-gym env"):
        load_data(fake_config("curriculum.kind=difficulty"), NumberTokenizer(), Env(5))
    data = load_data(fake_config(), NumberTokenizer(), Env(5))
    assert len(data.train) == 5 and data.demos is None and data.curriculum is not None
    # an env without eval items (env=jsonl without env.eval_sets) says so, rather than ending without an accuracy
    assert "no held-out evaluation: the env gives no eval prompts; a dataset env" in capsys.readouterr().out
    load_data(fake_config("eval.size=0"), NumberTokenizer(), Env(5))
    assert capsys.readouterr().out == ""


def test_a_tokenizer_without_a_chat_template_fails_in_one_line_naming_the_key():
    from rl.config.errors import ConfigError

    class NoTemplate(NumberTokenizer):
        chat_template = None

    with pytest.raises(ConfigError, match=r"has no chat template .*set model.use_chat_template=false"):
        prompt_data(Env(2).train_items(), NoTemplate(), fake_config("model.use_chat_template=true"))
    assert len(prompt_data(Env(2).train_items(), NoTemplate(), fake_config("model.use_chat_template=false"))) == 2
