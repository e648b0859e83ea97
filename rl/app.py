"""Assemble a run from validated pieces: model path, tokenizer, logger, roles; run the loop; tear down."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rl.config import TrainConfig

log = logging.getLogger(__name__)


class UserFacingError(RuntimeError):
    """An error whose message alone tells the user what failed (printed as one line, no traceback)."""


def run(cfg: TrainConfig, *, env: Any, reward_fn: Any, resolved: dict, run_dir: Path) -> dict[str, float]:
    from rl.models import resolve_model_path

    t0 = time.perf_counter()
    model_path = resolve_model_path(cfg.model.path)
    from transformers import AutoTokenizer

    from rl.driver import build_runtime, train
    from rl.metrics import MetricsLogger
    from rl.placement import RayStartError

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=cfg.model.trust_remote_code)
    lg = cfg.logger
    logger = MetricsLogger(
        run_dir,
        kind=lg.kind.value,
        wandb_mode=lg.mode,
        project=lg.project,
        name=lg.name,
        group=lg.group,
        tags=lg.tags,
        config=resolved,
        console_every=lg.console_every,
        total_steps=cfg.steps,
    )
    print(
        f"run dir: {run_dir}\nmodel: {model_path}\n{cfg.cluster.mode.value}: {cfg.cluster.num_actors} rollout "
        f"actor(s), {cfg.cluster.num_learners} learner(s); algorithm {cfg.algorithm.name}; {cfg.steps} steps x "
        f"{cfg.prompts_per_step} prompts x {cfg.algorithm.group_size} samples",
        flush=True,
    )
    try:
        runtime, teardown = build_runtime(cfg, model_path)
    except RayStartError as e:
        logger.close()
        raise UserFacingError(str(e)) from e
    try:
        summary = train(
            cfg, runtime, tokenizer, env, reward_fn, logger, probe_threshold=cfg.sync_probe_threshold, resolved=resolved
        )
    finally:
        teardown()
        logger.close()
    summary["time/total_s"] = time.perf_counter() - t0
    before, after = summary.get("eval/accuracy_before"), summary.get("eval/accuracy_after")
    if before is not None and after is not None:
        print(
            f"held-out accuracy (greedy, {cfg.eval_size} prompts): before {before:.3f} -> after {after:.3f} "
            f"({after - before:+.3f}); total {summary['time/total_s']:.0f} s",
            flush=True,
        )
    return summary
