"""Environments from other libraries on the real stack: a verifiers taskset (written here with verifiers' own classes)
and an OpenEnv environment, each trained 2 steps by train.py on Ray with a vLLM actor and a LoRA learner (the tiny
random model with SmolLM2's tokenizer and chat template), and each run on a real vLLM engine whose every call is
recorded: the learner's samples hold exactly the token ids and logprobs the engine sampled, and their loss masks
cover exactly those tokens (the env's messages are in the sequence, out of the loss)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, TINY_RUN, check_trained, metric_rows, run_train

vf = pytest.importorskip("verifiers.v1", reason="env=verifiers needs `make install-envs`")
pytest.importorskip("openenv.core", reason="env=openenv needs `make install-envs`")

from tests.fakes import GuessAction, GuessEnv  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.tier2]


class LengthData(vf.TaskData):
    answer: str


class LengthTask(vf.Task[LengthData]):
    """Right answers pay 1; a longer reply pays up to 1 more (the random model's replies differ in length, so the
    advantages are not zero)."""

    @vf.reward
    async def correct(self, trace) -> float:
        return float(self.data.answer in trace.last_reply)

    @vf.reward(weight=0.5)
    async def length(self, trace) -> float:
        return min(len(trace.last_reply) / 100, 1.0)


class LengthTaskset(vf.Taskset[LengthTask]):
    def load(self):
        for a in range(8):
            for b in range(4):
                yield LengthTask(LengthData(prompt=f"What is {a} + {b}?", answer=str(a + b)), self.config.task)


class LengthGuessEnv(GuessEnv):
    """GuessEnv whose steps also pay for longer guesses (the random model rarely guesses right; this makes its
    episodes' returns differ, so the advantages are not zero)."""

    def step(self, action: GuessAction, timeout_s=None, **kwargs):
        obs = super().step(action)
        obs.reward += min(len(action.guess) / 100, 1.0)
        return obs


def asking_agent(base_url: str, session_id: str, item: dict) -> float:
    """An agent that always asks twice (its follow-up is a user message between the calls) and scores its last
    answer by length (the random model's answers differ, so the advantages are not zero)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", default_headers={"X-Session-ID": session_id})
    messages = list(item["messages"])
    for follow_up in ("Are you sure? Answer again.", None):
        reply = client.chat.completions.create(model="rlft-policy", messages=messages, max_tokens=12)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return min(len(messages[-1]["content"] or "") / 100, 1.0)


VERIFIERS = ["env=verifiers", "env.taskset=tests.integration.test_ecosystem_envs:LengthTaskset"]
AGENT = ["env=agent", "env.agent=tests.integration.test_ecosystem_envs.asking_agent", "env.inner.size=16"]
OPENENV = ["env=openenv", "env.env=tests.integration.test_ecosystem_envs:LengthGuessEnv", "env.size=16"]
# TINY_RUN without its reward (the env's rubric or rewards are the reward: reward=episode, which the env selects)
RUN = [a for a in TINY_RUN if not a.startswith(("reward.", "~reward.", "eval.size="))]
RUN += ["eval.size=2", "logger.rollouts_interval=1", "cluster.gpu_memory_utilization=0.1"]

SCRIPT = r"""
import json, os, sys
from rl.resolve import from_overrides
from rl.loop.prepare import prepare_samples
from rl.rollout.episodes import build_env
from rl.app import rollout_args
from rl.rollout.vllm import VLLMRollout, cpu_threads_env
from rl.types import Sampling

if __name__ == "__main__":  # vLLM may spawn its engine process
    os.environ.update(cpu_threads_env(None))
    model, envs = sys.argv[1], json.loads(sys.argv[2])
    base = ["model.dtype=float32", "algorithm.group_size=2", "cluster.gpu_memory_utilization=0.1"]
    r = VLLMRollout(**rollout_args(from_overrides(model, *base, *envs[0])))
    calls = []
    engine = r._generate

    def recorded(prompts, sampling, max_tokens=None, seeds=None):
        out = engine(prompts, sampling, max_tokens, seeds)
        calls.append([[list(p), [[c.token_ids, c.logprobs] for c in o.completions]] for p, o in zip(prompts, out)])
        return out

    r._generate = recorded
    report = []
    for overrides in envs:
        cfg = from_overrides(model, *base, *overrides)
        r.episodes, r._env, calls[:] = cfg.episodes, None, []
        env = build_env(cfg.episodes)
        items = env.train_items()[:2]
        prompts = [list(r.tokenizer.apply_chat_template(it["messages"], tools=it.get("tools"), add_generation_prompt=True,
                                                         tokenize=True, return_dict=True)["input_ids"]) for it in items]
        rollouts = r.generate(prompts, Sampling(n=2, temperature=1.0, max_tokens=12), [7, 8], items)
        rewards = [sum(c.episode.terms.values()) for ro in rollouts for c in ro.completions]
        samples, _, _ = prepare_samples(rollouts, rewards, cfg.algorithm, cfg.completion_tokens)
        report.append({"calls": calls[:], "samples": [[s.prompt_ids, s.completion_ids, s.old_logprobs, s.loss_mask]
                                                      for s in samples],
                       "turns": [c.episode.turns for ro in rollouts for c in ro.completions],
                       "terms": [c.episode.terms for ro in rollouts for c in ro.completions]})
    r.close()
    print("REPORT " + json.dumps(report))
"""


def sampled_spans(prompt: list[int], completion: list[int], calls: list) -> list[tuple[int, list[int], list[float]]]:
    """(offset in the completion, ids, logprobs) of every engine output that continued this episode: a call whose
    prompt is the episode's prompt plus a prefix of its completion, and whose output follows there."""
    whole = prompt + completion
    spans = []
    for call in calls:
        for p, outs in call:
            if len(p) < len(prompt) or whole[: len(p)] != p:
                continue
            for ids, lps in outs:
                if whole[len(p) : len(p) + len(ids)] == ids:
                    spans.append((len(p) - len(prompt), ids, lps))
                    break
    return spans


def check_sampled_tokens_are_trained(report: dict) -> None:
    for prompt, completion, old_logprobs, loss_mask in report["samples"]:
        spans = sampled_spans(prompt, completion, report["calls"])
        assert spans and spans[0][0] == 0
        mask = [0] * len(completion)
        for start, ids, lps in spans:
            assert completion[start : start + len(ids)] == ids  # the engine's ids, never re-tokenised
            assert old_logprobs[start : start + len(ids)] == lps  # and its behaviour logprobs
            mask[start : start + len(ids)] = [1] * len(ids)
        assert (loss_mask or [1] * len(completion)) == mask  # the loss covers exactly the sampled tokens


@pytest.fixture(scope="module")
def engine_report(tiny_model) -> list[dict]:
    """One vLLM engine runs both envs' episodes (an engine start is most of the cost)."""
    envs = [[f"env._target_={t}", *a] for t, a in ((VF_TARGET, VF_ARGS), (OE_TARGET, OE_ARGS), (AG_TARGET, AG_ARGS))]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model), json.dumps(envs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")]
    return json.loads(line[len("REPORT ") :])


VF_TARGET, VF_ARGS = (
    "envs.verifiers_env.VerifiersEnv",
    ["env.taskset=tests.integration.test_ecosystem_envs:LengthTaskset"],
)
AG_TARGET = "envs.agent_env.AgentEnv"
AG_ARGS = [
    "env.agent=tests.integration.test_ecosystem_envs.asking_agent",
    "env.inner._target_=envs.reasoning_gym.ReasoningGymEnv",
    "env.inner.task=chain_sum",
    "env.inner.size=8",
]
OE_TARGET = "envs.openenv_env.OpenEnvEnv"
OE_ARGS = ["env.env=tests.integration.test_ecosystem_envs:LengthGuessEnv", "env.size=4", "env.max_turns=3"]


def test_verifiers_episodes_train_the_tokens_vllm_sampled(engine_report):
    report = engine_report[0]
    check_sampled_tokens_are_trained(report)
    assert all(set(t) == {"vf/correct", "vf/length"} for t in report["terms"])


def test_verifiers_env_trains_on_ray_with_vllm(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train([f"model.path={tiny_model}", f"run.output_dir={out}", "cluster=1a1l", *RUN, *VERIFIERS])
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_trained(out)
    rows = [json.loads(x) for x in (out / "rollouts" / "step_0001.jsonl").read_text().splitlines()]
    assert rows and all(set(r["terms"]) == {"vf/correct", "vf/length"} for r in rows)
    assert all(r["reward"] == pytest.approx(sum(r["terms"].values())) for r in rows)  # the rubric is the reward
    assert [r for r in metric_rows(out) if "eval/accuracy" in r]


def test_openenv_episodes_train_the_tokens_vllm_sampled(engine_report):
    report = engine_report[1]
    check_sampled_tokens_are_trained(report)
    assert max(report["turns"]) > 1  # the observations answered: several model turns in one sequence
    assert all(set(t) == {"openenv/return"} for t in report["terms"])


def test_openenv_env_trains_on_ray_with_vllm(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train([f"model.path={tiny_model}", f"run.output_dir={out}", "cluster=1a1l", *RUN, *OPENENV])
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = check_trained(out)
    assert all(r["env/turns_mean"] > 1 for r in steps)
    rows = [json.loads(x) for x in (out / "rollouts" / "step_0001.jsonl").read_text().splitlines()]
    assert all(r["reward"] == pytest.approx(r["terms"]["openenv/return"]) for r in rows)  # the return is the reward
    multi = [r for r in rows if r["turns"] > 1]
    assert multi and all([s["by"] for s in r["spans"]][:3] == ["model", "env", "model"] for r in multi)


def test_agent_calls_train_the_tokens_vllm_sampled(engine_report):
    report = engine_report[2]
    check_sampled_tokens_are_trained(report)
    assert set(report["turns"]) == {2}  # both calls of each session in one sample, the follow-up masked out


def test_agent_env_trains_on_ray_with_vllm(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_train([f"model.path={tiny_model}", f"run.output_dir={out}", "cluster=1a1l", *RUN, *AGENT])
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = check_trained(out)
    assert all(r["env/turns_mean"] == 2 for r in steps)
    rows = [json.loads(x) for x in (out / "rollouts" / "step_0001.jsonl").read_text().splitlines()]
    assert all(r["reward"] == pytest.approx(r["terms"]["agent/reward"]) for r in rows)  # the agent's reward
    assert all([s["by"] for s in r["spans"]] == ["model", "env", "model"] for r in rows)
