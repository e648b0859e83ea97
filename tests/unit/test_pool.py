"""The rollout actors' pool without Ray: a restart that raises in __init__ (RestartFailed from the group's `ready`)
leaves that actor out at once, and stops the wait for a live actor with its error instead of waiting out
REJOIN_TIMEOUT_S."""

from __future__ import annotations

import time

import pytest

from rl.runtime.groups import LocalGroup, RestartFailed
from rl.runtime.pool import ActorPool


class Restarts(LocalGroup):
    """Members 0..n-1; `refuses` holds those whose restart raises, `pending` those still restarting."""

    def __init__(self, n: int, refuses: set[int], pending: set[int] = frozenset()):
        super().__init__([object() for _ in range(n)])
        self.refuses, self.pending = refuses, set(pending)

    def ready(self, index: int) -> bool:
        if index in self.refuses:
            raise RestartFailed("rollout actor", index, "ValueError: no room for the KV cache")
        return index not in self.pending


def test_a_failed_restart_leaves_the_actor_out_and_the_others_work():
    pool = ActorPool(Restarts(3, refuses={1}, pending={2}), max_restarts=2)
    pool.restarting = {1, 2}
    pool.rejoin(wait=False)
    assert pool.live() == [0] and pool.gone == {1} and pool.restarting == {2}
    assert pool.failed_restarts == {1: "ValueError: no room for the KV cache"}
    pool.actors.pending.clear()  # actor 2's restart completes
    pool.rejoin(wait=False)
    assert pool.live() == [0, 2]


def test_the_last_actors_failed_restart_stops_the_wait_with_its_error(capsys):
    pool = ActorPool(Restarts(1, refuses={0}), max_restarts=2)
    pool.restarting = {0}
    t0 = time.monotonic()
    with pytest.raises(
        RuntimeError,
        match=r"every rollout actor is dead, its restart having failed \(rollout actor 0: ValueError: no room",
    ):
        pool.rejoin(wait=True)
    assert time.monotonic() - t0 < 5
    assert (
        "rollout actor 0 could not be restarted (ValueError: no room for the KV cache): left out"
        in capsys.readouterr().out
    )
