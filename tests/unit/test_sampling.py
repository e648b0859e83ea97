"""One source of sampling settings (TrainConfig.sampling_for) and what a filter changes: the engines get the
filters whole, and the learner scores the sampled tokens under the distribution the filter left (min_p)."""

from __future__ import annotations

import math

import pytest
import torch

from rl.config.schema import ConfigError
from rl.learner.batching import token_logprobs
from tests.helpers import typed_config


def test_every_generate_call_takes_its_sampling_from_the_schema():
    cfg = typed_config(**{"algorithm.min_p": 0.1, "algorithm.top_p": 0.9, "eval.n_samples": 4})
    train, probe = cfg.sampling_for("train"), cfg.sampling_for("probe")
    assert (train.n, train.min_p, train.top_p, train.max_tokens) == (8, 0.1, 0.9, cfg.model.max_new_tokens)
    assert train.filters() == probe.filters() == {"temperature": 1.0, "top_p": 0.9, "min_p": 0.1}  # probed as drawn
    greedy, sampled = cfg.sampling_for("greedy"), cfg.sampling_for("eval")
    assert greedy.temperature == 0.0 and greedy.n == 1
    assert sampled.n == 4 and sampled.min_p == 0.0  # pass@k samples unfiltered, at eval.temperature
    with pytest.raises(ValueError, match="no sampling for 'judge'"):
        cfg.sampling_for("judge")
    with pytest.raises(ConfigError, match=r"algorithm.min_p must be in \[0, 1\)"):
        typed_config(**{"algorithm.min_p": 1.0})


def test_min_p_logprobs_are_of_the_kept_tokens_renormalised():
    """vLLM's processed logprobs under min_p: tokens below min_p x the likeliest one's probability (after the
    temperature) are out, the rest renormalised; the learner's logprobs must describe the same distribution."""
    logits = torch.tensor([[[2.0, 1.0, 0.0, -3.0]]])  # [B=1, T=1, V=4]
    target = torch.tensor([[1]])
    temperature, min_p = 0.5, 0.1
    p = torch.softmax(logits[0, 0] / temperature, -1)
    kept = p >= min_p * p.max()
    assert kept.tolist() == [True, True, False, False]  # the filter does cut here
    expected = math.log(p[1] / p[kept].sum())
    got = token_logprobs(logits, target, temperature, min_p=min_p)
    assert got.shape == (1, 1) and got.item() == pytest.approx(expected, abs=1e-6)
    assert token_logprobs(logits, target, temperature).item() == pytest.approx(math.log(p[1]), abs=1e-6)
    _, entropy = token_logprobs(logits, target, temperature, min_p=min_p, with_entropy=True)
    assert entropy.item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)  # of the whole distribution
