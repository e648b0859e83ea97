"""The learner role (rl/learner/learner.py) and its parts: model loading per backend, batching, data-parallel
reduction, export. One sub-package so that each part stays small enough to read."""

from rl.learner.batching import token_logprobs
from rl.learner.learner import Learner

__all__ = ["Learner", "token_logprobs"]
