"""Sampling seeds: the seed of every generate request, derived from the run seed and the prompt's place in the run.

Below every room that sends a request (the sampler, the evaluation, the sync probe, the episodes' later turns), so
that a prompt's samples depend on the run seed and where the prompt sits in the run, never on the actor, the batch
or the call it lands in.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 62  # vLLM seeds the k-th of a request's n samples with seed + k: room above for that, within int64


def prompt_seed(run_seed: int, index: int, stream: str = "train", step: int = 0) -> int:
    """The sampling seed of one prompt's generate request (it fixes all G samples of the prompt: vLLM seeds its
    k-th sample with seed + k, rl/rollout/hf.py seeds the prompt's batch with it), so a prompt's samples depend
    on the run seed and the prompt's place in the run, never on the actor, the batch or the call it lands in.

    Training (`stream="train"`): `index` is the prompt's draw number in the data stream (the data cursor before
    it was drawn), unique over the run, repeated passes included; `step` stays 0 because a batch's step is not
    fixed when it is drawn (bounded staleness sends batches ahead, a dynamic-sampling round takes the next batch
    of the queue), while its draw numbers are, also after a resume. Fixed prompt sets sampled again at every step
    (`stream="eval"`, `"probe"`): `index` is the prompt's position in the set and `step` the step.
    A hash (not seed + index) keeps the streams of different prompts, steps and runs apart."""
    key = f"{run_seed}/{stream}/{step}/{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> (64 - SEED_BITS)


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The sampling seed of a multi-turn episode's later turn (turn >= 1): from its prompt's seed, its sample index
    in the prompt's group and the turn, so each turn's tokens depend on the episode alone (rl/rollout/episodes.py)."""
    return prompt_seed(seed, sample, f"turn{turn}")


def segment_seed(seed: int, sample: int, done_tokens: int) -> int:
    """The sampling seed of one segment of a continuous rollout (rl/runtime/stream.py): each of a prompt's samples is
    its own request there, continued from `done_tokens` tokens, so the seed depends on the sample and where the
    segment starts, never on the actor or call it lands in."""
    return prompt_seed(seed, sample, f"segment{done_tokens}")
