"""Multi-turn episodes (rl/rollout/episodes.py) and what the learner makes of them: env tokens from the chat
template, the turn-by-turn loop, the masks, single-turn equivalence, and env tokens' zero gradient."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from envs.protocol import Episode
from envs.retry import RetryEnv
from rl import algorithms
from rl.config.schema import ConfigError
from rl.loop.evaluation import mask_spans
from rl.loop.prepare import episode_metrics, kl_reward_penalty, prepare_samples
from rl.resolve import from_overrides
from rl.rollout.episodes import EnvTokens, run_episodes
from rl.runtime.pipeline import _args
from rl.seeds import turn_seed
from rl.types import Completion, EpisodeInfo, EpisodeSpec, PromptRollout, Sampling, TrainSample
from tests.fakes import ScriptedEngine
from tests.helpers import make_learner


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def chat_ids(tok, messages, **kw) -> list[int]:
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def test_env_tokens_continue_the_chat_template_exactly(tok):
    """prompt + the model's own tokens (ending in its EOS) + the env's delta = the whole conversation rendered."""
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    answer = "It is 6."
    model_ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    env = EnvTokens(tok, use_chat_template=True)
    feedback = [{"role": "user", "content": "That is not correct, try again."}]
    ids = chat_ids(tok, prompt) + model_ids + env.encode(feedback, model_ids[-1])
    assert ids == chat_ids(tok, prompt + [{"role": "assistant", "content": answer}] + feedback)
    tool = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "error: x"}]
    ids = chat_ids(tok, prompt) + model_ids + env.encode(tool, model_ids[-1])
    assert ids == chat_ids(tok, prompt + [{"role": "assistant", "content": answer}] + tool)
    # a turn cut before its EOS: the env's tokens close the turn first
    cut = env.encode(feedback, model_ids[-2])
    assert cut[0] == tok.eos_token_id and cut[1:] == env.encode(feedback, model_ids[-1])
    plain = EnvTokens(tok, use_chat_template=False).encode(feedback, None)
    assert tok.decode(plain) == "\nThat is not correct, try again.\n"


def exact(completions, *, answer, **_):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


class Items:
    def __init__(self, answers=("5", "7")):
        self.answers = answers

    def train_items(self):
        return [{"messages": [{"role": "user", "content": f"Say {a}."}], "answer": a} for a in self.answers]

    eval_items = train_items


def episodes(tok, script, *, max_turns=3, max_tokens=200, n=2, per_turn=16, seeds=None):
    env = RetryEnv(Items(), judge=exact, max_turns=max_turns)
    items = env.train_items()
    prompts = [chat_ids(tok, it["messages"]) for it in items]
    engine = ScriptedEngine(tok, script)
    spec = EpisodeSpec("{}", max_turns, max_tokens, True)
    sampling = Sampling(n=n, max_tokens=per_turn)
    rollouts = run_episodes(engine, tok, env, prompts, items, sampling, spec, version=3, seeds=seeds)
    return rollouts, engine, prompts


def test_each_turn_of_an_episode_is_seeded_from_its_prompt_sample_and_turn(tok):
    # turn 1: the prompts' own seeds; later turns: one seed per episode still going, from (prompt seed, sample, turn)
    _, engine, _ = episodes(tok, [["5", "9"], ["7"]], seeds=[11, 22])
    assert engine.seeds[0] == [11, 22]
    # turn 2: prompt 0 sample 1, prompt 1 samples 0 and 1 (prompt 0 sample 0 was right at once)
    assert engine.seeds[1] == [turn_seed(11, 1, 1), turn_seed(22, 0, 1), turn_seed(22, 1, 1)]
    assert engine.seeds[2] == [turn_seed(11, 1, 2)] and len(set(engine.seeds[1])) == 3
    _, unseeded, _ = episodes(tok, [["5", "9"], ["7"]])
    assert unseeded.seeds == [None, None, None]


def test_episode_loop_batches_turns_and_masks_env_tokens(tok):
    # turn 1: sample 0 of each prompt right ("5" for prompt 0 only), the rest wrong; turn 2: everyone says "7"
    rollouts, engine, prompts = episodes(tok, [["5", "9"], ["7"]])
    # one engine call per turn: turn 1 is the single-turn call (n=2), turn 2 every episode still going (n=1 each)
    assert engine.calls[0] == (2, 2, None)
    assert engine.calls[1][:2] == (3, 1) and len(engine.calls) == 3  # turn 3: prompt 0's wrong "7" retries again
    assert [r.adapter_version for r in rollouts] == [3, 3] and [r.prompt_ids for r in rollouts] == prompts
    first = rollouts[0].completions[0]
    assert first.episode.turns == 1 and first.mask == [1] * len(first.token_ids) and first.text == "5"
    c = rollouts[1].completions[1]  # prompt 1 (answer 7): "9" (wrong), feedback, "7" (right)
    assert c.episode.turns == 2 and c.text == "7" and c.finish_reason == "stop"
    assert [m["role"] for m in c.episode.messages] == ["assistant", "user", "assistant"]
    spans = mask_spans(c.mask)
    assert [m for m, _, _ in spans] == [1, 0, 1]
    for m, start, end in spans:  # model tokens as generated with their logprobs; env tokens 0.0
        if m == 0:
            assert c.logprobs[start:end] == [0.0] * (end - start)
            assert "try again" in tok.decode(c.token_ids[start:end])
        else:
            assert c.logprobs[start] == -0.5 and c.token_ids[end - 1] == tok.eos_token_id
    assert c.episode.env_tokens == spans[1][2] - spans[1][1]
    # the whole episode is the conversation the chat template renders
    conv = rollouts[1].prompt_ids + c.token_ids
    assert conv == chat_ids(tok, [*Items().train_items()[1]["messages"], *c.episode.messages])[: len(conv)]
    wrong = rollouts[0].completions[1]  # prompt 0 (answer 5): "9", "7", "7": out of turns
    assert wrong.episode.turns == 3 and wrong.finish_reason == "stop" and wrong.text == "7"
    m = episode_metrics([x for r in rollouts for x in r.completions])
    assert m["env/turns_mean"] == pytest.approx((1 + 3 + 2 + 2) / 4) and m["env/turns_max"] == 3
    assert 0 < m["env/env_token_frac"] < 1 and m["env/truncated_frac"] == 0
    assert "env/solved_frac" not in m and "env/tool_calls_wellformed_frac" not in m  # no rewards, no tool tried
    # with the task rewards: 3 of 4 episodes solved, 2 of them after the feedback (on their second turn)
    completions = [x for r in rollouts for x in r.completions]
    rewards = [float(c.text == answer) for c, answer in zip(completions, ["5", "5", "7", "7"])]
    m = episode_metrics(completions, rewards, threshold=1.0)
    assert (m["env/solved_frac"], m["env/solved_after_feedback_frac"]) == (0.75, 0.5)
    assert m["env/solved_turn_mean"] == pytest.approx(5 / 3)


def test_episode_budget_truncates(tok):
    rollouts, engine, _ = episodes(tok, [["nope"]], max_tokens=24)
    for c in (c for r in rollouts for c in r.completions):
        assert c.finish_reason == "length" and len(c.token_ids) <= 24
    # the turn caps never let an episode past its budget
    assert all(cap <= 24 for _, _, caps in engine.calls[1:] for cap in caps)


def test_single_turn_env_gives_todays_samples_exactly(tiny_model, tok):
    """Through the episode loop, an env that ends after one turn gives the engine's own generate output; and a
    single-turn run never goes through it (no EpisodeSpec, the actors are not sent items)."""
    from rl.app import rollout_args
    from rl.rollout.hf import HFRollout

    cfg = from_overrides(str(tiny_model), "cluster.rollout_backend=hf", "model.dtype=float32")
    assert cfg.episodes is None  # the actors run no episodes, and the runtime sends them no items
    assert _args([[1]], Sampling(), None, None) == ([[1]], Sampling())
    engine = HFRollout(**rollout_args(cfg))
    prompts = [chat_ids(tok, [{"role": "user", "content": q}]) for q in ("2+2?", "Name a colour.")]
    sampling = Sampling(n=3, temperature=1.0, max_tokens=12)
    state = engine.state_dict()
    today = engine.generate(prompts, sampling)
    engine.load_state(state)

    class OneTurn:
        max_turns, max_episode_tokens = 1, 12

        def start(self, item):
            return Episode(item, list(item["messages"]))

        def step(self, episode, model_text):
            return None

    items = [{"messages": [{"role": "user", "content": "x"}], "answer": ""}] * 2
    ep_spec = EpisodeSpec("{}", 1, 12, True)
    via_loop = run_episodes(engine._generate, tok, OneTurn(), prompts, items, sampling, ep_spec, engine.version)
    for a, b in zip([c for r in today for c in r.completions], [c for r in via_loop for c in r.completions]):
        assert (a.token_ids, a.logprobs, a.finish_reason, a.text) == (b.token_ids, b.logprobs, b.finish_reason, b.text)
        assert a.mask is None and b.mask == [1] * len(b.token_ids)
    groups_of_3 = from_overrides(str(tiny_model), "algorithm.group_size=3")
    rewards = [float(k % 2) for k in range(6)]
    s_today, adv_today, _ = prepare_samples(today, rewards, groups_of_3.algorithm, groups_of_3.completion_tokens)
    s_loop, adv_loop, _ = prepare_samples(via_loop, rewards, groups_of_3.algorithm, groups_of_3.completion_tokens)
    assert all(s.loss_mask == [] for s in s_today)  # today's samples: no mask
    assert torch.equal(adv_today, adv_loop)
    learner = make_learner(tiny_model)
    b_today, b_loop = learner.batcher.completion_batch(s_today), learner.batcher.completion_batch(s_loop)
    assert all(torch.equal(x, y) for x, y in zip(b_today, b_loop))


def episode_completion(model=(3, 4), env=5, more=2, finish="stop") -> Completion:
    """model tokens, env tokens, model tokens: mask 1.., 0.., 1.."""
    mask = [1] * model[0] + [0] * env + [1] * more
    ids = list(range(100, 100 + len(mask)))
    lps = [-1.0 if m else 0.0 for m in mask]
    return Completion(ids, lps, finish, "x", mask, EpisodeInfo(turns=2, env_tokens=env))


def test_prepare_samples_uses_the_mask_and_model_lengths(tiny_model):
    cfg = from_overrides(
        str(tiny_model),
        "algorithm.filter_truncated_response=true",
        "algorithm.overlong_penalty=true",
        "algorithm.overlong_buffer=4",
        "model.max_new_tokens=8",
        "algorithm.group_size=2",
    )
    comps = [
        episode_completion(),
        episode_completion(finish="length"),
        episode_completion(env=50),
        episode_completion(),
    ]
    rollouts = [PromptRollout([1, 2], comps[:2], 0), PromptRollout([1, 3], comps[2:], 0)]
    samples, _, m = prepare_samples(rollouts, [1.0, 0.0, 1.0, 0.0], cfg.algorithm, cfg.completion_tokens)
    assert samples[0].loss_mask == comps[0].mask
    assert samples[1].loss_mask == [0] * len(comps[1].token_ids)  # truncated episode: out of the loss
    # the overlong penalty counts model tokens only: 5 model tokens of 8 allowed, 4 of buffer -> -0.25 each,
    # whatever the env added (50 env tokens in comps[2])
    assert m["reward/overlong_penalty_mean"] == pytest.approx(-0.25)


def test_kl_in_reward_skips_env_tokens(tiny_model):
    # one completion of one prompt: the penalty is per completion (the group size plays no part)
    cfg = from_overrides(str(tiny_model), "algorithm.kl_in_reward=true", "algorithm.kl_coef=0.1")
    c = episode_completion()
    rollouts = [PromptRollout([1], [c], 0)]
    ref = [[-1.5 if m else -9.0 for m in c.mask]]
    shaped, _ = kl_reward_penalty(lambda _: ref, rollouts, [1.0], cfg.algorithm)
    ref_other_env = [[-1.5 if m else -0.1 for m in c.mask]]
    assert kl_reward_penalty(lambda _: ref_other_env, rollouts, [1.0], cfg.algorithm)[0] == shaped
    assert shaped[0] < 1.0


@pytest.mark.parametrize("loss_name", sorted(algorithms.POLICY_LOSSES))
@pytest.mark.parametrize("agg_name", sorted(algorithms.LOSS_AGGREGATIONS))
def test_env_tokens_get_no_gradient_in_any_loss(loss_name, agg_name):
    """Every policy loss x aggregation: changing env tokens' logprobs (behaviour or current) leaves the loss
    unchanged, and their gradient is exactly zero."""
    g = torch.Generator().manual_seed(0)
    B, T = 4, 9
    mask = torch.ones(B, T)
    mask[:, 3:6] = 0  # env tokens in the middle of each episode
    mask[1, 7:] = 0  # padding
    old = -torch.rand(B, T, generator=g) - 0.1
    logp = (old + 0.05 * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2])
    knobs = replace(algorithms.DEFAULT_KNOBS, tis_cap=0.0)
    agg = lambda x, m: algorithms.get_loss_agg(agg_name)(x, m, norm_length=T)  # noqa: E731
    loss_fn = algorithms.get_policy_loss(loss_name)
    loss, _ = loss_fn(logp, old, adv, mask, agg=agg, knobs=knobs)
    loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    assert logp.grad[mask == 1].abs().sum() > 0
    perturbed_old = torch.where(mask == 0, old - 3.0, old)
    perturbed_logp = torch.where(mask == 0, logp.detach() + 2.0, logp.detach())
    again, _ = loss_fn(perturbed_logp, perturbed_old, adv, mask, agg=agg, knobs=knobs)
    assert float(again) == pytest.approx(float(loss.detach()), abs=1e-6)


def test_learner_step_ignores_env_tokens_old_logprobs(tiny_model):
    """Two identical learners, one step each: env tokens' behaviour logprobs differ, loss and update do not; and
    the loss's token count is the model's tokens only."""
    from rl.learner.batching import loss_tokens

    def samples(env_old: float) -> list[TrainSample]:
        out = []
        for k in range(4):
            mask = [1] * (3 + k) + [0] * 4 + [1] * 2
            ids = [200 + 7 * k + t for t in range(len(mask))]
            out.append(TrainSample([5, 6, 7], ids, [-1.0 if m else env_old for m in mask], k - 1.5, mask))
        return out

    assert loss_tokens(samples(0.0)) == sum(3 + k + 2 for k in range(4))
    a, b = (make_learner(tiny_model, "algorithm.loss_agg=token_mean") for _ in range(2))
    ma, mb = a.train_step(samples(0.0)), b.train_step(samples(-7.0))
    assert ma["train/loss"] == pytest.approx(mb["train/loss"], abs=1e-6)
    assert a.adapter_checksum() == pytest.approx(b.adapter_checksum(), abs=1e-6)


def test_multi_turn_envs_resolve_their_episode_limits(tiny_model):
    retry = (
        "env._target_=envs.retry.RetryEnv",
        "env.inner._target_=tests.unit.test_episodes.Items",
        "env.judge._target_=tests.helpers.LengthReward",
    )
    model = str(tiny_model)
    cfg = from_overrides(model, *retry, "env.max_turns=4", "model.max_prompt_tokens=100")
    assert (cfg.episodes.max_turns, cfg.episodes.max_tokens) == (4, 160)  # 160: the class default
    # the engine's max_model_len and the learner's max_seq_length: prompt plus the whole episode
    assert cfg.max_seq_length == 100 + 160
    assert cfg.completion_tokens == cfg.algorithm.loss_agg_norm_length == 160  # the overlong penalty's, the loss's
    with pytest.raises(ConfigError, match="cluster.learner_chunk_size=0"):
        from_overrides(model, *retry, "cluster.learner_chunk_size=1")
    with pytest.raises(ConfigError, match="env.max_turns=0"):
        from_overrides(model, *retry, "env.max_turns=0")
