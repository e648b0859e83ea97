"""A pack's shared roles: the jobs of one sweep trained as concurrent LoRA adapters on one base (hydra/launcher=pack,
rl/pack.py).

One role instance (a learner, a rollout engine) serves every job of the pack. `PackedRole` holds it and each job's
own state: the attributes the role names in `pack_state()` (a learner's optimizer, algorithm knobs, version; an
engine's adapter slot, version, sampling generator) and the tensors it names in `pack_tensors()` (the LoRA
factors), whose storage is the job's own. A call that names a job swaps that job's state in, runs, and reads it back
(tensors by pointer: `param.data` is rebound, nothing is copied). Calls run one at a time (a lock; a Ray actor runs them so anyway), so a
job's call never sees another job's state; the base weights are loaded once.

`JobGroup` is one job's view of a shared group: every call goes to `PackedRole.on_job` with the job's index. The
runtime (rl/runtime/runtime.py) is built on these views per job, unchanged, so each job keeps its own adapter
versions, staleness bound, sync probe, checkpoints and metrics. Setting the pack's `stop` event makes each job's
next call raise KeyboardInterrupt in that job's thread: the job ends as an interrupted run does, with its last
checkpoint.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol

import torch

from rl.runtime.groups import Group, Handle, broadcast_shared, call_each, method_name
from rl.runtime.roles import Method, P, R, T
from rl.types import JobError


class PackSlots(Protocol):
    """What a role offers to be shared by the jobs of a pack."""

    def pack_state(self) -> tuple[str, ...]:
        """Names of the attributes that are each job's own (rebound per call)."""
        ...

    def pack_tensors(self) -> dict[str, torch.Tensor]:
        """The parameters whose values are each job's own (their storage is swapped per call)."""
        ...

    def add_job(self, job: int, **kwargs: Any) -> None:
        """Make the role's per-job attributes and tensors the initial state of `job`, whose constructor arguments
        are `kwargs` (the tensors hold fresh storage already: initialise them in place)."""
        ...


class PackedRole:
    """`cls` built once from the first job's arguments, then set up for each job of `jobs` (constructor keyword
    arguments, one dict per job; what the pack shares is equal in all of them: rl/pack.py checked it)."""

    def __init__(self, cls: type, jobs: list[dict[str, Any]]):
        self.role: Any = cls(**jobs[0])
        self.states: list[dict[str, Any]] = []
        # one call at a time: a Ray actor runs them so anyway; in this process (cluster.mode=local) each job's
        # thread calls the role directly
        self._lock = threading.Lock()
        for job, kwargs in enumerate(jobs):
            if job:  # the next job's tensors get storage of their own, initialised by add_job
                for p in self.role.pack_tensors().values():
                    p.data = p.data.clone()
            self.role.add_job(job, **kwargs)
            self.states.append(self._capture())

    def _capture(self) -> dict[str, Any]:
        role = self.role
        return {
            "attrs": {a: getattr(role, a, None) for a in role.pack_state()},
            "tensors": {n: p.data for n, p in role.pack_tensors().items()},
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def _enter(self, job: int) -> None:
        state, role = self.states[job], self.role
        for a, v in state["attrs"].items():
            setattr(role, a, v)
        for n, p in role.pack_tensors().items():
            mine = state["tensors"].get(n)
            # a tensor made after this job joined (an engine's adapter slot, made at its first load) starts at zero:
            # LoRA factors of zero leave the base model as it is, which is what the job has not replaced yet
            p.data = mine if mine is not None else torch.zeros_like(p.data)
        torch.set_rng_state(state["rng"])
        if state["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def on_job(self, job: int, name: str, *args: Any, **kwargs: Any) -> Any:
        """`role.<name>(*args, **kwargs)` with `job`'s state in place."""
        with self._lock:
            self._enter(job)
            try:
                return getattr(self.role, name)(*args, **kwargs)
            finally:
                self.states[job] = self._capture()

    def generate_jobs(self, calls: list[tuple[int, tuple]]) -> list[Any]:
        """Several jobs' single-turn `generate(prompts, sampling, seeds)` calls in one engine call (a role with
        `generate_requests`: the vLLM engine): each request bound to its job's adapter slot and version."""
        with self._lock:
            requests = []
            for job, args in calls:
                self._enter(job)
                requests.append(self.role.pack_request(*args))
                self.states[job] = self._capture()
            return self.role.generate_requests(requests)

    def train_jobs(self, calls: list[tuple[int, tuple]]) -> list[Any]:
        """Several jobs' `train_step(samples)` calls as one grouped step (a role with `train_grouped`: the learner,
        rl/learner/grouped.py), which swaps each job's state in where it needs it and reads it back after."""
        with self._lock:
            return self.role.train_grouped([_JobStep(self, job, args[0]) for job, args in calls])

    def logprobs_jobs(self, calls: list[tuple[int, tuple]]) -> list[Any]:
        """Several jobs' `sequence_logprobs(prompts, completions)` calls (their sync probes) as one grouped forward (a
        role with `logprobs_grouped`: the learner)."""
        with self._lock:
            return self.role.logprobs_grouped([_JobStep(self, job, args) for job, args in calls])

    def jobs(self) -> int:
        return len(self.states)

    def close(self) -> None:
        if hasattr(self.role, "close"):
            self.role.close()


@dataclass(eq=False)
class _JobStep:
    """One job's part of a grouped step (rl/learner/grouped.py JobStep), under its PackedRole's lock."""

    shared: PackedRole
    job: int
    samples: Any

    def enter(self) -> None:
        self.shared._enter(self.job)

    def leave(self) -> None:
        self.shared.states[self.job] = self.shared._capture()


@dataclass(frozen=True)
class Merge:
    """A role method whose calls a Gather merges (`name`, taking at most `max_args` positional arguments and no
    keywords), and the PackedRole method that runs the merged calls as one (`call`)."""

    name: str
    call: Callable[..., Any]
    max_args: int


GENERATE = Merge("generate", PackedRole.generate_jobs, 3)  # single-turn: prompts, sampling, seeds (no items)
TRAIN = Merge("train_step", PackedRole.train_jobs, 1)  # a grouped learner step (rl/learner/grouped.py)
LOGPROBS = Merge("sequence_logprobs", PackedRole.logprobs_jobs, 2)  # the sync probes' scoring (not the reference's)


@dataclass(eq=False)
class _Sent:
    """A merged call once sent: its handle, and its results once the first of its jobs fetched them, which the
    others read there (a Ray actor's result is then fetched, deserialized and counted as the role's busy time once,
    not once per job: a pack of 8 unpickled every job's rollouts 8 times, in the threads of one process)."""

    handle: Handle[Any]
    unread: int  # the jobs whose results were not read yet: the results are let go after the last
    lock: threading.Lock = field(default_factory=threading.Lock)
    value: Any = None
    error: BaseException | None = None
    fetched: bool = False

    def result(self, inner: Group[Any]) -> list[Any]:
        with self.lock:
            if not self.fetched:
                try:
                    self.value = inner.result(self.handle)
                except BaseException as e:  # every job of the call gets it, as each job's own call would raise it
                    self.error = e
                self.fetched = True
            value, error = self.value, self.error
            self.unread -= 1
            if self.unread == 0:
                self.value = None
        if error is not None:
            raise error
        return value


@dataclass(eq=False)
class _Ticket:
    """A job's call waiting in a Gather; the merged call (`sent`) and the job's `position` in it once it was sent
    with the others."""

    job: int
    args: tuple
    gather: Gather
    sent: _Sent | None = None
    position: int = 0


class _Board:
    """What the Gathers of one pack share: the live jobs, one condition, and the unsent ticket each job is blocked
    on (a job blocked in one Gather makes no call in another until that ticket is sent)."""

    def __init__(self, jobs: list[int]):
        self.live, self.cond = set(jobs), threading.Condition()
        self.blocked: dict[int, _Ticket] = {}
        self.gathers: list[Gather] = []

    def recheck(self) -> None:
        for gather in self.gathers:
            for index in gather.waiting:
                gather._send_ready(index)


class Gather:
    """The pack's jobs' calls of one kind on one group of PackedRoles merged into one call per role (`merge`: the
    engine's single-turn generate calls by default, `TRAIN` for the learner's steps): the oldest waiting call of every
    live job at a role, sent once each live job has one there, or is blocked on an unsent call in another Gather of
    the pack (`beside`: share its jobs; a job waiting for its learner step makes no generate call meanwhile, and one
    whose dynamic sampling or evaluation makes an extra generate call is not waited for by the learner's step). The
    merge is a function of the jobs' own call sequences (the k-th calls go together), never of timing, so a pack
    repeats itself; a job that ends (`leave`) is no longer waited for. Batching the jobs' prompts is where a pack's
    engine gains (one large batch decodes in little more time than one job's), batching their steps is where its
    learner does."""

    def __init__(self, inner: Group[Any], jobs: list[int], merge: Merge = GENERATE, beside: Gather | None = None):
        self.inner, self.merge = inner, merge
        self.board: _Board = beside.board if beside is not None else _Board(jobs)
        self.board.gathers.append(self)
        self.cond, self.live = self.board.cond, self.board.live
        self.waiting: dict[int, dict[int, deque[_Ticket]]] = {}

    def takes(self, name: str, args: tuple, kwargs: dict) -> bool:
        return name == self.merge.name and len(args) <= self.merge.max_args and not kwargs

    def submit(self, index: int, job: int, args: tuple) -> _Ticket:
        ticket = _Ticket(job, args, self)
        with self.cond:
            self.waiting.setdefault(index, {}).setdefault(job, deque()).append(ticket)
            self._send_ready(index)
        return ticket

    def leave(self, job: int) -> None:
        with self.cond:
            self.live.discard(job)
            self.board.blocked.pop(job, None)
            for gather in self.board.gathers:
                for queues in gather.waiting.values():
                    queues.pop(job, None)
            self.board.recheck()

    def _ready(self, queues: dict[int, deque[_Ticket]], job: int) -> bool:
        blocked = self.board.blocked.get(job)
        return bool(queues.get(job)) or (blocked is not None and blocked.gather is not self)

    def _send_ready(self, index: int) -> None:
        queues = self.waiting[index]
        while any(queues.get(j) for j in self.live) and all(self._ready(queues, j) for j in self.live):
            tickets = [queues[j].popleft() for j in sorted(self.live) if queues.get(j)]
            sent = _Sent(self.inner.submit(index, self.merge.call, [(t.job, t.args) for t in tickets]), len(tickets))
            for k, t in enumerate(tickets):
                t.sent, t.position = sent, k
                if self.board.blocked.get(t.job) is t:
                    del self.board.blocked[t.job]
            self.cond.notify_all()

    def sent(self, ticket: _Ticket, timeout_s: float | None = None) -> _Sent | None:
        """The merged call once sent (waits up to `timeout_s`; None: not sent yet). Waiting without a timeout blocks
        the job on `ticket`: the pack's other Gathers no longer wait for its calls meanwhile."""
        with self.cond:
            if ticket.sent is None and timeout_s is None:
                self.board.blocked[ticket.job] = ticket
                self.board.recheck()
            self.cond.wait_for(lambda: ticket.sent is not None, timeout=timeout_s)
            return ticket.sent


class BusyClock:
    """The busy time of a pack's shared group, counted once for all its jobs (`read`: the member-seconds collected
    so far), so that each job's view reports how much of it passed since that job last asked: each job's idle
    fractions are then the shared roles' over its own step, where the first job to ask took it all."""

    def __init__(self, inner: Group[Any]):
        self.inner, self.total, self.lock = inner, 0.0, threading.Lock()

    def read(self) -> float:
        with self.lock:
            self.total += self.inner.pop_busy_s()
            return self.total


class JobGroup(Generic[R]):
    """Job `job`'s view of a group of PackedRoles (in this process or Ray actors): the Group interface, each call
    sent to `PackedRole.on_job`, and the calls a Gather of the pack's on this `inner` takes through it (`gathers`:
    one or several, each its own kind of call). `clock`: the busy time of `inner`, shared by the pack's views of it.
    Closing it leaves the shared roles running (the pack closes them)."""

    def __init__(
        self,
        inner: Group[Any],
        job: int,
        stop: threading.Event,
        gathers: Gather | Sequence[Gather] = (),
        clock: BusyClock | None = None,
    ):
        self.inner, self.job, self.stop = inner, job, stop
        self.gathers = (gathers,) if isinstance(gathers, Gather) else tuple(gathers)
        self.clock, self.busy_seen = clock or BusyClock(inner), 0.0

    def __len__(self) -> int:
        return len(self.inner)

    def submit(self, index: int, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> Handle[T]:
        if self.stop.is_set():  # the pack is stopping: this job ends as an interrupted run (train.py)
            raise KeyboardInterrupt
        name = method_name(method)
        for gather in self.gathers:
            if gather.takes(name, args, kwargs):
                return Handle(index, gather.submit(index, self.job, args))
        return self.inner.submit(index, PackedRole.on_job, self.job, name, *args, **kwargs)

    def result(self, handle: Handle[T]) -> T:
        ticket = handle.token
        if isinstance(ticket, _Ticket):
            sent = ticket.gather.sent(ticket)
            assert sent is not None
            return JobError.unwrap(sent.result(self.inner)[ticket.position])
        return self.inner.result(handle)

    def wait(self, handles: list[Handle[Any]], timeout_s: float) -> list[int]:
        inner: list[Handle[Any]] = []
        where: list[int] = []
        for k, h in enumerate(handles):
            ticket = h.token
            if isinstance(ticket, _Ticket):
                sent = ticket.gather.sent(ticket, 0.0)
                if sent is None:
                    continue
                h = sent.handle
            inner.append(h)
            where.append(k)
        if not inner:  # nothing sent yet: wait for the first to be
            first = handles[0].token
            first.gather.sent(first, timeout_s)
            return []
        return [where[k] for k in self.inner.wait(inner, timeout_s)]

    def put(self, value: T) -> T:
        return self.inner.put(value)

    def ready(self, index: int) -> bool:
        return self.inner.ready(index)

    def call(self, method: Method[R, ..., T], args: list[tuple]) -> list[T]:
        return call_each(self, method, args)

    def broadcast(self, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> list[T]:
        return broadcast_shared(self, method, *args, **kwargs)

    def pop_busy_s(self) -> float:
        """The shared members' busy time since this job's last pop, whichever job's calls it was."""
        total = self.clock.read()
        busy, self.busy_seen = total - self.busy_seen, total
        return busy

    def close(self) -> None:
        pass
