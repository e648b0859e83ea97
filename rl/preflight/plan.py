"""Preflight plan: `python train.py ... plan=true` prints the GPU map and a memory estimate per role, then exits.

The report: where the roles go (the GPU map, or the CPUs and the NUMA node a vLLM CPU engine allocates on), each
role's memory as memory.py estimates it term by term, and the checks of those numbers against the GPUs or the
NUMA node found here (machine.py) or assumed, each failed check a warning that names the keys to change. An
algorithm name no registry has, or a model.init_adapter that does not match, fails here as the run would.

Nothing starts (no Ray, no vLLM, no torch): the model's shapes come from its config.json (a local folder, the
converted embedded model, or the local Hugging Face cache for a hub id), read by shapes.py.
"""

from __future__ import annotations

import math
import os
from typing import Any

from rl.config.schema import ConfigError
from rl.preflight.machine import detect_gpus, numa_node_memory, ram_bytes
from rl.preflight.memory import ACTOR_KEYS, TEACHER_KEYS, GiB, plan_for_config
from rl.preflight.shapes import load_shape
from rl.resolve import check_registry_names, resolve_init_adapter
from rl.runtime.slurm import Allocation

ASSUMED_GPU_GIB = 80.0  # when neither plan_gpu_memory_gib nor nvidia-smi says


def gpu_map(
    num_actors: int,
    gpus_per_actor: float,
    num_learners: int,
    gpus_per_learner: float,
    num_teachers: int = 0,
    gpus_per_teacher: float = 1.0,
    *,
    colocate: bool = False,
) -> list[list[str]]:
    """Roles on GPUs in placement order (actors, learners, then judge/teacher engines; PACK): a role with >= 1 GPU
    takes whole GPUs, a fractional one shares the last GPU while it has room (as Ray assigns fractional GPUs).
    `colocate`: actor i and learner i share GPU i (one bundle each pair), the engines come after them."""
    gpus: list[list[str]] = []
    free: list[float] = []
    roles = [(f"teacher {i}", gpus_per_teacher) for i in range(num_teachers)]
    if colocate:
        gpus = [[f"actor {i}", f"learner {i}"] for i in range(num_actors)]
        free = [max(0.0, 1.0 - gpus_per_actor)] * num_actors
    else:
        roles = [(f"actor {i}", gpus_per_actor) for i in range(num_actors)]
        roles += [(f"learner {i}", gpus_per_learner) for i in range(num_learners)]
        roles += [(f"teacher {i}", gpus_per_teacher) for i in range(num_teachers)]
    for name, need in roles:
        if need < 1 and free and free[-1] >= need - 1e-9:
            gpus[-1].append(f"{name} ({need:g})")
            free[-1] -= need
            continue
        for _ in range(max(1, math.ceil(need))):
            gpus.append([f"{name} ({need:g})" if need < 1 else name])
            free.append(1.0 - need if need < 1 else 0.0)
    return gpus


def _gib(b: float) -> str:
    return f"{b / GiB:.2f} GiB"


def format_plan(cfg: Any, pack_jobs: int = 1, grouped: bool = False) -> tuple[str, list[str]]:
    """The preflight report for a TrainConfig: (text, warnings); `pack_jobs`: for a sweep pack of that many jobs
    sharing the roles (hydra/launcher=pack), whose learner trains their steps together with `grouped`."""
    c = cfg.cluster
    value = lambda v: getattr(v, "value", v)  # noqa: E731 - str Enums to their names
    lines, warnings = [], []
    try:
        shape, source = load_shape(cfg.model.path)
    except ValueError as e:  # a config.json this estimate cannot size (ConfigError, a bad path, still raises)
        if isinstance(e, ConfigError):
            raise
        shape, source = None, str(e)
    local = getattr(c.mode, "value", c.mode) == "local"
    colocate = bool(getattr(c, "colocate", False))
    teachers = getattr(c, "num_teachers", 0)
    if c.use_gpu:
        need = c.gpus_needed
        job = None if c.address else Allocation.from_env()  # inside a SLURM job: what its allocation has
        found = detect_gpus()
        gpu_gib = getattr(cfg, "plan_gpu_memory_gib", None)
        device = gpu_gib * GiB if gpu_gib else (found[1] if found else ASSUMED_GPU_GIB * GiB)
        why = "plan_gpu_memory_gib" if gpu_gib else (f"nvidia-smi: {found[2]}" if found else "assumed")
        have = (
            "the Ray cluster's (cluster.address is set; not checked here)"
            if c.address
            else f"{job.gpus_total} in {job.describe()}"
            if job
            else (f"{found[0]} on this machine" if found else "none found on this machine (no nvidia-smi)")
        )
        roles_text = (
            f"{c.num_actors} actor/learner pair(s) x {c.gpus_per_actor:g}, colocated"
            if colocate
            else f"{c.num_actors} actor(s) x {c.gpus_per_actor:g} + {c.num_learners} learner(s) x {c.gpus_per_learner:g}"
        )
        if teachers:
            roles_text += f" + {teachers} judge/teacher engine(s) x {c.gpus_per_teacher:g}"
        lines.append(f"GPUs: need {need:g} ({roles_text}); available: {have}; {device / GiB:.0f} GiB each ({why})")
        if job and (need > job.gpus_total + 1e-9 or c.gpus_per_role_max > job.gpus + 1e-9):
            warnings.append(
                f"the roles need {need:g} GPUs, at most {c.gpus_per_role_max:g} on one node, and {job.describe()} has "
                f"{job.gpus_total}: the run would stop at start; ask for more GPUs or nodes"
            )
        elif found and not c.address and math.ceil(need - 1e-9) > found[0]:
            warnings.append(f"the roles need {need:g} GPUs and this machine has {found[0]}")
        elif not found and not job and not c.address and not gpu_gib:
            warnings.append(
                "no GPU on this machine (no nvidia-smi): set plan_gpu_memory_gib=<GiB> to plan for another machine's "
                "GPUs, or cluster.use_gpu=false"
            )
        layout = gpu_map(
            c.num_actors,
            c.gpus_per_actor,
            c.num_learners,
            c.gpus_per_learner,
            teachers,
            c.gpus_per_teacher,
            colocate=colocate,
        )
        lines.append("GPU map:" + (" (colocated: the engine sleeps while the learner trains)" if colocate else ""))
        lines += [f"  GPU {i}: {', '.join(roles)}" for i, roles in enumerate(layout)]
    else:
        node = numa_node_memory()
        device = node.total  # vLLM's CPU engine takes its fraction of one NUMA node
        cpus = c.num_actors * c.cpus_per_actor + c.num_learners * c.cpus_per_learner + teachers * c.cpus_per_teacher
        lines.append(
            "CPU mode (cluster.use_gpu=false): no GPUs; "
            + ("one process (cluster.mode=local)" if local else f"the roles reserve {cpus:g} Ray CPUs")
            + f"; this machine: {os.cpu_count()} cores, {ram_bytes() / GiB:.1f} GiB RAM; NUMA node {node.node} "
            f"(where a vLLM CPU engine allocates): {_gib(node.total)}, {_gib(node.available)} available now"
        )
        layout = []
    if shape is None:
        lines.append(f"memory: unknown ({source})")
        return "\n".join(lines), warnings
    lines.append(
        f"model: {shape.name} ({shape.params / 1e9:.3f} B parameters: {shape.layers} layers, hidden {shape.hidden}, "
        f"intermediate {shape.intermediate}, {shape.heads} heads / {shape.kv_heads} KV heads, vocab {shape.vocab}; "
        f"from {source})"
    )
    teacher_shape = None
    teacher_path = getattr(getattr(cfg, "teacher", None), "path", None)
    if teachers and teacher_path and teacher_path != cfg.model.path:
        try:
            teacher_shape, teacher_source = load_shape(teacher_path)
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            lines.append(f"judge/teacher model: memory unknown ({e}); its engines are left out of the estimate")
            teachers = 0
        else:
            lines.append(
                f"judge/teacher model: {teacher_shape.name} ({teacher_shape.params / 1e9:.3f} B parameters; from "
                f"{teacher_source})"
            )
    roles = plan_for_config(cfg, shape, device, teacher_shape, pack_jobs=pack_jobs, grouped=grouped)
    if not teachers:
        roles.pop("teacher", None)
    for role in roles.values():
        parts = " + ".join(f"{k} {_gib(v)}" for k, v in role.parts.items())
        lines.append(f"{role.role} (each): {_gib(role.total)} = {parts}")
        lines += [f"  {n}" for n in role.notes]
        warnings += role.warnings
    learner, actor, teacher = roles["learner"], roles["actor"], roles.get("teacher")
    engines = [(actor, ACTOR_KEYS, c.gpus_per_actor)] + (
        [(teacher, TEACHER_KEYS, c.gpus_per_teacher)] if teacher else []
    )
    if c.use_gpu:
        # a vLLM engine takes its share of each of its GPUs, whatever it uses
        per_gpu = {e.role: (e.budget or e.total) / max(1, math.ceil(g)) for e, _, g in engines}
        per_gpu["learner"] = learner.total
        resident = learner.total - learner.parts["activations"]
        if colocate:  # taking turns: the awake engine beside the learner's resident state, or the learner's peak
            lines.append(
                f"colocated, per GPU: generating {_gib(per_gpu['actor'] + resident)} (engine + the learner's resident "
                f"state), training {_gib(learner.total)} (the sleeping engine holds no GPU memory)"
            )
        for i, names in enumerate(layout):
            kinds = [n.split()[0] for n in names]
            used = 0.0
            if colocate and "actor" in kinds:  # a pair: the larger of its two phases
                used = max(per_gpu["actor"] + resident, learner.total)
                kinds = [k for k in kinds if k not in ("actor", "learner")]
            used += sum(per_gpu[k] for k in kinds)
            if used > device:
                teacher_hint = ", lower cluster.teacher_memory_utilization" if teacher else ""
                warnings.append(
                    f"GPU {i} ({', '.join(names)}): {_gib(used)} > {_gib(device)}: give the roles more GPUs "
                    "(cluster.gpus_per_*), lower learner.micro_batch_size (or learner.micro_batch_tokens) / "
                    f"model.max_new_tokens{teacher_hint}, or use model.load_in_4bit"
                )
        for e, keys, _ in engines:
            if e.budget is not None and e.total - e.parts["KV cache"] > e.budget:
                warnings.append(
                    f"{keys.role}: weights and activations ({_gib(e.total - e.parts['KV cache'])}) exceed vLLM's "
                    f"share {_gib(e.budget)}: raise {keys.memory} or {keys.gpus}"
                )
    else:
        total = learner.total + actor.total if local else c.num_learners * learner.total + c.num_actors * actor.total
        total += teachers * teacher.total if teacher else 0.0
        lines.append(f"all roles: {_gib(total)} of {_gib(ram_bytes())} RAM")
        if total > ram_bytes():
            warnings.append(f"the roles need {_gib(total)} of RAM and this machine has {_gib(ram_bytes())}")
        fraction = {
            "actor": c.gpu_memory_utilization,
            "teacher": c.teacher_memory_utilization or c.gpu_memory_utilization,
        }
        for e, keys, _ in engines:
            vllm = keys is TEACHER_KEYS or value(c.rollout_backend) == "vllm"  # a judge/teacher is always vLLM
            if vllm and e.budget is not None and e.budget > node.available:
                # vLLM's CPU worker checks this at start (the share must be free now); cluster.address: other nodes
                below = math.floor(100 * node.available / node.total) / 100
                warnings.append(
                    f"{keys.role}: vLLM's CPU engine would refuse to start: {keys.memory}={fraction[keys.role]:g} asks "
                    f"{_gib(e.budget)} of NUMA node {node.node} and {_gib(node.available)} is available now; set it "
                    f"below {below:g} or free memory"
                )
    return "\n".join(lines), warnings


def print_plan(cfg: Any, pack_jobs: int = 1, grouped: bool = False) -> bool:
    """The report for a TrainConfig, after the checks a run makes before it starts that the estimate does not need:
    an algorithm name no registry has, or a model.init_adapter that is not a matching adapter, would fail the run
    where the plan said it fits. `pack_jobs`: the plan of a sweep pack of that many jobs (`grouped`: its learner
    trains their steps together). Whether it fits."""
    check_registry_names(cfg)
    resolve_init_adapter(cfg)
    text, warnings = format_plan(cfg, pack_jobs, grouped)
    what = f"a pack of {pack_jobs} jobs (hydra/launcher=pack), " if pack_jobs > 1 else ""
    print(f"preflight plan ({what}nothing started)\n{text}")
    for w in warnings:
        print(f"WARNING: {w}")
    verdict = (
        "WARNING: as configured it will not start or not fit (see above)" if warnings else "fits (by this estimate)"
    )
    print(verdict, flush=True)
    return not warnings
