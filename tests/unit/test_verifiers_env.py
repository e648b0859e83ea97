"""env=verifiers (envs/verifiers_env.py): a verifiers taskset written here with the library's own classes, mapped
onto our protocol: its tasks as prompt items, its toolset's tools called in hermes format, its rubric (weighted
`@vf.reward` methods) as the episode's reward terms, and the episode's tokens the engine's own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

vf = pytest.importorskip("verifiers.v1", reason="env=verifiers needs `make install-envs`")

from rl.rollout.episodes import run_episodes  # noqa: E402
from rl.types import EpisodeSpec, Sampling  # noqa: E402
from tests.fakes import ScriptedEngine  # noqa: E402
from tests.helpers import REPO  # noqa: E402

TASKSET = "tests.unit.test_verifiers_env:SumTaskset"
TOOLS_TASKSET = "tests.unit.test_verifiers_env:SumToolsTaskset"
RECORDING_TASKSET = "tests.unit.test_verifiers_env:RecordingTaskset"


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, trace) -> float:
        return float(self.data.answer in trace.last_reply)

    @vf.reward(weight=0.5)
    async def brief(self, trace) -> float:
        return float(len(trace.last_reply) <= 20)

    @vf.metric
    async def turns(self, trace) -> float:
        return float(trace.num_turns)


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        for a in range(4):
            for b in range(3):
                yield SumTask(
                    SumData(prompt=f"What is {a} + {b}?", system_prompt="Answer with the number.", answer=str(a + b)),
                    self.config.task,
                )


class RecordingTask(SumTask):
    """SumTask that keeps every trace it scored."""

    traces: list = []

    async def score(self, trace, runtime=None):
        RecordingTask.traces.append(trace)
        await super().score(trace, runtime)


class RecordingTaskset(vf.Taskset[RecordingTask]):
    def load(self):
        for task in SumTaskset(self.config).load():
            yield RecordingTask(task.data, self.config.task)


class AddTools(vf.Toolset):
    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class SumToolsTask(SumTask):
    @classmethod
    def toolsets(cls, config):
        return [AddTools(vf.ToolsetConfig())]


class SumToolsTaskset(vf.Taskset[SumToolsTask]):
    def load(self):
        yield SumToolsTask(SumData(prompt="What is 2 + 3?", answer="5"), self.config.task)


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def make_env(taskset: str = TASKSET, **kw):
    from envs.verifiers_env import VerifiersEnv

    return VerifiersEnv(taskset, **kw)


def test_tasks_become_prompt_items_with_a_held_out_split():
    env = make_env(eval_size=3, seed=1)
    train, held = env.train_items(), env.eval_items()
    assert len(train) == 9 and len(held) == 3
    assert not {json.dumps(i) for i in train} & {json.dumps(i) for i in held}
    item = train[0]
    assert [m["role"] for m in item["messages"]] == ["system", "user"]
    assert item["messages"][0]["content"] == "Answer with the number."
    assert item["answer"] == item["metadata"]["vf_task"]["answer"]
    assert "tools" not in item  # no toolsets: single-turn
    assert make_env(eval_size=3, seed=1).train_items() == train  # the split is seeded


def test_a_taskset_loads_by_its_verifiers_id_as_by_import_path(tmp_path, monkeypatch):
    # an installed taskset package: a top-level module exporting its one Taskset in __all__
    (tmp_path / "sum_tasks_pkg.py").write_text(
        "from envs.verifiers_example import SumTaskset\n__all__ = ['SumTaskset']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    by_id = make_env("sum-tasks-pkg", eval_size=64)  # verifiers' ids: dashes for underscores
    by_path = make_env("envs.verifiers_example:SumTaskset", eval_size=64)
    assert len(by_id.train_items()) == 136 and by_id.train_items() == by_path.train_items()
    with pytest.raises(TypeError, match="not a verifiers Taskset"):
        make_env("envs.verifiers_example:SumTask")


def test_rubric_scores_the_whole_episode_into_terms(tok):
    env = make_env()
    item = next(i for i in env.train_items() if i["answer"] == "3")
    engine = ScriptedEngine(tok, [["It is 3.", "The answer is 3, I computed it with care just now."]])
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True)
    (rollout,) = run_episodes(engine, tok, env, [[1, 2, 3]], [item], Sampling(n=2, max_tokens=32), spec, 0)
    short, long = rollout.completions
    assert short.episode.terms == {"vf/correct": 1.0, "vf/brief": 0.5}  # weight 0.5
    assert long.episode.terms == {"vf/correct": 1.0, "vf/brief": 0.0}
    assert short.episode.turns == 1 and short.mask == [1] * len(short.token_ids)  # single-turn: model tokens only


def test_an_episode_cut_by_its_budget_is_scored_too(tok):
    """finish runs however the episode ends: here its one turn is cut by env.max_episode_tokens."""
    env = make_env(RECORDING_TASKSET, max_episode_tokens=3)
    item = next(i for i in env.train_items() if i["answer"] == "3")
    engine = ScriptedEngine(tok, [["The answer is 3, I computed it with care."]])
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True)
    RecordingTask.traces.clear()
    (rollout,) = run_episodes(engine, tok, env, [[1, 2, 3]], [item], Sampling(n=1, max_tokens=32), spec, 0)
    (c,) = rollout.completions
    assert c.finish_reason == "length" and len(c.token_ids) == 3
    assert set(c.episode.terms) == {"vf/correct", "vf/brief"}
    (trace,) = RecordingTask.traces
    assert trace.is_truncated and trace.num_turns == 1  # verifiers' own view: a cut turn


def test_tool_calls_run_in_process_and_only_model_tokens_are_in_the_loss(tok):
    env = make_env(TOOLS_TASKSET)
    (item,) = env.train_items()
    assert [t["function"]["name"] for t in item["tools"]] == ["add_tools_add"]
    call = '<tool_call>{"name": "add_tools_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    engine = ScriptedEngine(tok, [[call], ["The answer is 5."]])
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True)
    (rollout,) = run_episodes(engine, tok, env, [[1, 2, 3]], [item], Sampling(n=1, max_tokens=64), spec, 0)
    (c,) = rollout.completions
    assert c.episode.turns == 2 and c.episode.tool_calls == 1 and c.episode.tool_errors == 0
    assert [m["role"] for m in c.episode.messages] == ["assistant", "tool", "assistant"]
    assert c.episode.messages[1]["content"] == "5"
    assert c.episode.terms == {"vf/correct": 1.0, "vf/brief": 0.5}
    # the loss's tokens are exactly the engine's two answers; the tool message's tokens are masked out
    first = tok(call, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    second = tok("The answer is 5.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert [t for t, m in zip(c.token_ids, c.mask) if m] == first + second
    assert c.token_ids[: len(first)] == first and c.token_ids[-len(second) :] == second
    assert "5" in tok.decode([t for t, m in zip(c.token_ids, c.mask) if not m])


def test_unknown_tools_and_bad_calls_are_the_models_to_read(tok):
    env = make_env(TOOLS_TASKSET)
    (item,) = env.train_items()
    episode = env.start(item)
    episode.turns = 1
    out = env.step(episode, '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{bad</tool_call>')
    assert [m["role"] for m in out] == ["tool", "tool"]
    assert episode.tool_errors == 2 and episode.malformed_calls == 1
    assert env.step(episode, "The answer is 5.") is None  # no call: the episode ends


def test_without_the_package_the_module_imports_and_building_the_env_fails_with_one_line():
    """The resolve step reads the class without the package (its limits); building it says what to install."""
    code = (
        "import sys; sys.modules['verifiers'] = None; sys.modules['verifiers.v1'] = None; "
        "from envs.verifiers_env import VerifiersEnv; print('imported'); VerifiersEnv('envs.verifiers_example:SumTaskset')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stdout.strip() == "imported"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: env=verifiers needs the verifiers package: make install-envs")
