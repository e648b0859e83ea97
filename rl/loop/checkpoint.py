"""Checkpoints: everything a run needs to continue exactly where it stopped, written so that a crash never
leaves a checkpoint that looks complete but is not; the run's result (adapter or full model) in the formats
other tools load; and finding a trained policy in any of these layouts again (`find_policy`, python -m rl.tools.eval).
A run writes one every `checkpoint.interval` steps and after its last, keeps the `checkpoint.keep_last` newest, and
`run.resume=auto` continues from the latest:

    <run_dir>/checkpoints/step_0003/
        adapter/            adapter_config.json + adapter_model.safetensors (PEFT format: PeftModel.from_pretrained,
                            vLLM's LoRA loader)
        learner.pkl         the learner's state (Learner.state_dict): AdamW state, version, torch RNG
        trainer.pkl         step, adapter version, data order and cursor, the driver's RNG (python, numpy, torch),
                            each HF rollout actor's sampling RNG
        config.json         the resolved config of the run that wrote it
        meta.json           step and adapter version, for people; the size of every other file (written last)

Atomic: a checkpoint is written under `.step_0003.tmp`, every file and the folder are fsynced, then the folder
is renamed to `step_0003` and the parent fsynced. Only `step_N` folders are ever read, so a run killed mid-write
leaves a temp folder that is ignored (and removed by the next save).
Whole: a `step_N` folder counts as a checkpoint only when its meta.json reads and every file it lists has the size
it lists (a meta.json without that list: the five files are there and none is empty), so a folder damaged after
the rename (a copy cut short, a full disk, a hand edit) is never resumed from: `run.resume=auto` falls back to the
newest whole one and says so, and a checkpoint that passes this check but cannot be unpickled stops the resume
with one line naming it (`load`).

Not restored, by design or because there is nothing to restore:
- vLLM's sampler: its generator cannot be read or set from outside, and nothing needs it: every training prompt's
  request carries its own seed, derived from the run seed and the prompt's draw number (rl/seeds.py prompt_seed),
  and a resumed run draws the same prompts from the saved data position, so it samples what the uninterrupted
  run sampled (tests/integration/test_reproducible.py). The hf backend's generator (used for unseeded calls) is
  saved.
- no LR scheduler exists (the learning rate is constant). With `cluster.staleness` > 0, generations still in
  flight at a checkpoint are not saved: the data position saved is the one before them (rl/loop/sampler.py), so a
  resumed run generates those prompts again with the checkpoint's adapter.

The .pkl files are pickles of plain data (bytes, ints, lists): load checkpoints only from runs you trust.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl.atomic import fsync_dir, replace_when_done, write_bytes
from rl.config.schema import ConfigError
from rl.run_files import DamagedFile, json_lines, read_summary
from rl.runtime.roles import Learner, RolloutActor
from rl.runtime.runtime import Runtime
from rl.types import Adapter, TrainedPolicy

CHECKPOINTS = "checkpoints"
SUMMARY = "summary.json"  # a run's summary, written by train.py when the run has finished; it holds STEPS_DONE
STEPS_DONE = "run/steps"  # the summary's count of the steps the finished run trained
META = "meta.json"
# what every checkpoint holds besides meta.json (whose "files" lists each one's size)
FILES = (
    "adapter/adapter_config.json",
    "adapter/adapter_model.safetensors",
    "learner.pkl",
    "trainer.pkl",
    "config.json",
)
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:04d}"


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """Every `step_N` folder of a run, whole or not, oldest first, as (step, folder). Temp folders are never listed."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def damage(folder: Path) -> str | None:
    """Why the checkpoint `folder` is not whole (a few words naming the file), None when it is: meta.json reads and
    each file it lists has its size; a meta.json without that list asks only that each of FILES is there and not
    empty."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / META).read_bytes())
    except FileNotFoundError:
        return f"no {META}"
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return f"{META} does not read: {type(e).__name__}"
    sizes = meta.get("files", dict.fromkeys(FILES)) if isinstance(meta, dict) else None
    if not isinstance(sizes, dict) or any(not isinstance(n, str) for n in sizes):
        return f"{META} is not a checkpoint's"
    for name in FILES:
        if name not in sizes:
            return f"{META} lists no {name}"
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        actual = path.stat().st_size
        if size is None and actual == 0:
            return f"{name} is empty"
        if size is not None and actual != size:
            return f"{name} has {actual} bytes, {META} says {size}"
    return None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Whole checkpoints of a run (`damage` finds nothing), oldest first, as (step, folder)."""
    return [(step, p) for step, p in step_dirs(run_dir) if damage(p) is None]


def latest(run_dir: Path) -> Path | None:
    """The newest whole checkpoint of a run, None when it has none."""
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1][1] if ckpts else None


def resume_point(resume: str | None, run_dir: Path) -> tuple[Path | None, str | None]:
    """(the checkpoint `run.resume` names, the line that says which newer ones were passed over as damaged, or None).
    None: start fresh; "auto": the newest whole checkpoint in run_dir (None when it holds no step_N folder; an error
    naming the newest damaged one when none is whole); a path: that checkpoint folder (an error naming run.resume if
    it is not one, or not whole)."""
    if resume is None:
        return None, None
    if resume != "auto":
        path = Path(resume)
        if not (path / "trainer.pkl").is_file() and not (path / META).is_file():
            raise ConfigError(
                f"run.resume={resume}: not a checkpoint folder (no trainer.pkl); give a <run>/checkpoints/step_N "
                "folder or run.resume=auto"
            )
        if (why := damage(path)) is not None:
            raise ConfigError(f"run.resume={resume}: this checkpoint is damaged ({why}); give a whole one")
        return path, None
    passed: list[str] = []
    for _, path in reversed(step_dirs(run_dir)):
        why = damage(path)
        if why is None:
            note = f"run.resume=auto: {'; '.join(passed)}: resuming from {path.name}, the newest whole checkpoint"
            return path, note if passed else None
        passed.append(f"{path} is damaged ({why})")
    if passed:
        raise ConfigError(
            f"run.resume=auto: {Path(run_dir) / CHECKPOINTS} holds no whole checkpoint: {passed[0]}; move the damaged "
            "folders out of it to start the run over at step 1, or resume another run's checkpoint (run.resume=<path>)"
        )
    return None, None


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """`resume_point`'s checkpoint, its line about damaged checkpoints printed."""
    path, note = resume_point(resume, run_dir)
    if note is not None:
        print(note, flush=True)
    return path


def finished_summary(resume: str | None, run_dir: Path, steps: int) -> dict | None:
    """The summary of the run in `run_dir` when `resume` would continue it but it has trained its `steps` already
    and finished (its summary is written), with or without checkpoints: nothing is left to do. None otherwise, also
    when the last checkpoint holds the last step but the run stopped before its final evaluation and export, which a
    resume then does. A damaged summary, or a finished run asked for more steps that holds no checkpoint to continue
    from, is an error: starting over would overwrite the finished run's metrics, result and summary."""
    if resume is None:
        return None
    ckpt, _ = resume_point(resume, run_dir)
    try:
        summary = read_summary(Path(run_dir) / SUMMARY)
    except DamagedFile as e:
        raise ConfigError(
            f"{e}: it cannot tell whether the run finished; move it out of {run_dir} to resume the run from its last "
            "checkpoint"
        ) from None
    if summary is None:
        return None
    if resume != "auto":  # a given checkpoint continues this run only when it holds its last step
        m = _STEP_DIR.match(ckpt.name) if ckpt is not None else None
        return summary if m is not None and int(m.group(1)) >= steps else None
    done = summary.get(STEPS_DONE)
    if not isinstance(done, int):  # a summary without the count: the finished run's last checkpoint or logged step
        m = _STEP_DIR.match(ckpt.name) if ckpt is not None else None
        saved = int(m.group(1)) if m is not None else 0
        done = max(saved, last_logged_step(Path(run_dir) / "metrics.jsonl"))
    if done >= steps:
        return summary
    if ckpt is None:
        raise ConfigError(
            f"run.resume=auto: {run_dir} finished {done} steps and holds no checkpoint to continue from "
            f"(checkpoint.interval); to train run.steps={steps}, start a new run in another run.output_dir"
        )
    return None


def last_logged_step(metrics: Path) -> int:
    """The highest step a metrics.jsonl holds a row of (0 without one)."""
    rows = json_lines(metrics) if metrics.is_file() else []
    return max((r["step"] for _, r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)), default=0)


def rng_state() -> dict[str, Any]:
    """This process's python, numpy and torch (CPU, and CUDA when present) generator states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state().numpy()}
    if torch.cuda.is_available():
        state["cuda"] = [s.numpy() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(torch.from_numpy(np.array(state["torch"])))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.from_numpy(np.array(s)) for s in state["cuda"]])


def save(
    run_dir: Path,
    step: int,
    *,
    learner_state: dict[str, Any],
    trainer_state: dict[str, Any],
    config: dict | None = None,
    keep_last: int = 0,
) -> Path:
    """Write checkpoint `step` atomically, then delete all but the `keep_last` newest whole ones (checkpoint.keep_last;
    0 keeps all; a damaged one is left for its owner to look at, and a save of its step replaces it).

    learner_state: Learner.state_dict() (its "adapter" goes to the PEFT folder, the rest to learner.pkl)."""
    root = Path(run_dir) / CHECKPOINTS
    adapter: Adapter = learner_state["adapter"]
    rest = {k: v for k, v in learner_state.items() if k != "adapter"}
    meta = {
        "step": step,
        "adapter_version": adapter.version,
        "data_cursor": trainer_state.get("data", {}).get("cursor"),
    }
    # a re-save of the same step (e.g. a resumed run that had nothing left to do) replaces it
    with replace_when_done(root / step_dir_name(step), durable=True) as tmp:
        write_adapter(adapter, tmp / "adapter", durable=True)
        write_bytes(tmp / "learner.pkl", pickle.dumps({**rest, "adapter_version": adapter.version}), durable=True)
        write_bytes(tmp / "trainer.pkl", pickle.dumps(trainer_state), durable=True)
        write_bytes(tmp / "config.json", json.dumps(config or {}, indent=2, default=str).encode(), durable=True)
        meta["files"] = {name: (tmp / name).stat().st_size for name in FILES}
        write_bytes(tmp / META, json.dumps(meta, indent=2).encode(), durable=True)  # last: it vouches for the rest
        fsync_dir(tmp / "adapter")
    if keep_last > 0:
        for _, old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".step_*.tmp"):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    return root / step_dir_name(step)


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer_state, learner_state) of a checkpoint folder; learner_state as Learner.load_state takes it. A file
    that does not read back (its sizes right, its bytes not) is a ConfigError naming the folder."""
    path = Path(path)
    name = "trainer.pkl"
    try:
        trainer_state = pickle.loads((path / name).read_bytes())
        name = "learner.pkl"
        learner = pickle.loads((path / name).read_bytes())
        name = "adapter"
        learner["adapter"] = read_adapter(path / name, version=learner.pop("adapter_version"))
        if not isinstance(trainer_state, dict) or "step" not in trainer_state:
            name = "trainer.pkl"
            raise ValueError("not a trainer state")
    except Exception as e:  # noqa: BLE001 - unpickling damaged bytes raises almost anything
        raise ConfigError(
            f"checkpoint {path} is damaged ({name}: {type(e).__name__}: {str(e)[:200]}); move it out of {path.parent} "
            "to resume from the one before it"
        ) from None
    return trainer_state, learner


# ------------------------------------------------------------------------------------------------ a run's roles


def save_run(
    run_dir: Path, step: int, runtime: Runtime, data: Any, *, keep_last: int = 0, config: dict | None = None
) -> Path:
    """Checkpoint a run after `step`: learner 0's state (learners step together, so one is enough), the data
    position (`data`: rl.loop.sampler.Sampler or rl.data.prompts.PromptData), and every RNG the next step draws from: the
    driver's and each rollout actor's (vLLM's cannot be read, see the module docstring)."""
    trainer_state = {
        "step": step,
        "adapter_version": runtime.version,
        "data": data.state_dict(),
        "rng": rng_state(),
        "rollout": rollout_states(runtime),
    }
    learner_state = runtime.learners.call(Learner.state_dict, [()])[0]
    return save(
        run_dir, step, learner_state=learner_state, trainer_state=trainer_state, config=config, keep_last=keep_last
    )


def restore_run(path: Path, runtime: Runtime, data: Any) -> int:
    """Load a checkpoint into a run's roles: the learner state on every learner, its adapter pushed to the actors
    (the versions continue), then the data order and the RNG states (last: the sync itself draws random numbers).
    Returns the checkpoint's step."""
    trainer_state, learner_state = load(path)
    runtime.learners.broadcast(Learner.load_state, learner_state)
    runtime.sync()
    data.load_state(trainer_state["data"])
    states = trainer_state.get("rollout")
    if states is not None and len(states) == len(runtime.actors):
        runtime.actors.call(RolloutActor.load_state, [(s,) for s in states])
    set_rng_state(trainer_state["rng"])
    step = trainer_state["step"]
    print(f"resumed from {path}: step {step}, adapter version {runtime.version}, data cursor {data.cursor}", flush=True)
    return step


def rollout_states(runtime: Runtime) -> list[dict]:
    """Each actor's sampling RNG (empty for engines whose RNG no sample depends on: vLLM's)."""
    return runtime.actors.broadcast(RolloutActor.state_dict)


# ------------------------------------------------------------------------------------------------ a run's result


def write_adapter(adapter: Adapter, folder: Path, *, durable: bool = False) -> None:
    """An adapter in PEFT format (PeftModel.from_pretrained and vLLM's LoRA loader read it) into a new folder."""
    folder.mkdir(parents=True)
    config = json.dumps(adapter.config, indent=2, default=str).encode()
    write_bytes(folder / "adapter_config.json", config, durable=durable)
    write_bytes(folder / "adapter_model.safetensors", adapter.weights, durable=durable)


def export_result(result: Adapter, run_dir: Path, source: Path) -> Path:
    """The trained policy in <run dir>: `adapter/` (PEFT format), or with full fine-tuning `model/`, an HF model
    folder (from_pretrained / vLLM load it) with the source folder's config, generation config and tokenizer
    files next to the trained weights. Written under a temporary name, then renamed (rl/atomic.py)."""
    if not result.config.get("full_weights"):
        with replace_when_done(Path(run_dir) / "adapter") as tmp:
            write_adapter(result, tmp)
        return Path(run_dir) / "adapter"
    with replace_when_done(Path(run_dir) / "model") as tmp:
        tmp.mkdir(parents=True)
        for f in Path(source).iterdir():
            if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json", ".gguf")):
                shutil.copy2(f, tmp / f.name)
        write_bytes(tmp / "model.safetensors", result.weights)
    return Path(run_dir) / "model"


# ------------------------------------------------------------------------------------------------ reading a policy back


def find_policy(path: str | Path, key: str = "adapter") -> TrainedPolicy:
    """What a path holds, in this order: an adapter folder (adapter_config.json), a checkpoint (checkpoints/step_N:
    trainer.pkl + adapter/), a run directory (its result export adapter/ or model/, else its latest checkpoint) or
    an HF model folder (config.json). Anything else is a ConfigError naming `key` and the four layouts."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(
            f"{key}={path}: no such file or folder; give an adapter folder, a run directory or a checkpoint"
        )
    if (p / "adapter_config.json").is_file():
        return TrainedPolicy("adapter", adapter=p)
    if (p / "trainer.pkl").is_file() and (p / "adapter" / "adapter_config.json").is_file():
        if (why := damage(p)) is not None:
            raise ConfigError(f"{key}={path}: this checkpoint is damaged ({why}); give a whole one")
        return TrainedPolicy("checkpoint", adapter=p / "adapter")
    if (p / "adapter" / "adapter_config.json").is_file():
        return TrainedPolicy("run", adapter=p / "adapter")
    if (p / "model" / "config.json").is_file():
        return TrainedPolicy("run", model=p / "model")
    if (ckpt := latest(p)) is not None and (ckpt / "adapter" / "adapter_config.json").is_file():
        return TrainedPolicy("run", adapter=ckpt / "adapter")  # a run stopped before its result export
    if (p / "config.json").is_file():
        return TrainedPolicy("model", model=p)
    raise ConfigError(
        f"{key}={path}: not an adapter folder (adapter_config.json), a run directory (adapter/, model/ or "
        "checkpoints/step_N), a checkpoint (checkpoints/step_N with trainer.pkl) or an HF model folder (config.json)"
    )


def read_adapter(folder: Path, version: int = 1) -> Adapter:
    """A PEFT-format adapter folder (write_adapter's, or PEFT's save_pretrained) as the bytes an engine loads."""
    return Adapter.from_folder(folder, version)
