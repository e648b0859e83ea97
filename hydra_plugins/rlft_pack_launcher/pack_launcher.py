"""`hydra/launcher=pack` (conf/hydra/launcher/pack.yaml): a sweep's jobs that share a base model train together, as
concurrent LoRA adapters on one set of roles (rl/pack.py says what a pack shares and what its jobs may change).

The launcher composes every job's config, refuses in one line a sweep whose settings cannot be packed, groups the
jobs into packs of at most `max_jobs` whose shared keys agree (saying which key split them), and runs the packs one
after another. In a pack, each job runs train.py's own job function (Hydra's run_job: its run directory, .hydra/
files, metrics, checkpoints and summary, as a solo job) in a thread of its own; the threads are started one by one,
each once the one before has reached the roles (Hydra's job state is process-wide while a job starts), and the
pack's roles start when all have. A failed job is reported at the end, as the basic launcher's are; Ctrl-C or SIGTERM
stops every job with its last checkpoint. It lives in the hydra_plugins namespace because Hydra instantiates
launchers only from there; it imports only light modules (Hydra scans it).
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rl.entry import fail

INTERRUPTED = 130  # train.py's exit status for a stopped run


class PackLauncher(Launcher):
    def __init__(self, max_jobs: int = 8, grouped_learner: bool | str = "auto", phases: int = 1) -> None:
        super().__init__()
        if not isinstance(max_jobs, int) or max_jobs < 1:
            fail(f"hydra.launcher.max_jobs must be a whole number >= 1 (got {max_jobs!r}): the most jobs in one pack")
        if not isinstance(grouped_learner, bool) and grouped_learner != "auto":
            fail(
                f"hydra.launcher.grouped_learner must be true, false or auto (got {grouped_learner!r}): whether the "
                "learner steps a pack's jobs together (auto: on a GPU)"
            )
        if isinstance(phases, bool) or not isinstance(phases, int) or phases < 1:
            fail(
                f"hydra.launcher.phases must be a whole number >= 1 (got {phases!r}): in how many groups a pack's "
                "jobs step out of phase (1: all together)"
            )
        self.max_jobs, self.grouped_learner, self.phases = max_jobs, grouped_learner, phases
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from rl import pack as packs

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        configs = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id = config.hydra.job.num = idx
            configs.append(config)
        typed = [job_config(c) for c in configs]
        for i, cfg in enumerate(typed):
            why = packs.refusal(cfg)
            if why:
                fail(f"sweep job #{initial_job_idx + i} ({' '.join(filter_overrides(job_overrides[i]))}): {why}")
            # what the pack sets where the job left it to the machine, in the job's typed and recorded config
            for key, value in packs.auto_settings(cfg).items():
                setattr(cfg.cluster, key, value)
                with read_write(configs[i]), open_dict(configs[i]):
                    configs[i].cluster[key] = value.value if isinstance(value, Enum) else value
        groups, notes = packs.split(typed, self.max_jobs)
        for note in notes:
            print(note, flush=True)
        if any(cfg.plan for cfg in typed):  # each pack's plan: one base, every job's adapter and optimizer state
            self.plan([[typed[i] for i in members] for members in groups])
        returns: dict[int, JobReturn] = {}
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = JobLabels(out), JobLabels(err)
        try:
            for n, members in enumerate(groups):
                log_dir = sweep_dir / "packs" / str(n) / "logs"
                jobs = ", ".join(f"#{initial_job_idx + i}" for i in members)
                print(f"pack {n + 1}/{len(groups)}: jobs {jobs}", flush=True)
                returns |= self.run_pack(
                    packs.Pack(members, log_dir, self.grouped_learner, self.phases), {i: configs[i] for i in members}
                )
                configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        finally:
            sys.stdout, sys.stderr = out, err
        return [returns[i] for i in range(len(configs))]

    def plan(self, packs: list[list[Any]]) -> NoReturn:
        """plan=true: every pack's preflight plan (rl/preflight/plan.py), nothing started; one line when one does not
        fit."""
        from rl.config.errors import ConfigError
        from rl.pack import learner_steps_apart
        from rl.preflight.plan import print_plan

        too_big = []
        for n, jobs in enumerate(packs):
            print(f"pack {n + 1}/{len(packs)}:", flush=True)
            try:
                grouped = learner_steps_apart(jobs[0], self.grouped_learner) is None
                if not print_plan(jobs[0], pack_jobs=len(jobs), grouped=grouped):
                    too_big.append(f"pack {n + 1} ({len(jobs)} jobs)")
            except (ConfigError, ValueError) as e:
                fail(str(e))
        if too_big:
            fail(
                f"hydra/launcher=pack: {', '.join(too_big)} will not start or not fit as planned above: lower "
                f"hydra.launcher.max_jobs (now {self.max_jobs}), or change what the warnings name"
            )
        sys.exit(0)

    def run_pack(self, pack: Any, configs: dict[int, DictConfig]) -> dict[int, JobReturn]:
        """Every job of `pack` in its own thread, the shared roles started once all have reached them and closed once
        all have ended (the pack's own record of its jobs, `Pack.wait_ended`, not Thread.join, which Ctrl-C can fool)."""
        returns: dict[int, JobReturn] = {}
        try:
            for i, config in configs.items():
                t = threading.Thread(target=self.run_one, args=(pack, i, config, returns), name=f"pack-job-{i}")
                t.daemon = True
                t.start()
                pack.launched(i)
                pack.wait_settled(i)
            pack.start()
            while not pack.wait_ended(timeout_s=0.5):  # in slices: Ctrl-C and SIGTERM reach this thread between them
                pass
        except KeyboardInterrupt:
            pack.interrupt()
            sys.exit(INTERRUPTED)  # after the jobs have ended and the roles are closed (finally)
        finally:
            pack.wait_ended()  # each job stops at its next call on the roles and prints how to continue it
            pack.close()
        if any(getattr(r, "exit_code", None) == INTERRUPTED for r in returns.values()):
            sys.exit(INTERRUPTED)
        return returns

    def run_one(self, pack: Any, i: int, config: DictConfig, returns: dict[int, JobReturn]) -> None:
        from rl.app import join_pack

        join_pack(lambda cfg: pack.join(i, cfg))
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, JobLabels):
                stream.label(f"#{config.hydra.job.num}")
        try:
            assert self.hydra_context is not None and self.task_function is not None
            returns[i] = run_job(
                hydra_context=self.hydra_context,
                task_function=self.task_function,
                config=config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
                configure_logging=False,  # process-wide: the jobs' threads would take each other's log files
            )
        except SystemExit as e:  # train.py's one-line exits (an interrupted job: 130)
            ret = JobReturn(overrides=list(config.hydra.overrides.task), cfg=config, status=JobStatus.FAILED)
            ret.return_value = e
            ret.exit_code = e.code  # type: ignore[attr-defined]
            returns[i] = ret
        except BaseException as e:  # noqa: BLE001 - reported with the job's return, the other jobs go on
            ret = JobReturn(overrides=list(config.hydra.overrides.task), cfg=config, status=JobStatus.FAILED)
            ret.return_value = e
            returns[i] = ret
        finally:
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, JobLabels):
                    stream.flush()  # the job's last text without its newline, if any
            join_pack(None)
            pack.ended(i)


class JobLabels:
    """A stream that starts each line a pack's job thread writes with the job's number ("#3 | "), so that the
    jobs' console lines, which interleave, say whose they are; other threads' lines pass unchanged. A job's text
    reaches the stream in whole lines, each write one or more of them: `print` writes a line's text and its newline
    separately, and a pack mate's line fell between the two. A line without its newline yet waits in its thread
    until the newline or a flush."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.local = threading.local()

    def label(self, text: str | None) -> None:
        # pending: the thread's text after its last newline; begun: its start already went out (flushed)
        self.local.label, self.local.pending, self.local.begun = text, "", False

    def write(self, s: str) -> int:
        label = getattr(self.local, "label", None)
        if label is None or not s:
            return self.stream.write(s)
        text = self.local.pending + s
        if "\n" not in text:
            self.local.pending = text
            return len(s)
        whole, _, self.local.pending = text.rpartition("\n")
        lines = [
            line if k == 0 and self.local.begun else f"{label} | {line}" for k, line in enumerate(whole.split("\n"))
        ]
        self.local.begun = False
        self.stream.write("\n".join(lines) + "\n")
        return len(s)

    def flush(self) -> None:
        label, pending = getattr(self.local, "label", None), getattr(self.local, "pending", "")
        if label is not None and pending:  # a line flushed before its newline (a prompt, a progress bar) goes out
            self.stream.write(pending if self.local.begun else f"{label} | {pending}")
            self.local.pending, self.local.begun = "", True
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding: the stream's own
        return getattr(self.stream, name)


def job_config(config: DictConfig) -> Any:
    """The job's typed config (rl/config/schema.py TrainConfig), without Hydra's own node; train.py checked every
    job's values before the sweep started. Its run.output_dir is the job's directory when unset, as train.py's job
    function makes it (the schema refuses run.resume=auto without one)."""
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        if task.run.output_dir is None:
            task.run.output_dir = str(Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir))
        del task["hydra"]
    return OmegaConf.to_object(task)
