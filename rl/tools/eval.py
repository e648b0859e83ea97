"""Evaluate a base model and a trained policy without training: `python -m rl.tools.eval [overrides]`.

    python -m rl.tools.eval                                                   # the base model on the env's held-out set
    python -m rl.tools.eval adapter=outputs/run eval.n_samples=8              # base vs trained, greedy + avg@8 / pass@8
    python -m rl.tools.eval adapter=outputs/run/checkpoints/step_0010 compare_base=false env=gsm8k reward=boxed

An entry script like train.py, composed by Hydra from conf/eval.yaml: the training groups and keys (model, env,
reward, cluster, eval.size, eval.n_samples, eval.pass_k, eval.temperature, eval.correct_threshold, ...) mean what they
mean in a run, plus `adapter`, `compare_base`, `eval_only` and `eval_out` (`EvalCommandConfig` below),
resolved as a run's config is (`resolve_eval`) and read by the same roles.
`adapter` is an adapter folder, a run directory, a checkpoint or an HF model folder (rl/loop/checkpoint.py find_policy).

The rollout engine is the run's own (rl/rollout: vLLM, or `cluster.rollout_backend=hf`), one engine in this process
behind the same Runtime a run uses, and the metrics and per-sample rows are rl/loop/evaluation.py's. Writes, atomically,
`<eval_out>/results.json` (metrics per policy, the table, the command) and `<eval_out>/<policy>.jsonl` (one row
per completion). vLLM spawns processes: this module must stay runnable only under its `__main__` guard.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rl.config.schema import ConfigError, TrainConfig, check, register_configs
from rl.entry import build_target, compose_checked, fail, writable_folder
from rl.resolve import first_names, resolve
from rl.types import TrainedPolicy

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


@dataclass
class EvalCommandConfig(TrainConfig):
    """This command's schema (conf/eval.yaml): the training config (the same groups, so a run's overrides
    evaluate it as it was trained) plus what to evaluate and where to write it."""

    adapter: str | None = (
        None  # trained policy: adapter folder, run dir, checkpoints/step_N or HF model folder (null: base only)
    )
    compare_base: bool = True  # with `adapter`, also evaluate the base model (model.path) and print both side by side
    eval_only: list[str] = field(default_factory=list)  # evaluate only these named eval sets (empty: all of the env's)
    eval_out: str | None = None  # folder for results.json and the per-sample jsonl (null: outputs/eval/<date>/<time>)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.eval.size > 0, f"eval.size must be > 0 for python -m rl.tools.eval (got {self.eval.size})")
        check(
            self.adapter is not None or self.compare_base,
            "compare_base=false without adapter=... evaluates nothing: give adapter=<adapter folder, run dir or checkpoint>",
        )


def register_eval_config() -> None:
    """The training schema and this command's (conf/eval.yaml's `eval_schema`) in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    register_configs()
    ConfigStore.instance().store(name="eval_schema", node=EvalCommandConfig)


def resolve_eval(
    cfg: EvalCommandConfig, out_dir: Path, policy: TrainedPolicy | None, *, model_path: str | None = None
) -> EvalCommandConfig:
    """The eval command's config resolved as a run's (so every model/cluster/eval key means what it means in a
    run), with the LoRA slots sized for the trained adapter `cfg.adapter` names (rl.loop.checkpoint.find_policy), pass_k
    holding 1 and n_samples (avg@n and pass@n), and the per-sample files in `out_dir`."""
    cfg = resolve(cfg, out_dir, model_path=model_path, new_run=False)
    model = cfg.model
    if policy is not None and policy.adapter is not None:
        adapter_config = json.loads((policy.adapter / "adapter_config.json").read_text())
        model = replace(
            model,
            lora_rank=max(model.lora_rank, int(adapter_config.get("r", 0))),
            full_finetune=bool(adapter_config.get("full_weights")),
        )
    n = cfg.eval.n_samples
    evaluation = replace(cfg.eval, pass_k=sorted({1, *cfg.eval.pass_k, *([n] if n else [])}), save_dir=str(out_dir))
    return replace(cfg, model=model, eval=evaluation, compare_base=cfg.compare_base or policy is None)


def compose(argv: list[str]) -> tuple[Any, EvalCommandConfig]:
    """(the composed DictConfig, its typed and checked form); a bad key or value exits with one line."""
    register_eval_config()
    return compose_checked(CONF_DIR, "eval", argv, EvalCommandConfig)


def select_items(items: list[dict], only: Sequence[str], size: int) -> list[dict]:
    """The env's eval items of the named sets `only` (all when empty), capped at `size`; an unknown name fails
    with the names there are."""
    if only:
        names = {it.get("metadata", {}).get("eval_set") for it in items} - {None}
        missing = [n for n in only if n not in names]
        if missing:
            there = ", ".join(sorted(names)) or "none (this env's held-out items carry no set name)"
            raise ConfigError(f"eval_only={list(only)}: no eval set named {', '.join(missing)}; the env has: {there}")
        items = [it for it in items if it.get("metadata", {}).get("eval_set") in only]
    return items[:size]


def policy_config(cfg: EvalCommandConfig, policy: TrainedPolicy) -> EvalCommandConfig:
    """The config the trained policy's engine is built from: `cfg` for an adapter (loaded into the base's engine),
    else the HF model folder as the weights the engine loads (model.actor_path, which resolve filled with the base's
    path and the engines read first) and as model.path."""
    if policy.model is None:
        return cfg
    return replace(cfg, model=replace(cfg.model, path=str(policy.model), actor_path=str(policy.model)))


def evaluate_policies(
    cfg: EvalCommandConfig, policy: TrainedPolicy | None, env: Any, reward_fn: Any
) -> dict[str, dict[str, float]]:
    """{label: metrics} for the base model (`base`) and the trained policy (`trained`), each on the same prompts,
    one engine at a time (an HF model folder needs its own engine; an adapter is loaded into the base's).
    `cfg` is resolve_eval's (its eval.save_dir is the output folder), `policy` what `cfg.adapter` names."""

    from transformers import AutoTokenizer

    from rl import logs
    from rl.app import role_envs, rollout_args
    from rl.data.prompts import PromptData
    from rl.loop import evaluation
    from rl.loop.checkpoint import read_adapter
    from rl.rollout import rollout_class
    from rl.runtime.groups import LocalGroup
    from rl.runtime.runtime import Runtime

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    items = select_items(env.eval_items(), cfg.eval_only, cfg.eval.size)
    if not items:
        raise ConfigError(
            "the env gives no eval prompts: a dataset env (env=jsonl, gsm8k, math500) evaluates on "
            "env.eval_sets={name: file} or env.eval_holdout=N training items"
        )
    data = PromptData(items, tokenizer, cfg.model, seed=cfg.run.seed)
    if len(data) == 0:
        raise ConfigError(
            f"no eval prompts left: all {data.dropped} are longer than model.max_prompt_tokens="
            f"{cfg.model.max_prompt_tokens}: raise model.max_prompt_tokens"
        )
    out_dir, results = Path(cfg.eval.save_dir), {}
    # (label, the config its engine is built from): the trained policy's differs only in model.path (an HF folder)
    runs: list[tuple[str, EvalCommandConfig]] = [("base", cfg)] if cfg.compare_base else []
    if policy is not None:
        trained = policy_config(cfg, policy)
        if runs and trained == cfg:
            runs[0] = ("base+trained", cfg)  # one engine: the base first, then the adapter loaded into it
        else:
            runs.append(("trained", trained))
    os.environ.update(role_envs(cfg)["actor"])  # the engine's environment, as a run's actor gets it (CPU cores)
    # the engine's own output (vLLM's configuration and notices, its processes') goes to a file, as a run's actor's
    log = None if cfg.run.verbose else out_dir / "logs" / "engine.log"
    for name, engine_cfg in runs:
        with logs.output_to(log):
            engine = rollout_class(engine_cfg.cluster.rollout_backend)(**rollout_args(engine_cfg))
        # a CPU engine's core runs in this process (process_env.actor_env): its later INFO lines (prefix-cache resets
        # after an adapter load) would reach the console; its warnings still do
        logs.quiet_console(logging.getLogger("vllm"), cfg.run.verbose)
        runtime = Runtime(
            LocalGroup([engine]), LocalGroup([]), engine_cfg.cluster, episodes=engine_cfg.episodes is not None
        )
        evaluate = functools.partial(
            evaluation.evaluate,
            greedy=cfg.sampling_for("greedy"),
            sampled=cfg.sampling_for("eval"),
            seed=cfg.run.seed,
        )
        try:
            for label in name.split("+"):
                if label == "trained" and policy.adapter is not None:
                    engine.load_adapter(read_adapter(policy.adapter, version=1))
                    runtime.version = 1  # the version every later sample must carry
                t0 = time.perf_counter()
                path = out_dir / f"{label}.jsonl"
                results[label] = evaluate(runtime, data, reward_fn, cfg.eval, 0, path=path)
                print(f"{label}: {len(data)} prompts in {time.perf_counter() - t0:.0f} s -> {path}", flush=True)
        finally:
            with logs.output_to(log):
                runtime.close()
    if log is not None:
        print(f"engine log: {log}", flush=True)
    return results


def metric_rows(results: dict[str, dict[str, float]], n_samples: int) -> list[tuple[str, str, str]]:
    """(set, metric name as shown, metrics key) for every metric the results hold, overall first: greedy accuracy,
    avg@n (= pass@1: mean correctness over the n samples), pass@k for k > 1."""
    keys = set().union(*(r.keys() for r in results.values()))
    sets = [""] + sorted({k.split("/")[1] + "/" for k in keys if k.count("/") == 2})
    rows = []
    for prefix in sets:
        name = prefix.rstrip("/") or "all"
        rows.append((name, "greedy accuracy", f"eval/{prefix}accuracy"))
        ks = sorted(int(k.rsplit("@", 1)[1]) for k in keys if k.startswith(f"eval/{prefix}pass@"))
        for k in ks:
            shown = f"avg@{n_samples} (pass@1)" if k == 1 else f"pass@{k}"
            rows.append((name, shown, f"eval/{prefix}pass@{k}"))
    return rows


def format_table(results: dict[str, dict[str, float]], n_samples: int) -> str:
    """A plain-text table, one column per policy and, with both, the trained minus base difference."""
    labels = list(results)
    header = ["eval set", "metric", *labels] + (["delta"] if labels == ["base", "trained"] else [])
    lines = []
    for name, shown, key in metric_rows(results, n_samples):
        vals = [results[lb].get(key) for lb in labels]
        cells = [name, shown, *(f"{v:.3f}" if v is not None else "-" for v in vals)]
        if len(header) > len(cells):
            cells.append(f"{vals[1] - vals[0]:+.3f}" if None not in vals else "-")
        lines.append(cells)
    widths = [max(len(str(r[i])) for r in [header, *lines]) for i in range(len(header))]

    def fmt(row: list) -> str:  # names left-aligned, numbers right-aligned
        return "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, lines)])


def write_results(
    cfg: EvalCommandConfig,
    results: dict[str, dict[str, float]],
    table: str,
    argv: list[str],
    *,
    policy: TrainedPolicy | None = None,
) -> Path:
    """<eval.save_dir>/results.json (resolve_eval's output folder): the command, the base model, the trained `policy`
    evaluated (None: the base only), the metrics per policy and the table; written whole or not at all."""
    from rl.atomic import replace_when_done, write_bytes

    doc = {
        "command": "python -m rl.tools.eval " + " ".join(argv),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "model": cfg.model.path,
        "policy": policy.describe() if policy else None,
        "n_samples": cfg.eval.n_samples,
        "metrics": results,
        "table": table,
    }
    path = Path(cfg.eval.save_dir) / "results.json"
    with replace_when_done(path) as tmp:
        write_bytes(tmp, json.dumps(doc, indent=2, default=str).encode())
    return path


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    dcfg, composed = compose(argv)
    from rl.loop.checkpoint import find_policy  # imports torch: after the config is known to be valid

    out_dir = Path(composed.eval_out or f"outputs/eval/{dt.datetime.now():%Y-%m-%d/%H-%M-%S}")
    try:
        policy = find_policy(composed.adapter) if composed.adapter is not None else None
        cfg = resolve_eval(composed, out_dir, policy)
    except ConfigError as e:
        fail(str(e))
    env, reward = build_target(dcfg.env, "env"), build_target(dcfg.reward, "reward")
    held = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if held:  # an earlier evaluation's results.json, or someone's own files: never replaced
        fail(
            f"eval_out={out_dir} holds files already ({first_names(held)}): an evaluation writes results.json and "
            "one jsonl per policy only into a new or empty folder; give another eval_out"
        )
    writable_folder(out_dir, "eval_out")  # before an engine starts: results.json and the per-sample files go there
    print(f"model: {cfg.model.path}" + (f"\ntrained: {policy.describe()}" if policy else ""), flush=True)
    try:
        results = evaluate_policies(cfg, policy, env, reward)
    except ConfigError as e:
        fail(str(e))
    table = format_table(results, cfg.eval.n_samples)
    print(f"\n{table}\n", flush=True)
    print(f"results: {write_results(cfg, results, table, argv, policy=policy)}", flush=True)
    return 0


if __name__ == "__main__":  # vLLM spawns processes: keep this guard
    sys.exit(main(sys.argv[1:]))
