"""`hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml): Hydra's submitit SLURM launcher, with what a sweep job of
this project needs from it. Each job is one allocation, submitted with sbatch; inside it:

- rank 0 trains, and starts the job's own Ray cluster on the allocation (rl/runtime/slurm.py, through
  rl/runtime/placement.py start_ray with cluster.address=null); with `hydra.launcher.nodes` > 1 the other ranks (one
  per node) join it as Ray workers instead of running the job, and leave when the head has gone;
- every job runs with `run.resume=auto` unless its overrides name run.resume: a job SLURM requeues (preemption, or
  submitit's requeue on the signal before the time limit) continues its own run directory from its last whole
  checkpoint instead of starting over in it;
- SIGTERM (a scheduler's stop, `scancel --signal=TERM`) ends the run as train.py's own handler does, with its last
  checkpoint; submitit would otherwise ignore it. The job's Ray runs in the same job step and gets the signal too
  (where SLURM signals every process of the step), so Ray may end the run first (exit 1, the checkpoints whole all the
  same); the time limit's SIGUSR2, on which submitit requeues the job, it ignores (rl/runtime/slurm.py IGNORE_USR2).

Without sbatch on the PATH the sweep stops before submitting anything, with one line. It lives in the hydra_plugins
namespace because Hydra instantiates launchers only from there; it imports only light modules (Hydra scans it).
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher

from rl.entry import fail, on_sigterm
from rl.runtime import slurm


class SlurmLauncher(SubmititSlurmLauncher):
    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:
        if shutil.which("sbatch") is None:
            fail(
                "hydra/launcher=slurm submits each job with sbatch, which is not on the PATH: run the sweep on a SLURM "
                "login node (or put SLURM's commands on the PATH), or drop hydra/launcher=slurm to run it here"
            )
        return super().launch(job_overrides, initial_job_idx)

    def __call__(
        self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str, singleton_state: Any
    ) -> Any:
        job = slurm.Allocation.from_env()
        if job is not None and job.rank > 0:
            return self.join_as_worker(job, sweep_overrides, job_num)
        overrides = list(sweep_overrides)
        if not any(o.lstrip("+~").split("=", 1)[0] == "run.resume" for o in overrides):
            overrides.append("run.resume=auto")
        signal.signal(signal.SIGTERM, on_sigterm)  # as train.py's own handler
        return super().__call__(overrides, job_dir_key, job_num, job_id, singleton_state)

    def join_as_worker(self, job: slurm.Allocation, sweep_overrides: list[str], job_num: int) -> None:
        """Rank > 0 of a multi-node job: this node's Ray joins rank 0's head until the head goes; no training here.
        Its logs go beside the head's, under the run directory's logs/nodes/."""
        from omegaconf import OmegaConf, open_dict

        assert self.hydra_context is not None and self.config is not None
        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(sweep_overrides))
        if str(config.cluster.mode) != "ray" or config.cluster.address is not None or job.local_rank > 0:
            return None  # no job Ray to join: rank 0 runs the job alone
        with open_dict(config.hydra.job):
            config.hydra.job.num = job_num
        run_dir = config.run.output_dir or str(Path(config.hydra.sweep.dir) / str(config.hydra.sweep.subdir))
        OmegaConf.set_readonly(config, True)
        slurm.serve_worker(job, Path(run_dir) / "logs" / "nodes")
        return None
