"""Curricula (rl/data/curriculum.py) driven through the real Sampler with fake roles: pass-rate tracking, skipping solved
and hopeless prompts (and revisiting them), a reasoning-gym task's difficulty raised through reasoning-gym's own
curriculum, the metrics, and the state a checkpoint saves and a resume restores (with batches in flight too)."""

from __future__ import annotations

import pickle

import pytest

from envs.reasoning_gym import ReasoningGymEnv
from rl.config.schema import ConfigError, CurriculumConfig, TrainConfig
from rl.data.curriculum import DifficultyCurriculum, PassRateCurriculum, build_curriculum, histogram, pass_rates
from rl.loop import checkpoint
from rl.loop.driver import make_sampler, prompt_data
from rl.resolve import from_overrides
from rl.runtime.groups import LocalGroup
from rl.runtime.runtime import Runtime
from tests.fakes import FakeActor, FakeLearner, NumberTokenizer

G = 2  # FakeActor's k-th sample is "x" * k: with KindReward, a "mixed" prompt gets one right of two


def config(*overrides: str, n: int = 2, staleness: int = 0, max_prompt_tokens: int = 9) -> TrainConfig:
    """A resolved config of n prompts of G samples per step, prompts without a chat template, data order seed 3."""
    return from_overrides(
        "/m",
        f"run.prompts_per_step={n}",
        f"algorithm.group_size={G}",
        f"cluster.staleness={staleness}",
        f"model.max_prompt_tokens={max_prompt_tokens}",
        "model.use_chat_template=false",
        "run.seed=3",
        *overrides,
    )


def fake_runtime(cfg: TrainConfig) -> Runtime:
    return Runtime(LocalGroup([FakeActor()]), LocalGroup([FakeLearner()]), cfg.cluster)


def kinds_env(kinds: str) -> list[dict]:
    """Prompt i is "q<i>" with answer s(olved), h(opeless) or m(ixed)."""
    return [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": k} for i, k in enumerate(kinds)]


def kind_reward(texts, *, answer, **_):
    return [1.0 if a == "s" else 0.0 if a == "h" else float(len(t) % 2) for t, a in zip(texts, answer)]


def sampler_for(kinds, curriculum, *, staleness=0, steps=20, n=2, reward=kind_reward):
    cfg = config(n=n, staleness=staleness)
    data = prompt_data(kinds_env(kinds), NumberTokenizer(), cfg)
    return make_sampler(cfg, fake_runtime(cfg), data, reward, steps=steps, curriculum=curriculum)


def pass_rate(*overrides: str) -> PassRateCurriculum:
    cfg = config("curriculum.kind=pass_rate", *overrides)
    return PassRateCurriculum(cfg.curriculum, seed=cfg.run.seed)


def prompts(batch) -> list[int]:
    return [r.prompt_ids[0] for r in batch.rollouts]


def test_pass_rates_and_their_histogram():
    assert pass_rates([1, 1, 0, 1, 0, 0, 0.5, 1], 2, threshold=1.0) == [1.0, 0.5, 0.0, 0.5]
    assert histogram([0.0, 0.25, 0.5, 1.0, 1.0]) == {
        "curriculum/pass_rate_0": 0.2,
        "curriculum/pass_rate_lt_half": 0.2,
        "curriculum/pass_rate_ge_half": 0.2,
        "curriculum/pass_rate_1": 0.4,
    }


def test_pass_rate_is_a_moving_average_over_visits():
    c = pass_rate("curriculum.ema=0.5")
    c.observe(None, [3, 4], [1.0, 0.5])
    c.observe(None, [3], [0.0])
    assert c.rates == {3: 0.5, 4: 0.5}


def test_solved_and_hopeless_prompts_are_skipped_before_generating():
    kinds = "shmmhsmm"
    c = pass_rate("curriculum.revisit_prob=0.0")
    sampler = sampler_for(kinds, c, n=2)
    first = [prompts(sampler.next(s)) for s in range(1, 5)]  # one pass: every prompt visited once, none skipped
    assert sorted(sum(first, [])) == list(range(8))
    later = [sampler.next(s) for s in range(5, 11)]
    sent = sum((prompts(b) for b in later), [])
    assert {kinds[i] for i in sent} == {"m"}  # only the prompts with something to learn are generated
    assert sum(b.stats["curriculum/skipped"] for b in later) > 0
    stats = later[-1].stats
    assert stats["curriculum/tracked"] == 8.0
    assert (stats["curriculum/pass_rate_0"], stats["curriculum/pass_rate_1"]) == (0.25, 0.25)
    assert stats["curriculum/pass_rate_ge_half"] == 0.5  # the mixed ones: 1 of 2 right
    assert stats["data/generated_groups"] == 2.0 and stats["data/generated_tokens"] == 2 * (1 + 2)


def test_a_skipped_prompt_comes_back_with_the_revisit_probability():
    def sent_kinds(revisit: float) -> list[str]:
        sampler = sampler_for("shmm", pass_rate(f"curriculum.revisit_prob={revisit}"))
        return ["shmm"[i] for s in range(1, 41) for i in prompts(sampler.next(s))][4:]  # after the first pass

    assert set(sent_kinds(0.0)) == {"m"}
    assert sent_kinds(1.0).count("s") > 10  # never skipped
    some = sent_kinds(0.3)
    assert 0 < some.count("s") + some.count("h") < some.count("m")


def test_a_batch_is_sent_even_when_every_prompt_is_due_to_be_skipped():
    sampler = sampler_for("ssss", pass_rate("curriculum.revisit_prob=0.0"))
    for s in range(1, 6):
        assert len(prompts(sampler.next(s))) == 2


def char_tokenizer():
    class Chars:
        def __call__(self, text):
            return {"input_ids": [ord(ch) for ch in text]}

    return Chars()


def always_right(texts, **_):
    return [1.0] * len(texts)


def difficulty_sampler(*overrides: str, staleness=0, reward=always_right):
    """A sampler of 4 chain_sum prompts per step under curriculum=difficulty with these `curriculum.*` overrides."""
    env = ReasoningGymEnv(
        "chain_sum", size=40, eval_size=4, config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    )
    cfg = config("curriculum.kind=difficulty", *overrides, n=4, staleness=staleness, max_prompt_tokens=500)
    make = lambda items: prompt_data(items, char_tokenizer(), cfg)  # noqa: E731
    curriculum = build_curriculum(cfg.curriculum, env, make, seed=cfg.run.seed)
    sampler = make_sampler(cfg, fake_runtime(cfg), make(env.train_items()), reward, steps=30, curriculum=curriculum)
    return sampler, curriculum, env


RAISE_AT_75 = ("curriculum.raise_at=0.75", "curriculum.window=4")


def levels(sampler) -> list[int]:
    return [it["metadata"]["curriculum_level"] for it in sampler.data.items]


def test_difficulty_rises_through_reasoning_gyms_curriculum_when_accuracy_passes_the_threshold():
    sampler, curriculum, env = difficulty_sampler(*RAISE_AT_75)
    assert isinstance(curriculum, DifficultyCurriculum) and set(levels(sampler)) == {0}
    assert sampler.data.items[0]["question"] == env.train_items()[0]["question"]  # level 0: the env's own config
    b1 = sampler.next(1)  # 4 groups all right: the window is full at accuracy 1 -> a raise is due
    assert b1.stats["curriculum/raises"] == 1.0 and b1.stats["curriculum/level"] == 0.0
    b2 = sampler.next(2)  # drawn one level up: reasoning-gym's chain_sum level 1 (2-3 terms of 1-2 digits)
    assert b2.stats["curriculum/level"] == 1.0 and set(levels(sampler)) == {1}
    assert curriculum.task.task_config()["max_terms"] == 3 and curriculum.task.task_config()["max_digits"] == 2
    held_out = {it["question"] for it in env.eval_items()}
    assert not held_out & {it["question"] for it in sampler.data.items}
    assert any(it["question"].count("+") + it["question"].count("-") >= 2 for it in sampler.data.items)


def test_difficulty_stays_below_the_threshold_and_at_max_level():
    half_right = lambda texts, **_: [float(i % 2) for i in range(len(texts))]  # noqa: E731
    sampler, _, _ = difficulty_sampler(*RAISE_AT_75, reward=half_right)
    assert [sampler.next(s).stats["curriculum/level"] for s in range(1, 5)] == [0.0] * 4
    sampler, _, _ = difficulty_sampler("curriculum.raise_at=0.5", "curriculum.window=4", "curriculum.max_level=1")
    assert [sampler.next(s).stats["curriculum/level"] for s in range(1, 6)] == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_difficulty_needs_a_reasoning_gym_env():
    with pytest.raises(ConfigError, match="curriculum=difficulty needs a reasoning-gym env"):
        build_curriculum(config("curriculum.kind=difficulty").curriculum, object(), lambda items: None, seed=0)


@pytest.mark.parametrize("staleness", [0, 1])
def test_pass_rate_state_round_trips_through_a_checkpoint(tmp_path, staleness):
    a = sampler_for("shmmhsmm", pass_rate("curriculum.revisit_prob=0.3"), staleness=staleness)
    for s in range(1, 7):
        a.next(s)
    runtime = fake_runtime(config())
    path = checkpoint.save_run(tmp_path, 6, runtime, a)
    b = sampler_for("shmmhsmm", pass_rate("curriculum.revisit_prob=0.3"), staleness=staleness)
    checkpoint.restore_run(path, runtime, b)
    assert b.curriculum.rates == a.curriculum.rates
    if staleness == 0:  # nothing in flight: the resumed choices are the uninterrupted run's
        assert [prompts(b.next(s)) for s in range(7, 13)] == [prompts(a.next(s)) for s in range(7, 13)]
    else:  # the batch in flight is chosen again from the same data position
        assert b.data.cursor < a.data.cursor and b.curriculum.chooser_state() != a.curriculum.chooser_state()


def test_difficulty_state_round_trips_through_a_checkpoint(tmp_path):
    a, _, _ = difficulty_sampler(*RAISE_AT_75)
    for s in range(1, 4):
        a.next(s)
    state = pickle.loads(pickle.dumps(a.state_dict()))
    assert state["curriculum"]["level"] == 2 and state["cursor"] == a.data.cursor
    b, cb, _ = difficulty_sampler(*RAISE_AT_75)
    b.load_state(state)
    assert cb.level == 2 and levels(b) == levels(a) and b.data.cursor == a.data.cursor
    assert [prompts(b.next(s)) for s in (4, 5)] == [prompts(a.next(s)) for s in (4, 5)]


def test_a_checkpoint_of_another_curriculum_is_refused():
    a = sampler_for("smsm", pass_rate())
    a.next(1)
    b = sampler_for("smsm", None)
    with pytest.raises(ConfigError, match="taken with curriculum=pass_rate, this run has curriculum=none"):
        b.load_state(a.state_dict())


def test_curriculum_keys_are_checked_and_reach_the_resolved_config():
    with pytest.raises(ConfigError, match="curriculum.hopeless=0.5 and curriculum.solved=0.5"):
        CurriculumConfig(hopeless=0.5, solved=0.5)
    with pytest.raises(ConfigError, match="curriculum.window"):
        CurriculumConfig(window=0)
    cfg = from_overrides("/m", "eval.correct_threshold=0.5", "curriculum.kind=pass_rate", "curriculum.revisit_prob=0.2")
    c = cfg.curriculum
    assert (c.kind.value, c.revisit_prob, cfg.eval.correct_threshold, c.window) == ("pass_rate", 0.2, 0.5, 32)
    assert isinstance(
        build_curriculum(cfg.curriculum, object(), lambda items: None, seed=cfg.run.seed), PassRateCurriculum
    )


@pytest.mark.parametrize("staleness", [0, 1])
def test_pass_rate_composes_with_dynamic_sampling_and_staleness(staleness):
    """Every round's groups are observed (the filtered ones too, so they are skipped next time); dynamic sampling
    still drops what it drops; batches sent ahead are chosen with the rates known when they were sent."""
    dynamic = ("algorithm.dynamic_sampling=true", "algorithm.filter_range=[0.01,0.99]")
    cfg = config(*dynamic, "algorithm.dynamic_sampling_max_rounds=4", staleness=staleness)
    data = prompt_data(kinds_env("smhm" * 2), NumberTokenizer(), cfg)
    curriculum = PassRateCurriculum(
        config("curriculum.kind=pass_rate", "curriculum.revisit_prob=0.0").curriculum, seed=3
    )
    sampler = make_sampler(cfg, fake_runtime(cfg), data, kind_reward, steps=30, curriculum=curriculum)
    batches = [sampler.next(s) for s in range(1, 13)]
    assert all(("smhm" * 2)[r.prompt_ids[0]] == "m" for b in batches for r in b.rollouts)  # only mixed kept
    assert set(curriculum.rates) == set(range(8))  # solved and hopeless groups were observed, then filtered
    late = batches[-4:]
    assert all(b.stats["data/generated_groups"] == 2.0 for b in late)  # nothing left for the filter to drop
    assert sum(b.stats["curriculum/skipped"] for b in late) > 0
