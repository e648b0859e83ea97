"""The roles of a run (rollout actors, learners) behind one small interface, with or without Ray.

`Runtime` holds two groups of role objects and splits work among them; a group is either a list of plain
objects called in this process (`LocalGroup`, cluster.mode=local) or Ray actor handles (`rl/placement.py`).
The logic (sharding prompts, publishing the adapter, checking versions) is written once, here.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from rl.types import Adapter, PromptRollout, Sampling, TrainSample


class Group(Protocol):
    def __len__(self) -> int: ...

    def call(self, method: str, args: list[tuple]) -> list[Any]:
        """Call `method(*args[i])` on member i, concurrently where possible; return results in member order."""

    def broadcast(self, method: str, *args: Any) -> list[Any]:
        """Call `method(*args)` on every member with the same (possibly large) arguments."""

    def close(self) -> None: ...


class LocalGroup:
    """Members are plain objects in this process."""

    def __init__(self, members: list[Any]):
        self.members = members

    def __len__(self) -> int:
        return len(self.members)

    def call(self, method: str, args: list[tuple]) -> list[Any]:
        return [getattr(m, method)(*a) for m, a in zip(self.members, args)]

    def broadcast(self, method: str, *args: Any) -> list[Any]:
        return [getattr(m, method)(*args) for m in self.members]

    def close(self) -> None:
        for m in self.members:
            if hasattr(m, "close"):
                m.close()


def shard(items: list, n: int) -> list[list]:
    """Split into n contiguous, nearly equal parts (earlier parts get the remainder)."""
    k, r = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + k + (1 if i < r else 0)
        out.append(items[start:end])
        start = end
    return out


def shard_groups(samples: list, n: int) -> list[list]:
    """Split samples into n contiguous, nearly equal parts, cutting only between prompt groups (consecutive
    samples with the same prompt: the learner runs a group's prompt once); when that would leave a part
    empty (fewer groups than parts), cut inside groups instead (exact either way, only slower)."""
    bounds = [i for i in range(1, len(samples)) if samples[i].prompt_ids != samples[i - 1].prompt_ids]
    bounds = [0, *bounds, len(samples)]
    cuts = [0]
    for i in range(1, n):
        ideal = i * len(samples) / n
        cuts.append(min(bounds, key=lambda b: (abs(b - ideal), b)))
    cuts.append(len(samples))
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        return shard(samples, n)
    return [samples[a:b] for a, b in zip(cuts, cuts[1:])]


def merge_learner_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    """Learners return the same global loss metrics (all-reduced); their times overlap (max) and their
    throughputs add up (sum)."""
    out = {}
    for k in results[0]:
        values = [r[k] for r in results]
        if k.startswith("time/"):
            out[k] = max(values)
        elif k.startswith("perf/"):
            out[k] = sum(values)
        else:
            out[k] = sum(values) / len(values)
    return out


class VersionMismatch(RuntimeError):
    pass


class Runtime:
    def __init__(self, actors: Group, learners: Group, weight_sync: str = "object_store"):
        self.actors, self.learners = actors, learners
        self.version = 0  # adapter version the actors are expected to hold
        self.weight_sync = weight_sync  # object_store (adapter/weights as bytes) | ipc (full weights, CUDA)

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[PromptRollout]:
        """Sample on every actor (prompts sharded); fail fast if any actor used an unexpected adapter version."""
        parts = shard(prompts, len(self.actors))
        results = self.actors.call("generate", [(part, sampling) for part in parts])
        self._check_versions(results)
        out: list[PromptRollout] = []
        for i, res in enumerate(results):
            for r in res:
                r.actor = i
                out.append(r)
        return out

    def _check_versions(self, per_actor: list[list[PromptRollout]]) -> None:
        for i, res in enumerate(per_actor):
            for r in res:
                if r.adapter_version != self.version:
                    raise VersionMismatch(
                        f"rollout actor {i} generated with adapter version {r.adapter_version}, expected "
                        f"{self.version}: the adapter sync did not reach it"
                    )

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step on every learner, data-parallel: each gets a shard of whole prompt groups, the
        learners sum their globally normalised gradients, and all step identically (`learner/checksum_spread`,
        the max - min of the learners' adapter checksums, is 0 when they agree)."""
        n = len(self.learners)
        if n == 1:
            return self.learners.call("train_step", [(samples,)])[0]
        results = self.learners.call("train_step", [(part,) for part in shard_groups(samples, n)])
        out = merge_learner_metrics(results)
        checksums = self.learners.broadcast("adapter_checksum")
        out["learner/checksum_spread"] = max(checksums) - min(checksums)
        return out

    def reference_logprobs(self, rollouts: list[PromptRollout]) -> list[list[float]]:
        """Per-token logprobs of every completion under the reference policy (learner 0, adapter disabled)."""
        p_ids = [r.prompt_ids for r in rollouts for _ in r.completions]
        c_ids = [c.token_ids for r in rollouts for c in r.completions]
        return self.learners.call("sequence_logprobs", [(p_ids, c_ids, True)])[0]

    def adapter(self) -> Adapter:
        """Learner 0's current adapter."""
        return self.learners.call("get_adapter", [()])[0]

    def sync(self) -> dict[str, float]:
        """Publish learner 0's adapter to every rollout actor as a new version."""
        if self.weight_sync == "ipc":
            return self._sync_ipc()
        t0 = time.perf_counter()
        adapter = self.adapter()
        loads = self.actors.broadcast("load_adapter", adapter)
        self.version = adapter.version
        return {
            "time/sync_s": time.perf_counter() - t0,
            "sync/adapter_mb": adapter.nbytes / 2**20,
            "sync/actor_load_s": max(x["seconds"] for x in loads),
            "sync/version": float(adapter.version),
        }

    def _sync_ipc(self) -> dict[str, float]:
        """Full weights from learner 0 to every actor through CUDA IPC handles (vLLM's weight-transfer API); the
        learner keeps the tensors alive until every actor has loaded them."""
        t0 = time.perf_counter()
        version = self.learners.call("get_version", [()])[0]
        info = self.learners.call("ipc_weights", [()])[0]
        try:
            loads = self.actors.broadcast("load_weights_ipc", info, version)
        finally:
            self.learners.call("release_ipc_weights", [()])
        self.version = version
        return {
            "time/sync_s": time.perf_counter() - t0,
            "sync/actor_load_s": max(x["seconds"] for x in loads),
            "sync/version": float(version),
        }

    def probe(self, prompts: list[list[int]], sampling: Sampling) -> float:
        """Mean |logp_learner - logp_actor| over tokens each actor samples for fixed prompts (sync check)."""
        per_actor = self.actors.broadcast("generate", prompts, sampling)
        self._check_versions(per_actor)
        diffs = []
        for rollouts in per_actor:
            p_ids = [r.prompt_ids for r in rollouts for _ in r.completions]
            c_ids = [c.token_ids for r in rollouts for c in r.completions]
            actor_lp = [c.logprobs for r in rollouts for c in r.completions]
            learner_lp = self.learners.call("sequence_logprobs", [(p_ids, c_ids)])[0]
            for a, b in zip(actor_lp, learner_lp):
                diffs.extend(abs(x - y) for x, y in zip(a, b))
        return sum(diffs) / max(len(diffs), 1)

    def close(self) -> None:
        for group in (self.actors, self.learners):
            try:
                group.close()
            except Exception:  # closing one role must not stop the other from being closed
                pass
