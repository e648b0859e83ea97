"""The members of one role behind one interface, in this process or as Ray actors, and how work is split.

A `Group` is either plain objects called in this process (`LocalGroup`, cluster.mode=local and tests) or Ray actor
handles (`rl/runtime/placement.py`'s RayGroup); the runtime is written once against the interface. A call names
its method by a role protocol's function (rl/runtime/roles.py: `RolloutActor.generate`), never by a string.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from rl.runtime.roles import Method, P, R, T

R_co = TypeVar("R_co", covariant=True)  # a group of fakes of a role is a group of that role


class MemberDied(RuntimeError):
    """A role's process died during a call (with Ray: RayActorError). Names the role, its index and the cause."""

    def __init__(self, role: str, index: int, cause: str):
        super().__init__(f"{role} {index} died: {cause}")
        self.role, self.index, self.cause = role, index, cause


class RestartFailed(MemberDied):
    """A member Ray was restarting whose constructor raised (vLLM refusing to start for want of memory, say): it is
    dead for good, whatever restarts it had left. `cause` is the constructor's error."""


@dataclass(frozen=True)
class Handle(Generic[T]):
    """A submitted call on member `index`, of a method returning T: what `Group.result` waits for. `token` is the
    group's own (a Ray ObjectRef; in this process, the call's outcome)."""

    index: int
    token: Any


class Group(Protocol[R_co]):
    """Members of one role (`Group[RolloutActor]`). Calls on one member run one at a time, in submission order (as
    Ray actor methods do); calls on different members run concurrently where the group allows. A call names its
    method by the role protocol's function, so a checker holds its arguments to that method's."""

    def __len__(self) -> int: ...

    def call(self, method: Method[R_co, ..., T], args: list[tuple]) -> list[T]:
        """Call `method(*args[i])` on member i, concurrently where possible; return results in member order."""

    def broadcast(self, method: Method[R_co, P, T], *args: P.args, **kwargs: P.kwargs) -> list[T]:
        """Call `method(*args)` on every member with the same (possibly large) arguments."""

    def submit(self, index: int, method: Method[R_co, P, T], *args: P.args, **kwargs: P.kwargs) -> Handle[T]:
        """Start `method(*args)` on member `index`; returns a handle for `result` (AttributeError: no such method)."""

    def result(self, handle: Handle[T]) -> T:
        """Wait for a submitted call; raises MemberDied when the member's process died."""

    def wait(self, handles: list[Handle[Any]], timeout_s: float) -> list[int]:
        """Positions in `handles` of the calls that are done (a failed call is done too), waiting up to
        `timeout_s` for the first of them."""

    def put(self, value: T) -> T:
        """Share a (large) argument once for several calls. Typed as the value: a Ray group returns a reference,
        which a call receives as the value itself."""

    def ready(self, index: int) -> bool:
        """Whether member `index` takes calls now (False while Ray restarts it; RestartFailed when that restart's
        constructor raised)."""

    def pop_busy_s(self) -> float:
        """Member-seconds spent inside calls whose results were collected since the last pop."""

    def close(self) -> None: ...


def method_name(method: Method[Any, ..., Any]) -> str:
    """The name of a role protocol's method (`RolloutActor.generate` -> "generate")."""
    if isinstance(method, str):
        raise TypeError(f"call a role through its protocol (rl/runtime/roles.py), not by the string {method!r}")
    return method.__name__


@dataclass
class _Raised:
    error: Exception


class LocalGroup(Generic[R]):
    """Members are plain objects in this process; a submitted call runs at once (nothing overlaps)."""

    def __init__(self, members: list[R]):
        self.members = members
        self._busy_s = 0.0

    def __len__(self) -> int:
        return len(self.members)

    def submit(self, index: int, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> Handle[T]:
        fn = getattr(self.members[index], method_name(method))
        t0 = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        except Exception as e:  # raised by result(), as a remote call's error is
            out = _Raised(e)
        self._busy_s += time.perf_counter() - t0
        return Handle(index, out)

    def result(self, handle: Handle[T]) -> T:
        if isinstance(handle.token, _Raised):
            raise handle.token.error
        return handle.token

    def wait(self, handles: list[Handle[Any]], timeout_s: float) -> list[int]:
        return list(range(len(handles)))  # a local call ran when it was submitted

    def put(self, value: T) -> T:
        return value

    def ready(self, index: int) -> bool:
        return True

    def call(self, method: Method[R, ..., T], args: list[tuple]) -> list[T]:
        return [self.result(self.submit(i, method, *a)) for i, a in enumerate(args)]

    def broadcast(self, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> list[T]:
        return [self.result(self.submit(i, method, *args, **kwargs)) for i in range(len(self.members))]

    def pop_busy_s(self) -> float:
        busy, self._busy_s = self._busy_s, 0.0
        return busy

    def close(self) -> None:
        for m in self.members:
            if hasattr(m, "close"):
                m.close()


def call_each(group: Group[R], method: Method[R, ..., T], args: list[tuple]) -> list[T]:
    """`Group.call` over `submit`/`result`: every call submitted first (they run concurrently where the group
    allows), then gathered in member order."""
    calls = [group.submit(i, method, *a) for i, a in enumerate(args)]
    return [group.result(c) for c in calls]


def broadcast_shared(group: Group[R], method: Method[R, ..., T], *args: Any, **kwargs: Any) -> list[T]:
    """`Group.broadcast` over `put`/`submit`/`result`: one shared copy of each argument (`put`), sent to every
    member. The callers' `broadcast` checked the arguments against the method; the references stand for them."""
    refs, named = [group.put(a) for a in args], {k: group.put(v) for k, v in kwargs.items()}
    calls = [group.submit(i, method, *refs, **named) for i in range(len(group))]
    return [group.result(c) for c in calls]


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
    """Learners return the same global loss metrics (all-reduced); their times and peak memory overlap (max)
    and their throughputs add up (sum)."""
    out = {}
    for k in results[0]:
        values = [r[k] for r in results]
        if k.startswith(("time/", "memory/")):
            out[k] = max(values)
        elif k.startswith("perf/"):
            out[k] = sum(values)
        else:
            out[k] = sum(values) / len(values)
    return out
