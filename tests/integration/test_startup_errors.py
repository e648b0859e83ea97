"""Start-up failures, provoked for real through train.py: each ends with one line on stderr naming the cause, the
config key and the value to set (exit 1), no traceback from the driver, and the full traceback (the role's and
vLLM's engine output included) in the run's train.log."""

from __future__ import annotations

import re
import shutil

import pytest

from rl.preflight import memory
from tests.helpers import run_train, tiny_args

SMALL_RUN = [
    "run.steps=1",
    "run.prompts_per_step=2",
    "algorithm.group_size=4",
    "eval.size=0",
    "model.max_new_tokens=16",
]


def last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]  # Ray streams the actors' own output above it


def assert_no_driver_traceback(proc) -> None:
    """Tracebacks on the console come only from the actors' streamed output (prefixed with their pid), none from
    the driver (Hydra's "Error executing job" and the driver's own chain)."""
    assert "Error executing job" not in proc.stderr
    driver = [x for x in proc.stderr.splitlines() if "Traceback" in x and "pid=" not in x]
    assert driver == [], proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.tier2
def test_kv_cache_share_too_small_on_cpu(tiny_model, tmp_path):
    """cluster.gpu_memory_utilization=0.01 of a NUMA node leaves vLLM's CPU worker no KV cache once its process
    holds the libraries and weights (what bench.e2e_trl's fixed 0.05 did on this machine)."""
    proc = run_train(
        [
            *tiny_args(tiny_model, in_process=False),
            f"run.output_dir={tmp_path / 'run'}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
            "cluster=1a1l",
            "cluster.gpu_memory_utilization=0.01",
            *SMALL_RUN,
        ],
        timeout=400,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    m = re.fullmatch(
        r"error: rollout actor 0 failed to start: no memory left for vLLM's KV cache: "
        r"cluster\.gpu_memory_utilization=0\.01 gives the engine ([\d.]+) GiB of NUMA node (\d+)'s ([\d.]+) GiB and "
        r"the engine already uses ([\d.]+) GiB without it \(vLLM: (-?[\d.]+) GiB left for the KV cache\); set "
        r"cluster\.gpu_memory_utilization=([\d.]+) \(8 sequences of 272 tokens at once\)",
        last_line(proc),
    )
    assert m, last_line(proc)
    total, used, suggested = float(m.group(3)), float(m.group(4)), float(m.group(6))
    assert suggested * total >= 1.1 * used  # the suggested share holds the engine, with room for its KV cache
    assert suggested == memory.vllm_cpu_fraction(used * 2**30, 8 * 272 * 2 * 2 * 64 * 4, total * 2**30)
    assert_no_driver_traceback(proc)
    log = (tmp_path / "hydra" / "train.log").read_text()
    assert "rl.errors.RoleStartFailed: rollout actor 0 failed to start: ValueError: Available memory" in log
    # the engine's own traceback: on CPU the engine core runs in the actor's process (rl/runtime/process_env.py actor_env), so the
    # worker's frames are in the role's traceback; a separate engine process's would come as "vLLM engine output"
    assert "cpu_worker.py" in log


@pytest.mark.slow
def test_placement_that_cannot_fit_the_local_ray(tiny_model, tmp_path):
    """STRICT_SPREAD wants a node per role; a local Ray has one: Ray calls it infeasible and the run stops at once."""
    proc = run_train(
        [
            *tiny_args(tiny_model, in_process=False),
            f"run.output_dir={tmp_path / 'run'}",
            "cluster=1a1l",
            "cluster.placement_strategy=STRICT_SPREAD",
            *SMALL_RUN,
        ],
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.fullmatch(
        r"error: Ray cannot place the roles \(Ray: INFEASIBLE\): they ask 2 bundles \{CPU: 1\} \{CPU: 1\} with "
        r"cluster\.placement_strategy=STRICT_SPREAD; the Ray cluster has 1 node\(s\): \{CPU: \d+\}; STRICT_SPREAD puts "
        r"every role on its own node and 2 roles need 2 nodes: set cluster\.placement_strategy=PACK \(or SPREAD\), or "
        r"add nodes",
        last_line(proc),
    ), proc.stderr[-3000:]
    assert_no_driver_traceback(proc)


@pytest.mark.slow
@pytest.mark.parametrize("missing", ["weights", "tokenizer"])
def test_bad_model_folder(tiny_model, tmp_path, missing):
    """A folder with a config.json (so model.path passes the config check) but no weights, or no tokenizer."""
    folder = tmp_path / f"no-{missing}"
    folder.mkdir()
    tokenizer = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    keep = {"weights": ("config.json", *tokenizer), "tokenizer": ("config.json",)}
    for name in keep[missing] + (("model.safetensors",) if missing == "tokenizer" else ()):
        shutil.copy(tiny_model / name, folder / name)
    proc = run_train(
        [*tiny_args(folder), f"run.output_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}", *SMALL_RUN],
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    who = "learner 0 failed to start" if missing == "weights" else "the tokenizer did not load"
    line = last_line(proc)
    assert line.startswith(f"error: {who}: could not load the model at model.path={folder} ("), line
    assert line.endswith(
        "): give a Hugging Face model folder with config.json, tokenizer files and *.safetensors weights, a hub id "
        "in the local cache, or embedded:smollm2-135m-instruct"
    )
    assert len(proc.stderr.strip().splitlines()) == 1  # cluster.mode=local: no actor output, only the one line
    assert "Traceback" in (tmp_path / "hydra" / "train.log").read_text()
