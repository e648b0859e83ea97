"""The reward of an env that judges whole episodes itself (env=verifiers, env=openenv): the env's per-episode terms
(rl/loop/sampler.py adds them to every reward) are the whole reward, so the last turn's text adds nothing here."""

from __future__ import annotations

from typing import Any


class EpisodeReward:
    """0 for every completion: the episode's reward is the env's terms (envs/protocol.py `finish`)."""

    def __call__(self, completions: list[str], *, answer: list[Any], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)
