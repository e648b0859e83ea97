"""Start-up failures in one line: which role failed, its root cause, and the config key (with a value, where one
can be computed) that fixes it. The one place that turns a start-up error into what the user reads.

- The roles raise their own errors. vLLM logs an engine's real error in the engine's processes and raises only
  "Engine core initialization failed. See root cause above." in the role's; `VLLMRollout` therefore reads back
  what those processes wrote (`OutputMark`: a Ray actor's stdout and stderr are one file, `<run dir>/logs/
  actor0.log` (rl/logs.py), which the processes it starts inherit) and raises `EngineStartError` with the root
  cause (`engine_root_cause`).
- rl/runtime/placement.py (Ray actors) and rl/app.py (cluster.mode=local) turn a role's failed constructor into
  `RoleStartFailed(role, cause)`, the cause as one `Type: message` line (`cause_of`; from a Ray actor only the
  text of its traceback arrives); rl/app.py makes it a `StartupError` with `explain(role, cause, spec)`.
- A placement group Ray cannot place is described by `placement_failure` (the resources asked, those the
  cluster has).

train.py prints a `StartupError` as `error: <one line>` (exit 1) and writes the full traceback, the role's
included, to the run's log file (train.log).

Past 400 lines on purpose: each failure kind is one short function beside the vLLM or Ray message it matches, and
they read best side by side, in the order `explain` tries them.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

from rl.errors import UserFacingError

GiB = 1024**3
MODEL_HINT = (
    "give a Hugging Face model folder with config.json, tokenizer files and *.safetensors weights, a hub id in the "
    "local cache, or embedded:smollm2-135m-instruct"
)


class StartupError(UserFacingError):
    """A role or the placement could not start; the message is one line: what, why, and the key that fixes it."""


class EngineStartError(RuntimeError):
    """A vLLM engine did not start; the message is the engine's root cause (`Type: message`), the engine's error
    output follows as a note (it reaches the run's log file with the traceback)."""


class RoleStartFailed(RuntimeError):
    """A role's constructor failed: `role` ("rollout actor 0", "learner 0") and `cause` (one line)."""

    def __init__(self, role: str, cause: str):
        super().__init__(f"{role} failed to start: {cause}")
        self.role, self.cause = role, cause


# ------------------------------------------------------------------------------------------------ the role side


class OutputMark:
    """Where this process's stdout and stderr end now, to read back what this process and the processes it starts
    (which inherit them) write afterwards. Only regular files can be read back: a Ray actor's stdout and stderr
    are (Ray's worker log files); a terminal or a pipe is skipped."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        for fd in (1, 2):
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            # a role's stdout and stderr are one file in the run's logs/ (rl/logs.py): read it once
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                self.marks.append((fd, st.st_size))

    def read(self, limit: int = 2_000_000) -> str:
        """What was written since the mark (at most the last `limit` bytes of each stream)."""
        out = []
        for fd, start in self.marks:
            try:
                with open(f"/proc/self/fd/{fd}", "rb") as f:
                    f.seek(max(start, os.fstat(f.fileno()).st_size - limit))
                    out.append(f.read().decode(errors="replace"))
            except OSError:
                continue
        return "\n".join(out)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# vLLM's log prefix "(Worker pid=1) ERROR 12-01 05:28:44 [file.py:12] " and Ray's "(VLLMRollout pid=1) "
_PREFIX = re.compile(r"^(?:\([\w.-]+ pid=\d+[^)]*\) )*(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?")
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)): (?P<msg>\S.*)$")
_WRAPPERS = ("root cause above", "Worker failed with error", "EngineStartError")


def _clean(line: str) -> str:
    return _PREFIX.sub("", _ANSI.sub("", line)).rstrip()


def engine_root_cause(output: str) -> str | None:
    """The first error of the first traceback in a vLLM engine's output that is not one of vLLM's wrappers
    ("... See root cause above.", "Worker failed with error '...'"), as `Type: message`; None if there is none."""
    seen_traceback = False
    for raw in output.splitlines():
        line = _clean(raw).strip()
        if line.startswith("Traceback (most recent call last)"):
            seen_traceback = True
            continue
        m = _EXC_LINE.match(line)
        if seen_traceback and m and not any(w in line for w in _WRAPPERS):
            return f"{m['type'].rsplit('.', 1)[-1]}: {m['msg']}"
    for raw in output.splitlines():  # vLLM's relay of a worker's error keeps its message (not its type)
        m = re.search(r"Worker failed with error '(.+?)'(?:, please check|$)", _clean(raw))
        if m:
            return m.group(1)
    return None


def engine_error_lines(output: str, limit: int = 120) -> str:
    """The engine's error output (its ERROR log lines and tracebacks), at most `limit` lines, for the run's log."""
    keep, in_tb = [], False
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if "Traceback (most recent call last)" in line:
            in_tb = True
        if in_tb or " ERROR " in line:
            keep.append(line)
        if in_tb and _EXC_LINE.match(_clean(line).strip()):
            in_tb = False
    return "\n".join(keep[-limit:])


def engine_start_error(e: BaseException, output: str) -> EngineStartError:
    """The EngineStartError for an engine constructor's exception `e`, with the root cause from the engine's
    `output` when vLLM only says to look above (else `e` is the cause itself, e.g. a bad config.json)."""
    own = _one_line(e)
    root = engine_root_cause(output) if "root cause above" in own or "initialization failed" in own else None
    err = EngineStartError(root or own)
    lines = engine_error_lines(output)
    if lines:
        err.add_note(f"vLLM engine output (errors):\n{lines}")
    return err


# ------------------------------------------------------------------------------------------------ the driver side


def _one_line(e: BaseException) -> str:
    text = _short(str(e), 400)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _chain(e: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def cause_of(e: BaseException) -> str:
    """What a role's failed constructor raised, as one `Type: message` line. In this process: an EngineStartError
    in the chain, else the exception itself. From a Ray actor (ray.exceptions) only the text of the actor's
    traceback arrives (`cause_from_text`)."""
    for x in _chain(e):
        if isinstance(x, EngineStartError):
            return str(x)
    return cause_from_text(str(e)) if type(e).__module__.startswith("ray.") else _one_line(e)


def cause_from_text(text: str) -> str:
    """The role's error in the text of a traceback (what Ray passes on from an actor): its EngineStartError line,
    else its last `Type: message` line, else the text itself (Ray's words for an actor that died, e.g. of memory)."""
    lines = [_clean(x).strip() for x in text.splitlines()]
    engine = [x for x in lines if re.match(r"^(?:[\w.]+\.)?EngineStartError: ", x)]
    if engine:
        return engine[-1].split("EngineStartError: ", 1)[1]
    found = [m for m in map(_EXC_LINE.match, lines) if m]
    if found:
        return f"{found[-1]['type'].rsplit('.', 1)[-1]}: {found[-1]['msg']}"
    return _short(_ANSI.sub("", text), 400)


def explain(role: str, cause: str, spec: Any, failed: str = "failed to start") -> str:
    """One line for a role that failed to start: `<role> failed to start: <cause>: <the fix>`. `spec` is the
    run's RunSpec (model path, memory settings, the step's size, for the suggested values)."""
    for rule in (_cpu_kv_cache, _cpu_share_not_free, _gpu_share_not_free, _kv_too_small, _cuda_oom, _host_oom,
                 _model_files):  # fmt: skip
        text = rule(cause, spec)
        if text:
            return f"{role} {failed}: {text}"
    if "root cause above" in cause or "initialization failed" in cause:  # no engine output could be read back
        hint = _cpu_kv_hint(spec)
        return (
            f"{role} {failed}: the vLLM engine did not start ({_short(cause)}); its own error is in the engine's "
            f"output above{hint}"
        )
    return f"{role} {failed}: {_short(cause, 400)} (full traceback: the run's train.log)"


def _short(text: str, n: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _kv_need(spec: Any) -> tuple[float, int, int]:
    """(KV bytes, sequences, tokens each) one actor needs to hold the step's sequences at once (0 bytes when the
    model's shape is unknown)."""
    from rl.preflight.plan import DTYPE_BYTES, load_shape

    seqs = math.ceil(spec.sampler.prompts_per_step * spec.sampler.sampling.n / spec.placement.num_actors)
    seq_len = spec.rollout.max_model_len
    try:
        shape, _ = load_shape(spec.model_path)
    except Exception:  # noqa: BLE001 - the suggestion then covers the engine alone
        shape = None
    if shape is None:
        return 0.0, seqs, seq_len
    dtype = spec.rollout.dtype if spec.rollout.dtype != "auto" else shape.dtype
    return float(seqs * seq_len * shape.kv_bytes_per_token(DTYPE_BYTES.get(dtype, 2))), seqs, seq_len


_CPU_KV = re.compile(
    r"Available memory on node (\d+) \(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested "
    r"memory for kv \((-?[\d.]+)/([\d.]+) GiB\)"
)


def _cpu_kv_cache(cause: str, spec: Any) -> str | None:
    """vLLM CPU: the share of the NUMA node minus what the engine already uses leaves no KV cache (or more than
    the node has free)."""
    m = _CPU_KV.search(cause)
    if not m:
        return None
    from rl.preflight.plan import vllm_cpu_fraction

    node, available, total, kv, requested = m.group(1), *map(float, m.groups()[1:])
    used = requested - kv
    f = spec.rollout.gpu_memory_utilization
    need, seqs, seq_len = _kv_need(spec)
    fits = vllm_cpu_fraction(used * GiB, need, total * GiB)
    where = f"cluster.gpu_memory_utilization={f:g} gives the engine {requested:.2f} GiB of NUMA node {node}'s {total:.2f} GiB"
    if kv > available:
        return (
            f"not enough free memory for vLLM's KV cache ({kv:.2f} GiB wanted, {available:.2f} GiB available on "
            f"NUMA node {node}): {where}; free memory (other processes), or set cluster.gpu_memory_utilization="
            f"{fits:g} (the step's {seqs} sequences of {seq_len} tokens at once)"
        )
    return (
        f"no memory left for vLLM's KV cache: {where} and the engine already uses {used:.2f} GiB without it "
        f"(vLLM: {kv:.2f} GiB left for the KV cache); set cluster.gpu_memory_utilization={fits:g} (the step's "
        f"{seqs} sequences of {seq_len} tokens at once)"
    )


_CPU_SHARE = re.compile(
    r"Available memory on node (\d+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired CPU memory "
    r"utilization \(([\d.]+), ([\d.]+) GiB\)"
)


def _cpu_share_not_free(cause: str, spec: Any) -> str | None:
    m = _CPU_SHARE.search(cause)
    if not m:
        return None
    node, available, total, f, requested = m.group(1), *map(float, m.groups()[1:])
    below = math.floor(100 * available / total) / 100
    return (
        f"cluster.gpu_memory_utilization={f:g} asks {requested:.2f} GiB of NUMA node {node}'s {total:.2f} GiB and only "
        f"{available:.2f} GiB is available (vLLM CPU checks this at start); set cluster.gpu_memory_utilization "
        f"below {below:g} (`plan=true` shows what the engine needs) or free memory"
    )


_GPU_SHARE = re.compile(
    r"Free memory on device (\S+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory "
    r"utilization \(([\d.]+), ([\d.]+) GiB\)"
)


def _gpu_share_not_free(cause: str, spec: Any) -> str | None:
    m = _GPU_SHARE.search(cause)
    if not m:
        return None
    device, free, total, f, requested = m.group(1), *map(float, m.groups()[1:])
    below = math.floor(100 * free / total) / 100
    return (
        f"cluster.gpu_memory_utilization={f:g} asks {requested:.2f} GiB of GPU {device} and {free:.2f} of "
        f"{total:.2f} GiB is free (another process, or a role sharing the GPU, holds the rest); set "
        f"cluster.gpu_memory_utilization below {below:g}, or give the actor its own GPU (cluster.gpus_per_actor)"
    )


_KV_SMALL = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
    r"memory \(([\d.]+) GiB\)"
)


def _kv_too_small(cause: str, spec: Any) -> str | None:
    """vLLM (GPU or CPU): the KV cache exists but holds less than one max-length sequence, or nothing at all."""
    f = spec.rollout.gpu_memory_utilization
    m = _KV_SMALL.search(cause)
    if m:
        seq_len, needed, have = int(m.group(1)), float(m.group(2)), float(m.group(3))
        suggestion = ""
        if not spec.placement.use_gpu:
            from rl.preflight.plan import numa_node_memory

            total = numa_node_memory().total / GiB
            suggestion = f"={math.ceil(100 * (f + 1.1 * (needed - have) / total)) / 100:g}"
        return (
            f"vLLM's KV cache ({have:.2f} GiB) cannot hold one {seq_len}-token sequence ({needed:.2f} GiB): raise "
            f"cluster.gpu_memory_utilization{suggestion} (now {f:g}) or lower model.max_prompt_tokens + "
            "model.max_new_tokens"
        )
    if "No available memory for the cache blocks" in cause:
        return (
            f"vLLM has no memory left for its KV cache at cluster.gpu_memory_utilization={f:g}: raise it "
            f"(`python train.py <your overrides> plan=true` shows what the engine needs){_cpu_kv_hint(spec)}"
        )
    return None


def _cuda_oom(cause: str, spec: Any) -> str | None:
    if not re.search(
        r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", cause
    ):
        return None
    return (
        f"CUDA out of memory ({_short(cause, 160)}): {_plan_memory(spec)}`python train.py <your overrides> "
        "plan=true` shows each role's memory per GPU; give roles more GPU (cluster.gpus_per_actor, "
        "cluster.gpus_per_learner), lower cluster.gpu_memory_utilization where an actor shares its GPU, or lower "
        "micro_batch_size / model.max_new_tokens, or set model.load_in_4bit=true"
    )


def _host_oom(cause: str, spec: Any) -> str | None:
    if not re.search(
        r"running low on memory|OOM killer|Cannot allocate memory|std::bad_alloc|DefaultCPUAllocator", cause
    ):
        return None
    return (
        f"the machine ran out of memory ({_short(cause, 160)}): `python train.py <your overrides> plan=true` shows "
        "each role's memory; lower cluster.gpu_memory_utilization, micro_batch_size or the number of roles "
        "(cluster.num_actors, cluster.num_learners)"
    )


_MODEL_FILES = re.compile(
    r"does not appear to have (?:a )?files? named|no file named|Cannot find any model weights|is not a local folder"
    r"|not a valid model identifier|Unrecognized model|does not recognize this architecture|are not supported for now"
    r"|Unrecognized configuration class|not a valid JSON|JSONDecodeError|Expecting (?:value|property name)"
    r"|SafetensorError|Error while deserializing header|HeaderTooLarge|incomplete metadata|HFValidationError"
    r"|RepositoryNotFoundError|LocalEntryNotFoundError|Can't load (?:the )?(?:tokenizer|config)"
    r"|couldn't connect to 'https://huggingface.co'|size mismatch for|Couldn't instantiate the backend tokenizer",
    re.IGNORECASE,
)


def _model_files(cause: str, spec: Any) -> str | None:
    if not _MODEL_FILES.search(cause):
        return None
    return f"could not load the model at model.path={spec.model_path} ({_short(cause, 300)}): {MODEL_HINT}"


def _cpu_kv_hint(spec: Any) -> str:
    """On CPU, `plan`'s estimate of the KV cache: '; set cluster.gpu_memory_utilization=X ...' when it predicts
    that the share leaves none, else ''."""
    if spec.placement.use_gpu or spec.rollout.backend.value != "vllm":
        return ""
    from rl.preflight.plan import DTYPE_BYTES, load_shape, numa_node_memory, vllm_cpu_fraction, vllm_cpu_non_kv_bytes

    try:
        shape, _ = load_shape(spec.model_path)
        node = numa_node_memory()
    except Exception:  # noqa: BLE001 - no hint then
        return ""
    if shape is None:
        return ""
    dtype = spec.rollout.dtype if spec.rollout.dtype != "auto" else shape.dtype
    non_kv = vllm_cpu_non_kv_bytes(shape.weight_bytes(DTYPE_BYTES.get(dtype, 2)))
    f = spec.rollout.gpu_memory_utilization
    need, seqs, seq_len = _kv_need(spec)
    if f * node.total - non_kv >= max(need / seqs, 1.0):  # room for one sequence: not this
        return ""
    fits = vllm_cpu_fraction(non_kv, need, node.total)
    return (
        f"; by plan=true's estimate cluster.gpu_memory_utilization={f:g} leaves it no KV cache on NUMA node "
        f"{node.node} ({node.total / GiB:.2f} GiB): set cluster.gpu_memory_utilization={fits:g}"
    )


def _plan_memory(spec: Any) -> str:
    """'plan=true estimates actor X GiB, learner Y GiB of a Z GiB GPU; ' for a run's spec, or ''."""
    try:
        from rl.preflight import plan

        shape, _ = plan.load_shape(spec.model_path)
        if shape is None:
            return ""
        found = plan.detect_gpus()
        device = found[1] if found else plan.ASSUMED_GPU_GIB * GiB
        lr, p = spec.learner, spec.placement
        roles = plan.estimate_memory(
            shape,
            use_gpu=p.use_gpu,
            device_bytes=device,
            actor_dtype=spec.rollout.dtype,
            learner_dtype=lr.dtype,
            load_in_4bit=lr.load_in_4bit,
            full_finetune=lr.full_finetune,
            lora_rank=lr.lora.rank if lr.lora else spec.rollout.max_lora_rank,
            lora_targets=list(lr.lora.targets) if lr.lora else [],
            max_prompt_tokens=spec.data.max_prompt_tokens,
            max_new_tokens=spec.sampler.sampling.max_tokens,
            micro_batch_size=lr.micro_batch_size,
            sequences_per_actor=math.ceil(spec.sampler.prompts_per_step * spec.sampler.sampling.n / p.num_actors),
            gpus_per_actor=p.gpus_per_actor,
            gpu_memory_utilization=spec.rollout.gpu_memory_utilization,
            vllm=spec.rollout.backend.value == "vllm",
            native_lora=spec.rollout.lora_mode == "native",
            gradient_checkpointing=lr.gradient_checkpointing,
        )
    except Exception:  # noqa: BLE001 - the line then points to plan=true only
        return ""
    actor, learner = roles["actor"], roles["learner"]
    return (
        f"plan=true estimates actor {(actor.budget or actor.total) / GiB:.1f} GiB ({p.gpus_per_actor:g} GPU), "
        f"learner {learner.total / GiB:.1f} GiB ({p.gpus_per_learner:g} GPU) of {device / GiB:.0f} GiB GPUs; "
    )


# ------------------------------------------------------------------------------------------------ placement


def placement_failure(
    bundles: list[dict[str, float]],
    strategy: str,
    nodes: list[dict[str, float]],
    free: dict[str, float],
    state: str | None,
    waited_s: float,
) -> str:
    """One line for a placement group Ray did not place: what it asked, what the cluster's nodes have, the fix.
    `state` is Ray's scheduling state (INFEASIBLE: no set of the cluster's nodes can ever hold it; NO_RESOURCES:
    it fits, but other work holds the resources now)."""

    def res(r: dict[str, float]) -> str:
        return "{" + ", ".join(f"{k}: {v:g}" for k, v in r.items() if k in ("CPU", "GPU") and v) + "}"

    asked = f"{len(bundles)} bundles {' '.join(res(b) for b in bundles)} with cluster.placement_strategy={strategy}"
    has = f"the Ray cluster has {len(nodes)} node(s): {' '.join(res(n) for n in nodes)}"
    fits_a_node = [any(all(n.get(k, 0) >= v for k, v in b.items()) for n in nodes) for b in bundles]
    if not all(fits_a_node):
        fix = (
            "no node can hold a role's bundle: lower cluster.cpus_per_actor/cpus_per_learner/gpus_per_actor/"
            "gpus_per_learner to fit one node, or add larger nodes"
        )
    elif strategy == "STRICT_SPREAD" and len(bundles) > len(nodes):
        fix = (
            f"STRICT_SPREAD puts every role on its own node and {len(bundles)} roles need {len(bundles)} nodes: set "
            "cluster.placement_strategy=PACK (or SPREAD), or add nodes"
        )
    elif strategy == "STRICT_PACK":
        fix = "STRICT_PACK needs one node that holds every role: set cluster.placement_strategy=PACK, or use a larger node"
    elif state == "NO_RESOURCES":
        fix = (
            f"they fit, but other work holds them (free now: {res(free)}): wait for it to end, or lower "
            "cluster.num_actors/num_learners or the resources per role"
        )
    else:
        fix = "lower cluster.num_actors/num_learners or the resources per role, or set cluster.placement_strategy=PACK"
    when = "cannot place the roles" if state == "INFEASIBLE" else f"did not place the roles in {waited_s:.0f} s"
    return f"Ray {when} (Ray: {state or 'pending'}): they ask {asked}; {has}; {fix}"
