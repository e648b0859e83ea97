"""The quiet console (rl/logs.py): a role's output goes to its own file, the driver shows the roles' warnings and
errors prefixed with the role (no colour codes, no INFO chatter), everything with verbose; and the switches of
`deterministic=true` reach the roles' environments."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rl import logs
from tests.helpers import REPO, repo_env, run_spec

VLLM_INFO = "(EngineCore pid=13997) INFO 12-01 10:29:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0)"
VLLM_WARNING = "\x1b[33m(MainProcess pid=1) WARNING 12-01 10:28:32 [cpu.py:224] Triton is not installed.\x1b[0m"
TRACEBACK = [
    "(EngineCore pid=2) ERROR 12-01 05:28:44 [core.py:1] EngineCore failed to start.",
    "Traceback (most recent call last):",
    '  File "cpu_worker.py", line 12, in determine_available_memory',
    "    raise ValueError(msg)",
    "ValueError: Available memory on node 0 is less than requested",
    "after the traceback: an ordinary line",
]


def test_only_warnings_and_errors_are_shown_unless_verbose():
    assert not logs.shown(VLLM_INFO, verbose=False) and logs.shown(VLLM_INFO, verbose=True)
    assert logs.shown(logs.ANSI.sub("", VLLM_WARNING), verbose=False)
    assert logs.shown("/x/dispatcher.py:138: FutureWarning: `reduce_op` is deprecated", verbose=False)
    assert logs.shown("[W1201 10:30:26.167003747 utils.cpp:68] Warning: NUMA binding", verbose=False)
    assert not logs.shown("Loading safetensors checkpoint shards: 100% Completed | 1/1", verbose=False)
    assert not logs.shown("", verbose=False)


def test_follower_prints_new_warnings_of_each_role_with_its_prefix(tmp_path):
    actor = tmp_path / "actor0.log"
    actor.write_text(VLLM_WARNING + "\n")  # start-up output, there before start(): not shown
    (tmp_path / "driver.log").write_text("")
    out = io.StringIO()
    follower = logs.LogFollower(tmp_path, verbose=False, interval_s=60, out=out).start()
    with actor.open("a") as f:
        f.write(VLLM_INFO + "\n" + VLLM_WARNING + "\n" + "\n".join(TRACEBACK) + "\n" + "partial line")
    (tmp_path / "learner0.log").write_text("WARNING a learner's warning\nINFO a learner's info\n")
    with (tmp_path / "driver.log").open("a") as f:  # the driver's own records are not echoed
        f.write("[rl.runtime.placement][WARNING] - x\n")
    follower.stop()  # the last poll happens here
    assert out.getvalue().splitlines() == [
        "[actor0] (MainProcess pid=1) WARNING 12-01 10:28:32 [cpu.py:224] Triton is not installed.",
        *[f"[actor0] {line}" for line in TRACEBACK[:-1]],  # the whole traceback, not the line after it
        "[learner0] WARNING a learner's warning",
    ]
    assert "\x1b" not in out.getvalue()


def test_verbose_follower_shows_every_line(tmp_path):
    out = io.StringIO()
    follower = logs.LogFollower(tmp_path, verbose=True, interval_s=60, out=out).start()
    (tmp_path / "actor0.log").write_text(VLLM_INFO + "\nLoading weights\n")
    follower.stop()
    assert out.getvalue().splitlines() == [f"[actor0] {VLLM_INFO}", "[actor0] Loading weights"]


def test_a_role_process_sends_its_output_and_its_children_to_its_log_file(tmp_path):
    """rl/__init__.py redirects file descriptors 1 and 2, so a process the role starts (vLLM's engine core) writes
    there too; OutputMark (rl/errors.py) reads what was written after it, once although both descriptors point
    to the file."""
    path = tmp_path / "logs" / "actor0.log"
    code = (
        "import rl, subprocess, sys\n"
        "from rl.errors import OutputMark\n"
        "print('before the mark')\n"
        "mark = OutputMark()\n"
        "print('to stdout'); print('to stderr', file=sys.stderr)\n"
        "subprocess.run([sys.executable, '-c', 'print(\"from a child\")'], check=True)\n"
        "sys.__stdout__.flush()\n"
        "open(sys.argv[1], 'w').write(mark.read())\n"
    )
    read = tmp_path / "read.txt"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(read)],
        cwd=REPO,
        env=repo_env(**logs.role_log_env(tmp_path / "logs", "actor", 0)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr
    assert path.read_text().splitlines() == ["before the mark", "to stdout", "to stderr", "from a child"]
    assert read.read_text().splitlines() == ["to stdout", "to stderr", "from a child"]


def test_deterministic_reaches_the_learner_and_gpu_engines(tiny_model, monkeypatch):
    from rl.app import role_envs

    def actor_env(cfg):
        return role_envs(cfg)["actor"]

    def learner_env(cfg):
        return role_envs(cfg)["learner"]

    # actor_env passes the driver's VLLM_* on; tests that run an engine in this process (local mode, rl.tools.eval) set some
    for key in [k for k in os.environ if k.startswith("VLLM_")]:
        monkeypatch.delenv(key)
    on = run_spec(tiny_model, "run.deterministic=true")
    off = run_spec(tiny_model)
    assert on.run.deterministic and not off.run.deterministic
    assert learner_env(on)["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in learner_env(off)
    assert "VLLM_BATCH_INVARIANT" not in actor_env(on)  # CPU: vLLM's CPU build has no such mode
    gpu = run_spec(tiny_model, "run.deterministic=true", "cluster.use_gpu=true")
    assert actor_env(gpu)["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in actor_env(run_spec(tiny_model, "cluster.use_gpu=true"))
    # CPU: the engine core in the actor's process, so a generate's batches follow from its prompts, not from timing
    assert actor_env(off)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in actor_env(gpu)
    assert on.log_dir.name == "logs" and not on.run.verbose


def test_vllms_lora_tokenizer_notice_is_dropped_at_its_logger():
    """vLLM warns at a native-LoRA engine's first LoRARequest that per-adapter tokenizers are deprecated, though ours
    carry none: VLLMRollout drops that one line at the logger vLLM emits it from, and nothing else."""
    import logging

    from vllm.v1.engine import input_processor

    from rl.rollout.vllm import quiet_lora_tokenizer_notice

    logger = input_processor.logger
    assert logger.name == "vllm.v1.engine.input_processor"  # the filter sits on the logger that emits the line
    quiet_lora_tokenizer_notice()
    quiet_lora_tokenizer_notice()  # a second engine in the process adds no second filter
    assert len(logger.filters) == 1

    def record(msg: str) -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.WARNING, "input_processor.py", 289, msg, (), None)

    notice = (
        "vLLM has deprecated support for supporting different tokenizers for different LoRAs. By default, vLLM "
        "uses base model's tokenizer."
    )
    assert not logger.filter(record(notice))
    assert logger.filter(record("Got lora_request but LoRA is not enabled!"))
