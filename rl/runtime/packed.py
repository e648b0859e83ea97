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
from dataclasses import dataclass
from typing import Any, Generic, Protocol

import torch

from rl.runtime.groups import Group, Handle, broadcast_shared, call_each, method_name
from rl.runtime.roles import Method, P, R, T


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

    def jobs(self) -> int:
        return len(self.states)

    def close(self) -> None:
        if hasattr(self.role, "close"):
            self.role.close()


@dataclass(eq=False)
class _Ticket:
    """A job's generate call waiting in a Gather; `handle` and `position` once it was sent with the others."""

    job: int
    args: tuple
    handle: Handle[Any] | None = None
    position: int = 0


class Gather:
    """The pack's jobs' generate calls on one engine merged into one engine call (`PackedRole.generate_jobs`): the
    oldest waiting call of every live job of an actor, sent once each live job has one there. The merge is a
    function of the jobs' own call sequences (the k-th calls go together), never of timing, so a pack repeats
    itself; a job that ends (`leave`) is no longer waited for. Batching the jobs' prompts is where a pack's engine
    gains: one large batch decodes in little more time than one job's."""

    def __init__(self, inner: Group[Any], jobs: list[int]):
        self.inner, self.live = inner, set(jobs)
        self.cond = threading.Condition()
        self.waiting: dict[int, dict[int, deque[_Ticket]]] = {}

    def submit(self, index: int, job: int, args: tuple) -> _Ticket:
        ticket = _Ticket(job, args)
        with self.cond:
            self.waiting.setdefault(index, {}).setdefault(job, deque()).append(ticket)
            self._send_ready(index)
        return ticket

    def leave(self, job: int) -> None:
        with self.cond:
            self.live.discard(job)
            for index, queues in self.waiting.items():
                queues.pop(job, None)
                self._send_ready(index)

    def _send_ready(self, index: int) -> None:
        queues = self.waiting[index]
        while self.live and all(queues.get(j) for j in self.live):
            tickets = [queues[j].popleft() for j in sorted(self.live)]
            handle = self.inner.submit(index, PackedRole.generate_jobs, [(t.job, t.args) for t in tickets])
            for k, t in enumerate(tickets):
                t.handle, t.position = handle, k
            self.cond.notify_all()

    def sent(self, ticket: _Ticket, timeout_s: float | None = None) -> Handle[Any] | None:
        """The merged call's handle once sent (waits up to `timeout_s`; None: not sent yet)."""
        with self.cond:
            self.cond.wait_for(lambda: ticket.handle is not None, timeout=timeout_s)
            return ticket.handle


class JobGroup(Generic[R]):
    """Job `job`'s view of a group of PackedRoles (in this process or Ray actors): the Group interface, each call
    sent to `PackedRole.on_job`, and single-turn generate calls through the pack's `gather` when it has one.
    Closing it leaves the shared roles running (the pack closes them)."""

    def __init__(self, inner: Group[Any], job: int, stop: threading.Event, gather: Gather | None = None):
        self.inner, self.job, self.stop, self.gather = inner, job, stop, gather

    def __len__(self) -> int:
        return len(self.inner)

    def submit(self, index: int, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> Handle[T]:
        if self.stop.is_set():  # the pack is stopping: this job ends as an interrupted run (train.py)
            raise KeyboardInterrupt
        name = method_name(method)
        if self.gather is not None and name == "generate" and len(args) <= 3 and not kwargs:  # single-turn
            return Handle(index, self.gather.submit(index, self.job, args))
        return self.inner.submit(index, PackedRole.on_job, self.job, name, *args, **kwargs)

    def result(self, handle: Handle[T]) -> T:
        ticket = handle.token
        if isinstance(ticket, _Ticket):
            assert self.gather is not None
            sent = self.gather.sent(ticket)
            assert sent is not None
            return self.inner.result(sent)[ticket.position]
        return self.inner.result(handle)

    def wait(self, handles: list[Handle[Any]], timeout_s: float) -> list[int]:
        if self.gather is None:
            return self.inner.wait(handles, timeout_s)
        inner: list[Handle[Any]] = []
        where: list[int] = []
        for k, h in enumerate(handles):
            sent = self.gather.sent(h.token, 0.0) if isinstance(h.token, _Ticket) else h
            if sent is not None:
                inner.append(sent)
                where.append(k)
        if not inner:  # nothing sent yet: wait for the first to be
            self.gather.sent(handles[0].token, timeout_s)
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
        """The shared members' busy time since the last pop, whichever job pops it (a pack's idle fractions are the
        shared roles')."""
        return self.inner.pop_busy_s()

    def close(self) -> None:
        pass
