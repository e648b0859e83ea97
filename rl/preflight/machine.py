"""What this machine has, read without starting anything: its GPUs (nvidia-smi), its RAM, and the NUMA node a vLLM
CPU engine allocates from (capped by a cgroup limit). The plan (plan.py) and the start-up diagnosis (diagnose.py)
size their suggestions with these.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def detect_gpus() -> tuple[int, float, str] | None:
    """(count, memory bytes of the first GPU, its name) from nvidia-smi, or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [r.rsplit(",", 1) for r in out.splitlines() if "," in r]
    try:
        return (len(rows), float(rows[0][1]) * 1024**2, rows[0][0].strip()) if rows else None
    except ValueError:  # "[N/A]" and the like
        return None


def ram_bytes() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@dataclass(frozen=True)
class NodeMemory:
    """One NUMA node's memory as vLLM's CPU worker reads it (vllm/utils/cpu_resource_utils.py
    get_memory_node_info): the total it takes cluster.gpu_memory_utilization of, and what it may still allocate."""

    node: int
    total: float
    available: float


def numa_node_memory(cpu: int | None = None, sys_root: str = "/sys") -> NodeMemory:
    """The memory of the NUMA node of `cpu` (default: the first CPU this process may run on, which is where a CPU
    engine started from it allocates): MemTotal, and MemFree + Active(file) + Inactive(file) + SReclaimable as
    available, both capped by the cgroup memory limit; without NUMA nodes in sysfs, the machine's RAM."""
    root = Path(sys_root)
    if cpu is None:
        cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    node_dirs = sorted(root.glob("devices/system/node/node[0-9]*"), key=lambda d: int(d.name[4:]))
    node = next((int(d.name[4:]) for d in node_dirs if cpu in _id_list((d / "cpulist").read_text())), None)
    meminfo = root / f"devices/system/node/node{node}/meminfo"
    if node is not None and meminfo.is_file():
        info = {}
        for line in meminfo.read_text().splitlines():  # "Node 0 MemTotal:       16083148 kB"
            parts = line.split()
            if len(parts) >= 4:
                info[parts[2].rstrip(":")] = int(parts[3]) * 1024
        total = float(info["MemTotal"])
        available = float(sum(info.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")))
    else:
        node, total = 0, ram_bytes()
        available = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    limit, usage = _cgroup_memory(root)
    if limit is not None and limit < total:
        total = float(limit)
        available = max(0.0, min(available, limit - (usage or 0)))
    return NodeMemory(node, total, available)


def _id_list(text: str) -> set[int]:
    """'0-2,4' -> {0, 1, 2, 4}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


def _cgroup_memory(root: Path) -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup, v2 or v1, as vLLM reads them; (None, None) if unlimited."""

    def read(rel: str) -> int | None:
        try:
            text = (root / rel).read_text().strip()
            return int(text) if text and text != "max" else None
        except (OSError, ValueError):
            return None

    v2 = read("fs/cgroup/memory.max")
    if v2 is not None:
        return v2, read("fs/cgroup/memory.current")
    v1 = read("fs/cgroup/memory/memory.limit_in_bytes")
    if v1 is not None and v1 < (1 << 62):
        return v1, read("fs/cgroup/memory/memory.usage_in_bytes")
    return None, None
