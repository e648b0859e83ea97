"""The adapter-sync probe: after every sync, each actor samples two fixed prompts and the learner scores the same
tokens; the mean |logp_learner - logp_actor| must stay within `run.sync_probe_threshold` of the floor measured before
training (both sides on the base model: numerics, e.g. bf16 ~0.03-0.09, plus quantisation with a 4-bit learner).
A missed sync shows as a rise above it and stops the run. When generation runs ahead of learning (staleness > 0)
the actors are busy right after a sync, so its probe is read at the next step, before the learners step again.

The floor itself is checked too (`floor_limit`, run.probe_floor_limit): actors that serve another base than the one
the learner computes with (a full-precision copy beside a 4-bit learner: 0.5-1.1 nats per token measured) would have
most importance ratios clipped from the first step, so the run stops at start with one line instead."""

from __future__ import annotations

from rl.errors import UserFacingError
from rl.runtime.runtime import Runtime
from rl.seeds import prompt_seed
from rl.types import Sampling


class ProbeFailed(RuntimeError):
    pass


class BaseMismatch(UserFacingError):
    """The actors and the learner disagree on the base model before training (the probe floor is too high)."""


class SyncProbe:
    def __init__(
        self,
        runtime: Runtime,
        prompts: list[list[int]],
        sampling: Sampling,
        *,
        threshold: float,
        deferred: bool,
        seed: int = 0,
        floor_limit: float | None = None,
    ):
        self.runtime, self.prompts, self.threshold, self.deferred = runtime, prompts, threshold, deferred
        self.floor_limit = floor_limit  # None: the floor is reported, never refused
        self.seed = seed  # the run seed: the probe's samples at step t are the same in every run of this seed
        self.sampling = sampling  # the schema's sampling_for("probe"): drawn as the training samples are
        self.limit = float("inf")
        self._held: tuple[int, list] | None = None  # (step, calls) of a probe read at the next step

    def measure_floor(self) -> float:
        """Learner vs actors on the base model (version 0 on both sides: a correct sync), before any step. Taken
        before a checkpoint is restored, so its sampling never shifts a resumed run's restored random streams."""
        floor = self.runtime.probe_finish(self.runtime.probe_submit(self.prompts, self.sampling, self._seeds(0))).diff
        self.limit = floor + self.threshold
        if self.floor_limit is not None and floor > self.floor_limit:
            raise BaseMismatch(
                f"the rollout actors and the learner disagree on the base model before training: mean |logp_learner - "
                f"logp_actor| = {floor:.4f} nats per token > run.probe_floor_limit={self.floor_limit:g}, so most "
                "importance ratios would be clipped from step 1: make model.actor_path hold the learner's base (with "
                "model.load_in_4bit, model.actor_base=learner does), or raise run.probe_floor_limit (null: off)"
            )
        print(f"sync probe floor {floor:.4f}: a step fails above {self.limit:.4f}", flush=True)
        return floor

    def after_sync(self, step: int, *, last: bool) -> dict[str, float]:
        """Start the probe of the sync that ended `step`; read it now unless it is deferred (the last step's never is)."""
        calls = self.runtime.probe_submit(self.prompts, self.sampling, self._seeds(step))
        if self.deferred and not last:
            self._held = (step, calls)
            return {}
        return self._check(step, calls)

    def _seeds(self, step: int) -> list[int]:
        return [prompt_seed(self.seed, i, "probe", step) for i in range(len(self.prompts))]

    def collect(self) -> dict[str, float]:
        """The deferred probe of the previous step's sync, if one is held (call before the learners step)."""
        if self._held is None:
            return {}
        (step, calls), self._held = self._held, None
        return self._check(step, calls)

    def _check(self, step: int, calls: list) -> dict[str, float]:
        """The probe's metrics: its difference and where its time went (time/probe_samples_s: the wait for the
        actors' samples, time/probe_score_s: the learner's scoring; both within the driver's time/probe_s)."""
        diff, samples_s, score_s = self.runtime.probe_finish(calls)
        if diff > self.limit:
            raise ProbeFailed(
                f"adapter sync check failed at step {step}: mean |logp_learner - logp_actor| = {diff:.4f} > "
                f"{self.limit:.4f} (probe floor before training + sync_probe_threshold): the actor is not running the "
                "learner's adapter"
            )
        return {"sync/logprob_abs_diff": diff, "time/probe_samples_s": samples_s, "time/probe_score_s": score_s}
