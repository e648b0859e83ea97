"""Sweep packs: the jobs of a sweep that share a base model, trained together as concurrent LoRA adapters on one set
of roles (`python train.py -m ... hydra/launcher=pack`, hydra_plugins/rlft_pack_launcher/).

What a pack shares, decided here once (`SHARED`): the `model` group (the base and its quantization, the LoRA rank,
alpha, dropout and targets, the dtypes, the prompt and completion lengths, the chat template), the `cluster` group
(the roles and their layout, the rollout engine) and the `learner` group (how a step is cut into micro-batches), and
run.deterministic. Everything else may differ from job to job: the algorithm bundle and every `algorithm.*` knob
(learning rate, optimizer, loss, advantages, clipping, KL, sampling temperature), the reward, the env and its data,
the curriculum, run.seed, run.steps, run.prompts_per_step, the evaluation, the checkpoints and the logger. Jobs whose
shared values differ run as packs of their own, with one line naming the key that split them.

Each job is still its own run: train.py's job function runs in a thread of its own (the launcher starts them one by
one) and writes the job's run directory as a solo run does. When it reaches the roles (rl/app.py build_runtime) it
joins its pack and waits; once every job of the pack has joined (or ended before), the roles start once for all of
them (rl/runtime/packed.py: one base, one adapter, optimizer and state per job), and each job trains on its own view
of them. A job that fails or finishes early leaves the others running; Ctrl-C or SIGTERM stops every job at its next
call on the roles, each keeping its last checkpoint (`run.resume=auto` continues the pack, each job from its own).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl import logs
from rl.config.choices import LoraMode, RolloutBackend, RolloutMode, WeightSync
from rl.config.schema import TrainConfig
from rl.errors import RoleStartFailed, StartupError
from rl.learner.grouped import refusal as grouped_refusal
from rl.resolve import resolve_cpu_threads, resolve_learner_backend
from rl.runtime.packed import LOGPROBS, TRAIN, BusyClock, Gather, JobGroup
from rl.runtime.roles import Learner, RolloutActor
from rl.runtime.runtime import Runtime

SHARED_GROUPS = ("model", "cluster", "learner")  # every key of these groups is the pack's
SHARED_KEYS = ("run.deterministic",)
IGNORED = ("model.actor_path",)  # filled by the resolve step from keys the pack shares


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for name, item in value.items() for k, v in _flat(f"{prefix}.{name}", item).items()}
    return {prefix: tuple(value) if isinstance(value, list) else value}


def shared_values(cfg: TrainConfig) -> dict[str, Any]:
    """The values a pack's jobs must agree on, by dotted key."""
    out: dict[str, Any] = {}
    for group in SHARED_GROUPS:
        out |= _flat(group, dataclasses.asdict(getattr(cfg, group)))
    for key in SHARED_KEYS:
        group, name = key.split(".", 1)
        out[key] = getattr(getattr(cfg, group), name)
    return {k: v for k, v in out.items() if k not in IGNORED}


def refusal(cfg: TrainConfig) -> str | None:
    """What makes a job unable to train in a pack, as one line with the key to change (None: it can)."""
    c, m = cfg.cluster, cfg.model
    why = None
    if m.full_finetune:
        why = "model.full_finetune=true trains every weight: a pack's jobs share the base (LoRA only)"
    elif c.num_learners > 1:
        why = f"cluster.num_learners={c.num_learners}: a pack trains on one learner (set cluster.num_learners=1)"
    elif c.rollout_mode == RolloutMode.continuous:
        why = "cluster.rollout_mode=continuous is not packed yet: use cluster.rollout_mode=batch"
    elif c.colocate:
        why = "cluster.colocate=true is not packed: set cluster.colocate=false"
    elif c.weight_sync == WeightSync.ipc:
        why = "cluster.weight_sync=ipc is not packed: set cluster.weight_sync=object_store"
    elif c.num_teachers:
        why = "cluster.num_teachers > 0 (a judge or teacher) is not packed: set cluster.num_teachers=0"
    return None if why is None else f"hydra/launcher=pack: {why}, or run the sweep without hydra/launcher=pack"


def auto_settings(cfg: TrainConfig, cores: int | None = None) -> dict[str, Any]:
    """The `cluster` keys a pack sets where the job left them to the machine, by key, decided from keys the pack
    shares (every job gets the same values; `cores`: this machine's unless given):
    - cluster.lora_mode=auto: on GPUs a LoRA slot per job, the jobs' generate calls merged into one batch
      (rl/runtime/packed.py Gather); on CPU, where vLLM's LoRA kernels decode several times slower than merged
      weights (docs/benchmarks.md), each job's adapter merged into the weights in its turn;
    - cluster.actor_threads / learner_threads unset on CPU: the cores split between the roles
      (rl/resolve.py resolve_cpu_threads), since a pack's jobs keep the actor and the learner busy at the same time
      where a solo synchronous run alternates them."""
    out: dict[str, Any] = dict(resolve_cpu_threads(cfg, overlap=True, cores=cores))
    if cfg.cluster.lora_mode == LoraMode.auto:
        out["lora_mode"] = LoraMode.native if cfg.cluster.use_gpu else LoraMode.merged
    return out


def learner_steps_apart(cfg: TrainConfig, grouped_learner: bool | str = "auto") -> str | None:
    """Why a pack of jobs like `cfg` has its learner step them one after another, in one line (None: it trains their
    steps together, rl/learner/grouped.py); `grouped_learner`: hydra.launcher.grouped_learner (true, false or auto:
    together where the learner runs on a GPU, whose step costs about the same per micro-batch whatever its size; on a
    CPU a micro-batch costs in proportion to its rows, and the grouped step measured slower there, its padded rows
    and per-job LoRA slices costing more than it saves: docs/benchmarks.md#sweep-packs)."""
    if grouped_learner is False:
        return "hydra.launcher.grouped_learner=false"
    if grouped_learner == "auto" and not cfg.cluster.use_gpu:
        return "hydra.launcher.grouped_learner=auto on a CPU learner; true groups them there too"
    model = dataclasses.replace(cfg.model, learner_backend=resolve_learner_backend(cfg))
    return grouped_refusal(model, cfg.learner, cfg.cluster.num_learners)


def phase_count(jobs: int, phases: int = 1, merged: bool = True) -> int:
    """How many phases a pack of `jobs` jobs steps in (`phases`: hydra.launcher.phases; `merged`: whether its calls
    are merged at all, the engine's or the learner's; at most one job a phase). A phase is a group of the jobs whose
    calls are merged among themselves only, so that the phases run out of step: while one phase's rollouts decode on
    the engine another's grouped step trains on the learner, where one phase alternates the two roles. On one GPU
    that both roles share, two phases measured slower than one (docs/benchmarks.md#sweep-packs): the two processes
    take turns on the GPU, so neither role gains the time the other leaves; hence one phase unless set."""
    if not merged:
        return 1
    return max(1, min(phases, jobs))


@dataclass
class Phase:
    """Some of a pack's jobs (`slots`) whose calls are merged among themselves: their generate calls on the engine,
    their learner steps and their sync probes' scoring (None: that kind is not merged). The Gathers of one phase
    share its jobs (rl/runtime/packed.py `beside`); another phase's jobs are never waited for."""

    slots: list[int]
    generate: Gather | None = None
    train: Gather | None = None
    probe: Gather | None = None

    def gathers(self, role: str) -> list[Gather]:
        """The Gathers of this phase's calls on `role` ("actors" or "learners")."""
        found = [self.generate] if role == "actors" else [self.train, self.probe]
        return [g for g in found if g is not None]

    def leave(self, slot: int) -> None:
        """The job in `slot` ended: its phase mates' calls no longer wait for it (the Gathers share one board)."""
        gather = self.generate or self.train
        if gather is not None:
            gather.leave(slot)


def split(cfgs: list[TrainConfig], max_jobs: int) -> tuple[list[list[int]], list[str]]:
    """The jobs (indices into `cfgs`) grouped into packs of at most `max_jobs` whose shared values agree, in job
    order; and one line per group of jobs that had to leave the first one's pack, naming the first differing key."""
    groups: list[tuple[dict[str, Any], list[int]]] = []
    for i, cfg in enumerate(cfgs):
        values = shared_values(cfg)
        for shared, members in groups:
            if shared == values:
                members.append(i)
                break
        else:
            groups.append((values, [i]))
    notes = []
    first_values, first_members = groups[0]
    for values, members in groups[1:]:
        key = next(k for k in sorted(set(values) | set(first_values)) if values.get(k) != first_values.get(k))
        jobs = ", ".join(f"#{i}" for i in members)
        notes.append(
            f"pack: job(s) {jobs} differ from #{first_members[0]} in {key} ({values.get(key)!r} vs "
            f"{first_values.get(key)!r}): they train in a pack of their own"
        )
    packs = [members[k : k + max_jobs] for _, members in groups for k in range(0, len(members), max_jobs)]
    return packs, notes


class Pack:
    """The jobs of one pack in this process. Each job's thread calls `join` (through rl/app.py build_runtime) and
    waits; the launcher calls `start` once every job has joined or ended (`settled`), then `close` once every job's
    thread has ended (`wait_ended`)."""

    def __init__(self, jobs: list[int], log_dir: Path, grouped_learner: bool | str = "auto", phases: int = 1):
        self.jobs, self.log_dir, self.grouped_learner, self.phase_setting = jobs, log_dir, grouped_learner, phases
        self.cond = threading.Condition()
        self.cfgs: dict[int, TrainConfig] = {}
        self.settled: set[int] = set()
        self.launched_jobs: set[int] = set()  # jobs whose thread the launcher started (`launched`)
        self.ended_jobs: set[int] = set()  # jobs whose thread has ended (`ended`), their last line printed
        self.runtimes: dict[int, Runtime] | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()  # set: every job stops at its next call (rl/runtime/packed.py JobGroup)
        self.slots: dict[int, int] = {}  # job -> its slot in the shared roles
        # the jobs' merged calls, per phase: generate calls on a vLLM engine, learner steps (rl/learner/grouped.py)
        # and, beside them, the sync probes' scoring
        self.phases: list[Phase] = []
        self._teardown: Callable[[], None] | None = None
        self._log: logging.Handler | None = None

    def join(self, job: int, cfg: TrainConfig) -> tuple[Runtime, Callable[[], None]]:
        """In job `job`'s thread: wait for the shared roles; this job's runtime on them (its teardown is the
        pack's, so it does nothing here)."""
        with self.cond:
            self.cfgs[job] = cfg
            self.settled.add(job)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.runtimes is not None or self.error is not None)
        if self.error is not None:
            if isinstance(self.error, KeyboardInterrupt):
                raise KeyboardInterrupt
            raise StartupError(f"the pack's roles did not start: {self.error}")
        assert self.runtimes is not None
        return self.runtimes[job], lambda: None

    def launched(self, job: int) -> None:
        """The launcher started job `job`'s thread: the pack closes only once it has ended."""
        with self.cond:
            self.launched_jobs.add(job)

    def ended(self, job: int) -> None:
        """The last thing job `job`'s thread does."""
        # its phase mates' generate calls and learner steps no longer wait for it
        slot = self.slots.get(job)
        for phase in self.phases:
            if slot in phase.slots:
                phase.leave(slot)
        with self.cond:
            self.settled.add(job)
            self.ended_jobs.add(job)
            self.cond.notify_all()

    def wait_ended(self, timeout_s: float | None = None) -> bool:
        """Whether every launched job's thread has ended, waiting up to `timeout_s` for it. The launcher waits here
        rather than in Thread.join: a KeyboardInterrupt (Ctrl-C, or SIGTERM through rl/entry.py) raised in CPython
        3.11's Thread.join marks the thread it waited for as ended while that thread still runs, and the pack would
        close its roles, and the process exit, before that job had printed the line that continues it."""
        with self.cond:
            return self.cond.wait_for(lambda: self.launched_jobs <= self.ended_jobs, timeout=timeout_s)

    def wait_settled(self, job: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: job in self.settled)

    def start(self) -> None:
        """Start the shared roles for the jobs that joined, and hand each its runtime (in the launcher's thread)."""
        from rl.app import build_runtime
        from rl.preflight.diagnose import explain

        jobs = sorted(self.cfgs)
        try:
            if not jobs:
                raise StartupError("no job of the pack reached its start")
            cfgs = [self.cfgs[j] for j in jobs]
            first = cfgs[0]
            # the pack's own records (the roles' placement) in its logs/driver.log, until it closes
            self._log = logs.setup_driver(self.log_dir, first.run.verbose, this_thread=True)
            print(f"pack: jobs {', '.join(f'#{j}' for j in jobs)} share one {first.model.path}", flush=True)
            try:
                shared, self._teardown = build_runtime(first, pack=cfgs, log_dir=self.log_dir)
            except RoleStartFailed as e:
                raise StartupError(explain(e.role, e.cause, first)) from e
            self.slots = {job: slot for slot, job in enumerate(jobs)}
            self.phases = self._phases(first, shared, jobs)
            runtimes = {}
            busy = BusyClock(shared.actors), BusyClock(shared.learners)
            for slot, (job, cfg) in enumerate(zip(jobs, cfgs)):
                phase = next(p for p in self.phases if slot in p.slots)
                actors: JobGroup[RolloutActor] = JobGroup(
                    shared.actors, slot, self.stop, phase.gathers("actors"), busy[0]
                )
                learners: JobGroup[Learner] = JobGroup(
                    shared.learners, slot, self.stop, phase.gathers("learners"), busy[1]
                )
                episodes = cfg.episodes is not None
                runtimes[job] = Runtime(actors, learners, cfg.cluster, None, episodes=episodes)
        except BaseException as e:
            with self.cond:
                self.error = e
                self.cond.notify_all()
            raise
        with self.cond:
            self.runtimes = runtimes
            self.cond.notify_all()

    def _phases(self, first: TrainConfig, shared: Any, jobs: list[int]) -> list[Phase]:
        """The jobs' slots dealt into phases (`phase_count`), each with its Gathers of the calls the pack merges:
        the engine's generate calls where it has a LoRA slot per job, the learner's steps and probe scoring where
        it groups them (`learner_steps_apart`, said in one line where not)."""
        c = first.cluster
        engine = c.rollout_backend == RolloutBackend.vllm and c.lora_mode == LoraMode.native
        why = learner_steps_apart(first, self.grouped_learner)
        if why is not None:
            print(f"pack: the learner steps the jobs one after another ({why})", flush=True)
        n = phase_count(len(jobs), self.phase_setting, merged=engine or why is None)
        phases = []
        for k in range(n):
            slots = list(range(k, len(jobs), n))
            generate = Gather(shared.actors, slots) if engine else None
            train = Gather(shared.learners, slots, TRAIN, beside=generate) if why is None else None
            probe = Gather(shared.learners, slots, LOGPROBS, beside=train) if train is not None else None
            phases.append(Phase(slots, generate, train, probe))
        if n > 1:
            groups = " | ".join(", ".join(f"#{jobs[s]}" for s in p.slots) for p in phases)
            print(
                f"pack: the jobs step in {n} phases ({groups}; hydra.launcher.phases): one phase's rollouts decode "
                "while another's learner step trains",
                flush=True,
            )
        return phases

    def interrupt(self) -> None:
        """Stop every job at its next call on the roles (each ends as an interrupted run, its checkpoint kept)."""
        self.stop.set()
        with self.cond:
            if self.runtimes is None and self.error is None:
                self.error = KeyboardInterrupt()
            self.cond.notify_all()

    def close(self) -> None:
        teardown, self._teardown = self._teardown, None
        if teardown is not None:
            teardown()
        if self._log is not None:
            logging.getLogger().removeHandler(self._log)
            self._log.close()
            self._log = None
