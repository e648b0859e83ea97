"""env=openenv (envs/openenv_env.py): an OpenEnv environment written here with the library's own classes, mapped
onto our protocol: reset's observation as the prompt, the model's text as the action, observations as the env's
messages until `done`, the steps' rewards summed into the episode's reward, one env instance per episode."""

from __future__ import annotations

import subprocess
import sys

import pytest

openenv = pytest.importorskip("openenv.core", reason="env=openenv needs `make install-envs`")

from rl.rollout.episodes import run_episodes  # noqa: E402
from rl.types import EpisodeSpec, Sampling  # noqa: E402
from tests.fakes import GuessAction, GuessEnv, GuessObservation, ScriptedEngine  # noqa: E402
from tests.helpers import REPO  # noqa: E402


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def make_env(**kw):
    from envs.openenv_env import OpenEnvEnv

    return OpenEnvEnv("tests.fakes:GuessEnv", **kw)


def test_seeds_become_prompts_and_the_held_out_seeds_follow():
    env = make_env(size=4, eval_size=2, seed=10, system_prompt="Answer with one digit.")
    train, held = env.train_items(), env.eval_items()
    assert [i["metadata"]["seed"] for i in train] == [10, 11, 12, 13]
    assert [i["metadata"]["seed"] for i in held] == [14, 15]
    assert train[0]["messages"] == [
        {"role": "system", "content": "Answer with one digit."},
        {"role": "user", "content": "Guess a number between 0 and 9."},
    ]
    assert env.action_field == "guess"  # the action's one required field


def test_observations_answer_until_done_and_the_return_is_the_reward(tok):
    env = make_env(size=1, seed=7)
    (item,) = env.train_items()
    opened, closed = GuessEnv.instances, GuessEnv.closed
    engine = ScriptedEngine(tok, [["5", "It is 9."], ["7", "8"], ["x"]])
    spec = EpisodeSpec("{}", env.max_turns, env.max_episode_tokens, True)
    (rollout,) = run_episodes(engine, tok, env, [[1, 2]], [item], Sampling(n=2, max_tokens=16), spec, 0)
    first, second = rollout.completions
    # 5 -> higher, 7 -> right: two turns, return -0.1 + 1
    assert [m["content"] for m in first.episode.messages] == ["5", "higher", "7", "Right."][:3]
    assert first.episode.turns == 2 and first.episode.terms["openenv/return"] == pytest.approx(0.9)
    # 9 -> lower, 8 -> lower, x -> not a number and out of tries: three turns, three penalties
    assert second.episode.turns == 3 and second.episode.terms["openenv/return"] == pytest.approx(-0.3)
    assert [m["content"] for m in second.episode.messages if m["role"] == "user"] == ["lower", "lower"]
    assert sum(second.mask) == second.model_tokens and 0 in second.mask  # observations are out of the loss
    assert GuessEnv.instances - opened == 2 and GuessEnv.closed - closed == 2  # one instance per episode, closed


def test_a_rejected_action_is_answered_and_counted():
    class Strict(GuessAction):
        guess: int  # "abc" does not validate

    env = make_env(size=1)
    env.action_cls = Strict
    episode = env.start(env.train_items()[0])
    episode.turns = 1
    (msg,) = env.step(episode, "abc")
    assert msg["content"].startswith("error: invalid action") and episode.malformed_calls == 1
    env.finish(episode, truncated=False)


def test_without_the_package_the_module_imports_and_building_the_env_fails_with_one_line():
    """The resolve step reads the class without the package (its limits); building it says what to install."""
    code = (
        "import sys; sys.modules['openenv'] = None; sys.modules['openenv.core'] = None; "
        "from envs.openenv_env import OpenEnvEnv; print('imported'); OpenEnvEnv('tests.fakes:GuessEnv')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stdout.strip() == "imported"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: env=openenv needs the openenv-core package: make install-envs")


@pytest.fixture
def server_url():
    """GuessEnv behind OpenEnv's own server (create_fastapi_app) on a loopback port, stopped after the test."""
    import socket
    import threading
    import time

    import uvicorn

    app = openenv.create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=8)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_a_running_server_plays_the_same_episodes(tok, server_url):
    from envs.openenv_env import OpenEnvEnv

    with pytest.raises(ValueError, match="set env.action_field"):
        OpenEnvEnv(url=server_url)
    remote = OpenEnvEnv(url=server_url, action_field="guess", size=1, seed=7)
    local = make_env(size=1, seed=7)
    assert remote.train_items() == local.train_items()
    spec = EpisodeSpec("{}", remote.max_turns, remote.max_episode_tokens, True)
    out = {}
    for name, env in (("remote", remote), ("local", local)):
        engine = ScriptedEngine(tok, [["5", "It is 9."], ["7", "8"], ["x"]])
        (rollout,) = run_episodes(engine, tok, env, [[1, 2]], env.train_items(), Sampling(n=2, max_tokens=16), spec, 0)
        out[name] = [(c.token_ids, c.mask, c.episode.terms, c.episode.turns) for c in rollout.completions]
    assert out["remote"] == out["local"]
