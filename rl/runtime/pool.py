"""The live rollout actors: which take work, which died, which Ray is restarting, and where a dead actor's work goes.

Fault tolerance: a rollout actor whose process dies during a call (MemberDied) is restarted by Ray (up to
`cluster.actor_max_restarts` times); its prompts go to a live actor; the restarted one (a restart runs __init__
again: base model, version 0) gets no work until it answers again, and then the current adapter before anything
else (`welcome`, set by the runtime to rl/runtime/sync.py's); a console line and `fault/actor_restarts` say so.
A restart whose __init__ raises (vLLM refusing to start for want of memory, say) is Ray's last: that actor is left
out at once, its error on the console, and when no actor is left the run stops with that error.
A learner's death is not handled here: it ends the run (rl/loop/driver.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

from rl.runtime.groups import Group, Handle, MemberDied, RestartFailed
from rl.runtime.roles import Method, P, R, T

REJOIN_TIMEOUT_S = 600.0  # how long to wait for a restarting actor when no other actor is live


@dataclass
class Call(Generic[T]):
    actor: int
    epoch: int  # the actor's death count when the call was sent: a failure of an older epoch was already handled
    handle: Handle[T]


class ActorPool(Generic[R]):
    """The rollout actors behind one group, with their deaths and restarts counted."""

    def __init__(self, actors: Group[R], max_restarts: int, role: str = "rollout actor"):
        self.actors, self.max_restarts, self.role = actors, max_restarts, role  # role: "judge/teacher" too
        self.deaths = [0] * len(actors)
        self.gone: set[int] = set()  # actors that used up their restarts, or whose restart failed
        self.restarting: set[int] = set()  # actors Ray is restarting: no work until they are ready again
        self.failed_restarts: dict[int, str] = {}  # actors whose restart raised in __init__: the error
        # what a restarted actor gets before any work; False: it cannot be taken back yet (see rl/runtime/sync.py)
        self.welcome: Callable[[int], bool] = lambda i: True
        self.restarts = 0  # fault/actor_restarts since the last pop

    def __len__(self) -> int:
        return len(self.actors)

    def live(self) -> list[int]:
        """Actors that take new work: not past their restarts and not restarting."""
        return [i for i in range(len(self.actors)) if i not in self.gone and i not in self.restarting]

    def submit(self, actor: int, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> Call[T]:
        return Call(actor, self.deaths[actor], self.actors.submit(actor, method, *args, **kwargs))

    def result(self, call: Call[T]) -> T:
        return self.actors.result(call.handle)

    def wait(self, calls: list[Call[Any]], timeout_s: float) -> list[int]:
        """Positions of the calls that are done, waiting up to `timeout_s` for the first (Group.wait)."""
        return self.actors.wait([c.handle for c in calls], timeout_s)

    def result_or_resend(
        self, call: Call[T], method: Method[R, ..., T], args: tuple, n_prompts: int
    ) -> tuple[Call[T], T]:
        """The call's result; when its actor dies, the same work goes to the actor `died` names (the death counted,
        Ray restarting the dead one) and so on until one answers. Returns the call that answered and its result."""
        while True:
            try:
                return call, self.result(call)
            except MemberDied as e:
                call = self.resend(call, method, args, e, n_prompts)

    def resend(self, call: Call[T], method: Method[R, ..., T], args: tuple, e: MemberDied, n_prompts: int) -> Call[T]:
        """A call whose actor died (`e`), sent again as it was to the live actor `died` names."""
        return self.submit(self.died(call, method.__name__, e, n_prompts), method, *args)

    def on_live(self, method: Method[R, [], Any]) -> float:
        """Call `method` on every live actor and wait (an actor that dies meanwhile is handed to Ray's restart, as
        anywhere else); the seconds it took."""
        t0 = time.perf_counter()
        self.results([self.submit(i, method) for i in self.live()], method.__name__)
        return time.perf_counter() - t0

    def results(self, calls: list[Call[T]], what: str) -> list[tuple[Call[T], T]]:
        """Each call's result, in order; a call whose actor died is handed to Ray's restart (`died`, counted) and
        left out: it carried no prompts to send again."""
        out = []
        for call in calls:
            try:
                out.append((call, self.actors.result(call.handle)))
            except MemberDied as e:
                self.died(call, what, e, 0)
        return out

    def rejoin(self, wait: bool) -> None:
        """Take back restarted actors that are ready again, `welcome` first (a restart ran __init__ again: base
        model, version 0). With `wait`, wait while no actor at all is live."""
        deadline = time.monotonic() + REJOIN_TIMEOUT_S
        while True:
            for i in sorted(self.restarting):
                try:
                    if self.actors.ready(i) and self.welcome(i):
                        self.restarting.discard(i)
                except RestartFailed as e:  # its constructor raised on the restart: Ray will not try again
                    self.restarting.discard(i)
                    self.gone.add(i)
                    self.failed_restarts[i] = e.cause
                    print(f"{self.role} {i} could not be restarted ({e.cause}): left out", flush=True)
            if self.live() or not wait:
                return
            if not self.restarting:
                failed = "; ".join(f"{self.role} {i}: {c}" for i, c in sorted(self.failed_restarts.items()))
                raise RuntimeError(
                    f"every {self.role} is dead, its restart having failed ({failed})"
                    if failed
                    else f"every {self.role} is dead and none has restarts left (cluster.actor_max_restarts): find "
                    "why they die (out of memory? the Ray logs say) or raise cluster.actor_max_restarts"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {self.role} came back from its restart within {REJOIN_TIMEOUT_S:.0f} s")
            time.sleep(0.5)

    def died(self, call: Call[Any], what_call: str, e: MemberDied, n_prompts: int) -> int:
        """Handle a dead rollout actor once per death (calls sent to it before the death fail with it, and calls
        to a restarting actor fail at once: neither is a new death); returns the live actor that takes its work."""
        i = call.actor
        if call.epoch == self.deaths[i]:
            self.deaths[i] += 1
            self.restarts += 1
            if self.deaths[i] > self.max_restarts:
                self.gone.add(i)
                what = f"it used up its {self.max_restarts} restart(s) (cluster.actor_max_restarts): left out"
            else:
                self.restarting.add(i)
                what = f"Ray restarts it (restart {self.deaths[i]} of {self.max_restarts})"
        else:
            what = "the same death"
        self.rejoin(wait=True)
        live = self.live()
        others = [j for j in live if j != i]
        to = min(others, key=lambda j: (j - i) % len(self.actors)) if others else live[0]
        if n_prompts:
            what += f"; its {n_prompts} prompt(s) go to actor {to}"
        print(f"{self.role} {i} died during {what_call} ({e.cause}): {what}", flush=True)
        return to
