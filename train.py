"""Train an LLM with RL on verifiable rewards: `python train.py [overrides]`, `python train.py -m ...` to sweep.

Composes conf/train.yaml with Hydra, validates it into the typed schema (rl/config/schema.py), fills its `auto`
values (rl/resolve.py), builds the environment and reward, and hands them to rl/app.py. No maths here. Heavy libraries
(torch, vLLM, Ray) are imported only after the config is valid, so `--help` and `--cfg job` stay instant.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf

from envs.protocol import Environment
from rl.config.schema import ConfigError, TrainConfig, register_configs
from rl.entry import (
    added_key_error,
    build_target,
    check_renamed,
    compose_checked,
    fail,
    on_sigterm,
    one_line_config_error,
    stop_requested,
    sweep_jobs,
    writable_folder,
)

CONF_DIR = str(Path(__file__).resolve().parent / "conf")
# A sweep job without run.output_dir writes into (and with run.resume=auto continues) its own Hydra job directory,
# hydra.sweep.dir/hydra.sweep.subdir; the precheck composes before Hydra names it, so it stands in for it there.
JOB_DIR = "<the sweep job's directory>"
log = logging.getLogger("train")

register_configs()


def precheck_overrides(argv: list[str]) -> TrainConfig | None:
    """Compose once before Hydra's own run, so a typo'd key or bad value fails with one line naming it; returns
    the validated config (None when Hydra flags such as -m or --help are given: Hydra handles those). A `-m` sweep
    has every job composed and checked first, so that a bad value in its last job fails before the first runs."""
    flags = {
        "-m",
        "--multirun",
        "--help",
        "-h",
        "--hydra-help",
        "--info",
        "-i",
        "--cfg",
        "-c",
        "--resolve",
        "--version",
        "--shell-completion",
        "-sc",
        "--experimental-rerun",
        "--config-path",
        "-cp",
        "--config-name",
        "-cn",
        "--config-dir",
        "-cd",
        "-p",
        "--package",
    }
    check_renamed([a for a in argv if "=" in a and not a.startswith("-")])  # sweeps (-m) too
    overrides = [a for a in argv if not a.startswith(("-", "hydra.", "+hydra."))]  # -m / --multirun left out
    sweep = {"-m", "--multirun"}
    others = flags - sweep
    if any(a in sweep for a in argv) and not any(a.split("=")[0] in others for a in argv):
        try:
            jobs = sweep_jobs(CONF_DIR, overrides) or []
        except ConfigError as e:
            fail(str(e))
        writers: dict[str, int] = {}  # run.output_dir -> the first job writing there
        for i, job in enumerate(jobs):
            where = f"sweep job #{i} ({' '.join(job)}): "
            _, cfg = compose_checked(CONF_DIR, "train", job, TrainConfig, where=where, fill={"run.output_dir": JOB_DIR})
            if cfg.run.output_dir == JOB_DIR:
                continue
            first = writers.setdefault(str(Path(cfg.run.output_dir).resolve()), i)
            if first != i:
                fail(
                    f"{where}run.output_dir={cfg.run.output_dir} is sweep job #{first}'s run directory too: leave "
                    "run.output_dir unset (each job writes into its own directory under hydra.sweep.dir) or sweep it"
                )
        return None
    if any(a in flags or a.split("=")[0] in flags for a in argv):
        return None
    return compose_checked(CONF_DIR, "train", overrides, TrainConfig)[1]


def to_typed(cfg: DictConfig) -> TrainConfig:
    added = added_key_error(cfg, TrainConfig)  # what Hydra composed for the job, not the precheck
    if added:
        fail(added)
    try:
        return OmegaConf.to_object(cfg)
    except ConfigError as e:
        fail(str(e))
    except Exception as e:  # noqa: BLE001
        fail(one_line_config_error(e, TrainConfig))


def log_to_file(e: BaseException) -> None:
    """The full traceback of an error the console shows as one line, into the run's log file (Hydra's file
    handler: <hydra run dir>/train.log) and not onto the console; a role's traceback comes with it."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (e,), (type(e), e, e.__traceback__))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def run_plan(cfg: TrainConfig) -> None:
    """plan=true: print the GPU map and memory estimate per role (rl/preflight/plan.py); nothing starts."""
    from rl.preflight.plan import print_plan

    try:
        print_plan(cfg)
    except (ConfigError, ValueError) as e:
        fail(str(e))


# SIGINT's exit status in a shell. An interrupted sweep job ends the sweep: unlike a failed job, the jobs after it
# are not run.
INTERRUPTED = 130


def interrupted(run_dir: Path, sweep_dir: str | None) -> NoReturn:
    """Ctrl-C (or SIGTERM) during a run: one line saying what the run directory keeps and the command that continues
    it (every checkpoint in it is whole: one is written to a temp folder and renamed)."""
    import shlex

    from rl.loop.checkpoint import latest

    last = latest(run_dir)
    kept = f"its last checkpoint is {last.name}" if last else "it has no checkpoint yet, so it starts again from step 0"
    moved = ("run.output_dir=", "run.resume=", "hydra.sweep.dir=")
    args = [a for a in sys.argv[1:] if not a.startswith(moved)]
    place = f"hydra.sweep.dir={sweep_dir}" if sweep_dir else f"run.output_dir={run_dir}"
    command = shlex.join(["python", "train.py", *args, place, "run.resume=auto"])
    # one write, the newline with it: a pack's jobs stop together, and print's two writes (the text, then its end)
    # would let a pack mate's line fall between them
    sys.stderr.write(f"interrupted: {run_dir}: {kept}; continue it with: {command}\n")
    sys.stderr.flush()
    sys.exit(INTERRUPTED)


# Jobs of a sweep run in this process (Hydra's basic launcher) that ended with their one-line error: the sweep goes
# on to the jobs after them and to its summary, and train.py exits 1 at the end naming them.
FAILED_JOBS: list[str] = []


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(dcfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    # the jobs of the basic launcher, and of a pack (rl/pack.py), run in this process: a failed job lets the others go on
    launcher = hydra_cfg.launcher._target_
    in_process_sweep = hydra_cfg.mode == RunMode.MULTIRUN and launcher.endswith((".BasicLauncher", ".PackLauncher"))
    try:
        return run_job(dcfg, hydra_cfg)
    except SystemExit as e:
        if not in_process_sweep or not e.code or e.code == INTERRUPTED:
            raise
        FAILED_JOBS.append(f"#{hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)})")
        return None
    except Exception as e:  # an error of the job's own code (its reward raised, say): one line, the traceback logged
        if not in_process_sweep:
            raise
        job = f"#{hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)})"
        log_to_file(e)
        first = str(e).splitlines()[0] if str(e) else ""
        print(f"error: sweep job {job}: {type(e).__name__}: {first}", file=sys.stderr, flush=True)
        FAILED_JOBS.append(job)
        return None


def run_job(dcfg: DictConfig, hydra_cfg: Any) -> float | None:
    """One run (or sweep job) of the composed config; its errors exit with one line (`fail`)."""
    from hydra.types import RunMode

    if hydra_cfg.mode == RunMode.MULTIRUN and dcfg.run.output_dir is None:  # see JOB_DIR
        dcfg.run.output_dir = hydra_cfg.runtime.output_dir
    cfg = to_typed(dcfg)
    if cfg.plan:  # in a multirun, each job's plan
        run_plan(cfg)
        return None
    if cfg.logger.group is None and hydra_cfg.mode == RunMode.MULTIRUN:
        cfg.logger.group = str(hydra_cfg.sweep.dir)  # a sweep's jobs are one wandb group
    run_dir = Path(cfg.run.output_dir or hydra_cfg.runtime.output_dir)
    from rl.resolve import resolve  # registry names checked and `auto` values filled, before anything starts

    try:
        cfg = resolve(cfg, run_dir, hydra_dir=Path(hydra_cfg.runtime.output_dir))
    except ConfigError as e:
        fail(str(e))
    writable_folder(run_dir, "run.output_dir")
    from rl import logs

    logs.setup_driver(cfg.log_dir, cfg.run.verbose)  # <run dir>/logs/driver.log; a quiet console
    env = build_target(dcfg.env, "env")
    if not isinstance(env, Environment):
        fail(
            f"env: {dcfg.env._target_} is not an environment: it needs train_items() and eval_items() (envs/protocol.py)"
        )
    reward = build_target(dcfg.reward, "reward")
    from rl import app  # heavy imports start here
    from rl.errors import UserFacingError

    sweep_dir = str(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    try:
        summary = app.run(cfg, env=env, reward_fn=reward, resolved=OmegaConf.to_container(dcfg, resolve=True))
    except KeyboardInterrupt:  # the roles are torn down by now (app.run's finally)
        interrupted(run_dir, sweep_dir)
    except Exception as e:
        if stop_requested():  # the roles got the same SIGTERM: a role that died of it is no failure of the run
            log_to_file(e)
            interrupted(run_dir, sweep_dir)
        if isinstance(e, ConfigError):
            fail(str(e))
        if isinstance(e, UserFacingError):
            log_to_file(e)
            fail(str(e), code=1)
        raise
    write_summary(run_dir, summary, cfg.run.steps)
    return summary.get("eval/accuracy_after")


def write_summary(run_dir: Path, summary: dict, steps: int) -> None:
    """<run dir>/summary.json, whole or absent, with the steps the run trained: a resume reads it back to tell a
    finished run (rl/loop/checkpoint.py finished_summary). A finished run that had nothing to do returns the summary
    it holds, which stays as it was."""
    from rl.atomic import replace_when_done
    from rl.loop.checkpoint import STEPS_DONE, SUMMARY
    from rl.run_files import DamagedFile, read_summary

    try:
        if read_summary(run_dir / SUMMARY) == summary:
            return
    except DamagedFile:  # this run's to replace: a resume refuses a damaged one, so this run wrote it
        pass
    with replace_when_done(run_dir / SUMMARY) as tmp:
        tmp.write_text(json.dumps({**summary, STEPS_DONE: steps}, indent=2))


if __name__ == "__main__":  # vLLM spawns processes: keep this guard
    # a process started with SIGINT or SIGTERM blocked (its parent's signal mask: Ray starts its workers' children
    # so) would never see Ctrl-C or a scheduler's stop, and train to the end: unblock them
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGTERM, on_sigterm)  # a scheduler's stop, `kill`: the run ends as with Ctrl-C
    checked = precheck_overrides(sys.argv[1:])
    if checked is not None and checked.plan:  # before Hydra makes a run directory: a plan writes nothing
        run_plan(checked)
        sys.exit(0)
    main()
    if FAILED_JOBS:
        fail(f"{len(FAILED_JOBS)} sweep job(s) failed (their errors are above): {', '.join(FAILED_JOBS)}", code=1)
