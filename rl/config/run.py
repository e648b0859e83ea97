"""The run's own bookkeeping: what it is (seed, length, batch, resume: `run`), what it logs (`logger`), how it is
evaluated (`eval`) and when it saves (`checkpoint`). Apart from rl/config/schema.py so that the schema reads as the
training groups (model, algorithm, learner) and their cross-field checks; each field keeps its one-line description
here (what `--help` and `python -m rl.tools.keys` print)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl.config.choices import LoggerKind, WandbMode
from rl.config.errors import check, check_fields_finite


@dataclass
class LoggerConfig:
    kind: LoggerKind = LoggerKind.jsonl  # none | jsonl | wandb (metrics.jsonl is always written)
    mode: WandbMode = WandbMode.offline  # wandb mode: online | offline (no account) | disabled
    project: str = "rlft"  # wandb project
    name: str | None = None  # wandb run name (null: the Hydra job name + time)
    group: str | None = None  # wandb group (multirun jobs default to the sweep directory)
    tags: list[str] = field(default_factory=list)  # wandb tags
    console_every: int = 1  # print one console line every N steps
    rollouts_interval: int = 0  # write every completion of every N-th step to a jsonl (0: never)
    rollouts_dir: str | None = None  # where those step_N.jsonl go (null: <run dir>/rollouts)

    def __post_init__(self) -> None:
        check_fields_finite(self, "logger")
        check(self.console_every >= 1, "logger.console_every must be >= 1")
        check(
            self.rollouts_interval >= 0,
            f"logger.rollouts_interval must be >= 0 (0: never; got {self.rollouts_interval})",
        )


@dataclass
class RunConfig:
    """What this run is: its seed, length and batch, where it writes, what it continues."""

    seed: int = 0  # seeds python, numpy, torch, the data order, the rollout engine and every prompt's sampling
    steps: int = 24  # training steps (one rollout batch + update + adapter sync each)
    prompts_per_step: int = 8  # prompts per step; each gets algorithm.group_size completions
    deterministic: bool = False  # deterministic learner kernels; on GPUs also vLLM's batch-invariant mode (slower)
    verbose: bool = False  # show vLLM's and Ray's own log lines on the console (always in <run dir>/logs/)
    output_dir: str | None = None  # run directory (null: Hydra's run directory)
    resume: str | None = None  # null: start fresh | auto: latest checkpoint in output_dir | a checkpoints/step_N path
    max_nonfinite_steps: int = 3  # stop the run after this many steps in a row with a NaN/inf loss (each is skipped)
    sync_probe_threshold: float = 0.2  # fail when the sync probe's mean |dlogp| exceeds its pre-training floor + this
    probe_floor_limit: float | None = (
        0.3  # fail at start when actors and learner disagree on the base by more (null: off)
    )

    def __post_init__(self) -> None:
        check_fields_finite(self, "run")
        check(0 <= self.seed < 2**32, f"run.seed must be in [0, 2**32) (numpy's seed range; got {self.seed})")
        check(self.steps >= 0, f"run.steps must be >= 0 (got {self.steps})")
        check(self.prompts_per_step >= 1, f"run.prompts_per_step must be >= 1 (got {self.prompts_per_step})")
        check(self.max_nonfinite_steps >= 1, f"run.max_nonfinite_steps must be >= 1 (got {self.max_nonfinite_steps})")
        check(self.sync_probe_threshold > 0, f"run.sync_probe_threshold must be > 0 (got {self.sync_probe_threshold})")
        check(self.probe_floor_limit is None or self.probe_floor_limit > 0, "run.probe_floor_limit must be > 0 or null")
        check(
            self.resume != "auto" or self.output_dir is not None,
            "run.resume=auto looks for checkpoints in run.output_dir: set run.output_dir=<the run directory to "
            "continue> (the jobs of a -m sweep continue in their own directories: give hydra.sweep.dir=<the sweep "
            "directory>)",
        )


@dataclass
class EvalConfig:
    """Held-out evaluation, before and after training (and every `interval` steps)."""

    size: int = 64  # held-out prompts evaluated before and after training (0 disables evaluation)
    interval: int = 0  # also evaluate every N steps (0: only before and after training)
    n_samples: int = 0  # completions sampled per eval prompt for pass@k (0: greedy accuracy only)
    temperature: float = 1.0  # sampling temperature of those eval samples (greedy accuracy always uses 0)
    pass_k: list[int] = field(default_factory=lambda: [1])  # k of eval/pass@k (each <= n_samples)
    correct_threshold: float = 1.0  # reward >= this counts as correct (lower it for partial-credit rewards)
    save_dir: str | None = None  # per-sample eval jsonl, one step_N.jsonl per evaluation (null: <run dir>/eval)

    def __post_init__(self) -> None:
        check_fields_finite(self, "eval")
        check(self.size >= 0, f"eval.size must be >= 0 (got {self.size})")
        check(self.interval >= 0, f"eval.interval must be >= 0 (0: only before and after; got {self.interval})")
        check(self.n_samples >= 0, f"eval.n_samples must be >= 0 (0: greedy only; got {self.n_samples})")
        check(self.temperature > 0, f"eval.temperature must be > 0 (got {self.temperature})")
        check(
            all(1 <= k <= max(self.n_samples, 1) for k in self.pass_k),
            f"eval.pass_k={list(self.pass_k)} needs 1 <= k <= eval.n_samples={self.n_samples} (pass@k is estimated "
            f"from eval.n_samples samples per prompt): set eval.n_samples>={max(self.pass_k, default=1)} or drop the "
            "larger k",
        )


@dataclass
class CheckpointConfig:
    interval: int = 5  # checkpoint every N steps and after the last one, in <run dir>/checkpoints (0: never)
    keep_last: int = 2  # checkpoints kept; older ones are deleted after each save (0: keep all)

    def __post_init__(self) -> None:
        check_fields_finite(self, "checkpoint")
        check(self.interval >= 0, f"checkpoint.interval must be >= 0 (0: no checkpoints; got {self.interval})")
        check(
            self.keep_last >= 0, f"checkpoint.keep_last must be >= 0 (0: keep every checkpoint; got {self.keep_last})"
        )
