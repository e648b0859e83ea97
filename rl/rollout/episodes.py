"""Multi-turn episodes on a rollout engine: turn by turn, every active episode's next turn in one engine call.

The protocol is envs/protocol.py's. Turn 1 is exactly the single-turn call (`sampling.n` samples of each prompt);
each later turn is one call with every episode that is still going (n=1 each, its own token budget). The engine's
token ids are kept exactly as generated (model text is decoded for the env, never re-tokenised); the env's messages
become tokens through the chat template (`EnvTokens`, rl/data/prompts.py) and enter the completion with mask 0 and a
placeholder logprob 0.0, so the learner sees prompt_ids + one completion of interleaved model and env tokens, and
trains on the model's only.

Used by both engines (rl/rollout/vllm.py, rl/rollout/hf.py): each passes its one generation function, which is
where a per-request option (a seed list, say) would go.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from envs.protocol import Episode, MultiTurnEnvironment
from rl.data.prompts import EnvTokens
from rl.seeds import turn_seed
from rl.types import Completion, EpisodeInfo, EpisodeSpec, PromptRollout, Sampling

# generate(prompts, sampling, max_tokens per prompt or None) -> one PromptRollout per prompt (sampling.n each)
# an engine's one call: (prompts, sampling, max_tokens per prompt or None, seeds per prompt or None)
TurnFn = Callable[[list[list[int]], Sampling, "list[int] | None", "list[int] | None"], list[PromptRollout]]


def build_env(spec: EpisodeSpec) -> MultiTurnEnvironment:
    """The env of a rollout actor, built from the env config the spec carries (as train.py builds the driver's)."""
    from hydra.utils import instantiate

    env = instantiate(json.loads(spec.env), _convert_="all")
    if not isinstance(env, MultiTurnEnvironment):  # resolve checked the class; an instance may still lack a limit
        raise TypeError(f"env {type(env).__name__} runs episodes but lacks start/step/max_turns/max_episode_tokens")
    return env


@dataclass
class _Run:
    """One episode in progress on the actor: its completion so far and the env's episode."""

    prompt_ids: list[int]
    episode: Episode
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    finish: str = "stop"
    done: bool = False
    last_text: str = ""
    env_tokens: int = 0
    seed: tuple[int, int] | None = None  # (its prompt's seed, its sample index): later turns' seeds derive from it

    def add_model_turn(self, c: Completion) -> None:
        self.ids += c.token_ids
        self.logprobs += c.logprobs
        self.mask += [1] * len(c.token_ids)
        self.last_text, self.finish = c.text, c.finish_reason
        self.episode.turns += 1
        self.episode.messages.append({"role": "assistant", "content": c.text})

    def add_env_turn(self, ids: list[int], messages: list[dict]) -> None:
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [0] * len(ids)
        self.env_tokens += len(ids)
        self.episode.messages.extend(messages)

    def completion(self, n_prompt_messages: int) -> Completion:
        e = self.episode
        info = EpisodeInfo(
            turns=e.turns,
            tool_calls=e.tool_calls,
            tool_errors=e.tool_errors,
            malformed_calls=e.malformed_calls,
            tool_seconds=e.tool_seconds,
            env_tokens=self.env_tokens,
            terms=dict(e.terms),
            messages=e.messages[n_prompt_messages:],
        )
        return Completion(self.ids, self.logprobs, self.finish, self.last_text, self.mask, info)


def run_episodes(
    generate: TurnFn,
    tokenizer: Any,
    env: Any,
    prompts: list[list[int]],
    items: list[dict],
    sampling: Sampling,
    spec: EpisodeSpec,
    version: int,
    seeds: list[int] | None = None,
) -> list[PromptRollout]:
    """`sampling.n` episodes per prompt, the item of each prompt starting them; rollouts in prompt order.
    `sampling.max_tokens` caps each model turn, `spec.max_tokens` the whole episode after the prompt. `seeds` (one
    per prompt) seed the first turn's request; each later turn of an episode gets a seed from its prompt's, its
    sample index and the turn (rl/seeds.py turn_seed), so an episode never depends on which others share a turn."""
    env_tokens = EnvTokens(tokenizer, spec.use_chat_template)
    first_sampling = replace(sampling, max_tokens=min(sampling.max_tokens, spec.max_tokens))
    first = generate(prompts, first_sampling, None, seeds)
    groups: list[list[_Run]] = []
    for i, (p, item, rollout) in enumerate(zip(prompts, items, first)):
        group = []
        for k, c in enumerate(rollout.completions):
            run = _Run(list(p), env.start(item), seed=None if seeds is None else (seeds[i], k))
            run.add_model_turn(c)
            group.append(run)
        groups.append(group)
    runs = [r for g in groups for r in g]
    one = replace(sampling, n=1)
    while True:
        for run in runs:
            if not run.done:
                _advance(run, env, env_tokens, spec)
        active = [r for r in runs if not r.done]
        if not active:
            break
        budgets = [min(sampling.max_tokens, spec.max_tokens - len(r.ids)) for r in active]
        turn_seeds = None if seeds is None else [turn_seed(*r.seed, r.episode.turns) for r in active]
        outs = generate([r.prompt_ids + r.ids for r in active], one, budgets, turn_seeds)
        for run, out in zip(active, outs):
            run.add_model_turn(out.completions[0])
    finish = getattr(env, "finish", None)
    if finish is not None:  # an env that scores the whole episode does it once, however the episode ended
        for run in runs:
            finish(run.episode, run.finish == "length")
    return [
        PromptRollout(list(p), [r.completion(len(item["messages"])) for r in g], version)
        for p, item, g in zip(prompts, items, groups)
    ]


def _advance(run: _Run, env: Any, env_tokens: EnvTokens, spec: EpisodeSpec) -> None:
    """After a model turn: end the episode, or append the env's next messages (as tokens, mask 0)."""
    if run.finish == "length" and len(run.ids) >= spec.max_tokens:  # cut by the episode's budget: truncated
        run.done = True
        return
    messages = env.step(run.episode, run.last_text)
    if not messages or run.episode.turns >= spec.max_turns:
        run.done = True
        return
    ids = env_tokens.encode(messages, run.ids[-1] if run.ids else None, run.episode.item.get("tools"))
    if len(run.ids) + len(ids) >= spec.max_tokens:  # no room left for the model to answer: truncated
        run.done, run.finish = True, "length"
        return
    run.add_env_turn(ids, messages)


class EpisodeEngine:
    """The one `generate` of both rollout engines (rl/rollout/vllm.py, rl/rollout/hf.py): single-turn, or with a
    multi-turn env (`self.episodes`) and the prompts' `items`, `sampling.n` whole episodes per prompt, each turn one
    call of the engine's `_generate(prompts, sampling, max_tokens, seeds)`. `seeds`: one per prompt; an episode's
    later turns derive theirs from it. The engine sets `episodes`, `tokenizer`, `version` and `_env = None`."""

    episodes: EpisodeSpec | None
    tokenizer: Any
    version: int
    _env: MultiTurnEnvironment | None

    def _generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        max_tokens: list[int] | None = None,
        seeds: list[int] | None = None,
    ) -> list[PromptRollout]:
        raise NotImplementedError  # each engine's own call

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        seeds: list[int] | None = None,
        items: list[dict] | None = None,
    ) -> list[PromptRollout]:
        if items is not None and self.episodes is not None:
            if self._env is None:
                self._env = build_env(self.episodes)
            if getattr(self._env, "agent", None) is not None:  # agent code plays the episodes through an endpoint
                from rl.rollout.agents import run_agent_episodes

                env_tokens = EnvTokens(self.tokenizer, self.episodes.use_chat_template)
                return run_agent_episodes(
                    self._generate, env_tokens, self._env, items, sampling, self.episodes, self.version, seeds
                )
            return run_episodes(
                self._generate, self.tokenizer, self._env, prompts, items, sampling, self.episodes, self.version, seeds
            )
        return self._generate(prompts, sampling, seeds=seeds)

    def continue_samples(
        self, prompts: list[list[int]], sampling: Sampling, caps: list[int], seeds: list[int]
    ) -> list[PromptRollout]:
        """One segment per prompt (rl/runtime/stream.py): the engine's own call, one sample each."""
        return self._generate(prompts, replace(sampling, n=1), max_tokens=caps, seeds=seeds)
