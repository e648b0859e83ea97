"""Evaluation metrics (pass@k, per-set accuracy), the atomic jsonl writer, the eval config checks, the console ETA."""

from __future__ import annotations

import itertools
import json
import re
from math import comb

import pytest
from omegaconf import OmegaConf

from rl.config.schema import ConfigError, TrainConfig
from rl.loop.evaluation import atomic_jsonl, eval_metrics, pass_at_k, write_row
from rl.metrics import MetricsLogger, progress_text


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),  # pass@1 = c / n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (10, 0, 5, 0.0),  # nothing correct
        (3, 3, 2, 1.0),  # everything correct
        (8, 4, 5, 1.0),  # n - c < k: every 5 of 8 holds a correct one
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_brute_force_enumeration_of_k_subsets(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert len(subsets) == comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    # the binomials here exceed a float (C(2000, 1000) ~ 1e600); the product form does not form them
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-9)
    assert 0.0 < pass_at_k(2000, 3, 10) < 1.0


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)


def test_eval_metrics_overall_and_per_set_with_a_threshold():
    greedy = [1.0, 0.5, 1.0, 0.0]  # 0.5 is a fractional (shaped) reward: not correct at threshold 1.0
    sampled = [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.9, 1.0, 0.0]]
    sets = ["a", "a", "b", "b"]
    m = eval_metrics(greedy, sampled, sets, threshold=1.0, ks=[2])
    assert m["eval/accuracy"] == 0.5 and m["eval/reward_mean"] == pytest.approx(0.625)
    assert m["eval/a/accuracy"] == 0.5 and m["eval/b/accuracy"] == 0.5
    # pass@1: mean correctness over samples per prompt (1/3, 1, 0, 1/3), then over prompts
    assert m["eval/pass@1"] == pytest.approx((1 / 3 + 1 + 0 + 1 / 3) / 4)
    # pass@2 with n=3: c=1 -> 1 - C(2,2)/C(3,2) = 2/3; c=3 -> 1; c=0 -> 0
    assert m["eval/pass@2"] == pytest.approx((2 / 3 + 1 + 0 + 2 / 3) / 4)
    assert m["eval/a/pass@2"] == pytest.approx((2 / 3 + 1) / 2)
    assert m["eval/b/pass@1"] == pytest.approx(1 / 6)
    # a lower threshold counts 0.5 and 0.9 as correct
    low = eval_metrics(greedy, sampled, sets, threshold=0.5, ks=[1])
    assert low["eval/accuracy"] == 0.75 and low["eval/b/pass@1"] == pytest.approx((0 + 2 / 3) / 2)


def test_eval_metrics_greedy_only_has_no_pass_at_k():
    m = eval_metrics([1.0, 0.0], None, [None, None], threshold=1.0, ks=[1])
    assert m == {"eval/accuracy": 0.5, "eval/reward_mean": 0.5}


def test_atomic_jsonl_renames_only_when_complete(tmp_path):
    path = tmp_path / "eval" / "step_0001.jsonl"
    with pytest.raises(RuntimeError):
        with atomic_jsonl(path) as f:
            write_row(f, {"a": 1})
            raise RuntimeError("killed mid-write")
    assert not path.exists()
    assert (tmp_path / "eval" / ".step_0001.jsonl.tmp").read_text() == '{"a": 1}\n'  # line-buffered: on disk
    with atomic_jsonl(path) as f:
        write_row(f, {"answer": {1, 2}, "x": 0.5})  # non-JSON values are written as strings
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"answer": "{1, 2}", "x": 0.5}]
    assert not (tmp_path / "eval" / ".step_0001.jsonl.tmp").exists()


def typed(*dotlist: str) -> TrainConfig:
    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(list(dotlist)))
    return OmegaConf.to_object(merged)


def test_pass_k_above_n_samples_is_a_config_error_naming_the_keys():
    with pytest.raises(ConfigError, match=r"eval.pass_k=\[1, 8\] needs 1 <= k <= eval.n_samples=4 .*eval.n_samples>=8"):
        typed("eval.n_samples=4", "eval.pass_k=[1,8]")
    with pytest.raises(ConfigError, match=r"needs 1 <= k <= eval.n_samples=0"):
        typed("eval.pass_k=[4]")  # pass@4 asked for, but no samples
    with pytest.raises(ConfigError, match=r"eval.pass_k=\[0\]"):
        typed("eval.n_samples=4", "eval.pass_k=[0]")
    assert typed("eval.n_samples=8", "eval.pass_k=[1,8]").eval.pass_k == [1, 8]
    assert typed("eval.n_samples=0").eval.pass_k == [1]  # the default: greedy only, pass@1 not reported
    with pytest.raises(ConfigError, match="eval.temperature must be > 0"):
        typed("eval.n_samples=2", "eval.temperature=0.0")
    with pytest.raises(ConfigError, match="logger.rollouts_interval must be >= 0"):
        typed("logger.rollouts_interval=-1")


@pytest.mark.parametrize(
    ("step", "total", "elapsed", "initial", "expected"),
    [
        (12, 24, 330.0, 0, "12/24 [05:30<05:30]"),  # 27.5 s per step, 12 left
        (12, 24, 330.0, 6, "12/24 [05:30<11:00]"),  # resumed at 6: 6 steps in 330 s, 55 s each
        (24, 24, 4000.0, 0, "24/24 [1:06:40<00:00]"),  # hours once past an hour
        (1, 3, 0.0, 0, "1/3 [00:00<?]"),  # no time measured yet: the ETA is unknown
    ],
)
def test_progress_text_shows_steps_elapsed_and_eta(step, total, elapsed, initial, expected):
    assert progress_text(step, total, elapsed, initial) == expected


def test_console_line_starts_with_progress_after_a_resume(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, kind="none", total_steps=4)
    logger.console(0, {"eval/accuracy": 0.25, "eval/pass@1": 0.5})  # the evaluation before training: no ETA
    logger.start_progress(2)  # resumed after step 2
    logger.console(3, {"reward/mean": 0.5})
    logger.close()
    before, step3 = capsys.readouterr().out.splitlines()
    assert before == "step 0/4 | eval_acc 0.250 | eval_pass@1 0.500"
    assert re.fullmatch(r"step 3/4 \[00:00<00:0\d\] \| reward 0\.500", step3), step3


class CountingReward:
    """A reward that counts what it scored as errors, as rewards/runner.py counts failed samples."""

    def __init__(self):
        self.errors = 0

    def __call__(self, texts, *, answer, **_):
        self.errors += len(texts)
        return [1.0 if t == a else 0.0 for t, a in zip(texts, answer)]

    def pop_metrics(self):
        out, self.errors = {"reward/errors": float(self.errors)}, 0
        return out


class EchoRuntime:
    """Generates each prompt's answer (greedy) or "x" (sampled), as the runtime's generate returns them."""

    def __init__(self, answers):
        self.answers = answers

    def generate(self, prompt_ids, sampling, *, items=None, seeds=None):
        from rl.types import Completion, PromptRollout

        def one(i):
            text = self.answers[i] if sampling.temperature == 0 else "x"
            return Completion(token_ids=[1], logprobs=[0.0], finish_reason="stop", text=text)

        return [PromptRollout(p, [one(i) for _ in range(sampling.n)], 0) for i, p in enumerate(prompt_ids)]


def test_evaluation_keeps_its_reward_counters_out_of_the_next_training_step(tmp_path):
    from rl.loop.driver import prompt_data
    from rl.loop.evaluation import evaluate
    from rl.resolve import from_overrides
    from tests.fakes import NumberTokenizer

    keys = ("eval.size=3", "eval.n_samples=2", "model.max_prompt_tokens=8", "model.use_chat_template=false")
    cfg = from_overrides("/m", *keys, run_dir=tmp_path)
    items = [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": str(i)} for i in range(3)]
    data = prompt_data(items, NumberTokenizer(), cfg)
    reward = CountingReward()
    samplings = dict(greedy=cfg.sampling_for("greedy"), sampled=cfg.sampling_for("eval"), seed=cfg.run.seed)
    m = evaluate(EchoRuntime(["0", "1", "2"]), data, reward, cfg.eval, 0, **samplings)
    assert m["eval/accuracy"] == 1.0 and m["eval/pass@1"] == 0.0
    assert m["eval/reward_errors"] == 3 + 3 * 2  # greedy and sampled completions, reported with the evaluation
    assert reward.pop_metrics() == {"reward/errors": 0.0}  # nothing left for the sampler's next step
    assert len((tmp_path / "eval" / "step_0000.jsonl").read_text().splitlines()) == 3 + 3 * 2  # <eval.save_dir>


def test_an_episodes_rollout_rows_become_a_wandb_table_with_its_spans_as_json(tmp_path):
    """logger.rollouts_interval with logger=wandb (offline, a real wandb run): the rows of the dump become the
    Table `rollouts`, a field only some rows have left empty, an episode's spans (tool calls, results) as JSON."""
    import json

    rows = [
        {"step": 1, "prompt": "p", "completion": "c", "reward": 1.0, "adapter_version": 0},
        {"step": 1, "prompt": "p", "completion": "d", "reward": 0.0, "adapter_version": 0, "spans": [{"by": "env"}]},
    ]
    logger = MetricsLogger(tmp_path, kind="wandb", wandb_mode="offline", project="rlft-test")
    logger.log_table(1, "rollouts", rows)
    logger.log_table(2, "rollouts", [])  # a step with nothing dumped logs nothing
    logger.close()
    (table,) = tmp_path.glob("wandb/offline-run-*/files/media/table/rollouts_*.table.json")
    saved = json.loads(table.read_text())
    assert saved["columns"] == ["step", "prompt", "completion", "reward", "adapter_version", "spans"]
    assert saved["data"] == [[1, "p", "c", 1.0, 0, None], [1, "p", "d", 0.0, 0, '[{"by": "env"}]']]


def test_the_last_console_line_counts_the_prompts_evaluated_not_eval_size():
    from rl.app import accuracy_line

    summary = {"eval/accuracy_before": 0.25, "eval/accuracy_after": 0.5, "time/total_s": 12.0}
    assert (
        accuracy_line(summary, 6)
        == "held-out accuracy (greedy, 6 prompts): before 0.250 -> after 0.500 (+0.250); total 12 s"
    )
    assert accuracy_line({"time/total_s": 1.0}, 6) is None
