"""The `cluster` group: how many rollout actors and learners, where they run (CPUs, GPUs, Ray), how they share
a GPU and pass the adapter, and the checks that a layout can run at all (each message names the key to change).

Apart from rl/config/schema.py because its placement checks (CUDA IPC on one GPU, colocated pairs) are most of
its length; the schema composes it like any other group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rl.config.choices import ClusterMode, LoraMode, PlacementStrategy, RolloutBackend, RolloutMode, WeightSync
from rl.config.errors import check, check_fields_finite

# continuous rollouts: calls queued on each actor (one running, one behind it, so that an actor does not wait for the
# driver between calls); an engine runs one call at a time, so it holds 1/STREAM_DEPTH of its groups in flight at once
STREAM_DEPTH = 2


@dataclass
class ClusterConfig:
    mode: ClusterMode = ClusterMode.ray  # ray: Ray actors; local: everything in this process (no Ray)
    num_actors: int = 1  # vLLM rollout actors
    num_learners: int = 1  # LoRA learners
    address: str | None = None  # Ray address: null starts a local Ray; "auto" or host:port joins a cluster
    use_gpu: bool = False  # place roles on GPUs (false: CPU resources only, as on this machine and in CI)
    gpus_per_actor: float = 1.0  # GPUs per rollout actor (vLLM tensor parallel when > 1), when use_gpu
    gpus_per_learner: float = 1.0  # GPUs per learner, when use_gpu
    cpus_per_actor: float = 1.0  # Ray CPU resources reserved per rollout actor
    cpus_per_learner: float = 1.0  # Ray CPU resources reserved per learner
    placement_strategy: PlacementStrategy = PlacementStrategy.PACK  # Ray placement group strategy (PACK: fewest nodes)
    rollout_backend: RolloutBackend = RolloutBackend.vllm  # vllm or hf (debugging)
    lora_mode: LoraMode = LoraMode.auto  # vLLM adapter loading: merged (into the weights) | native (LoRARequest) | auto
    # null: all cores, or where the roles compute at once (staleness >= 1, continuous, a sweep pack) on a local Ray
    # an even share of them per role (rl/resolve.py resolve_cpu_threads)
    actor_threads: int | None = None  # CPU threads of a CPU vLLM engine
    learner_threads: int | None = None  # torch threads of a CPU learner
    gpu_memory_utilization: float = 0.2  # vLLM memory fraction (CPU: of a NUMA node, for the engine's whole process)
    enforce_eager: bool = True  # vLLM: no CUDA graphs / compilation (faster start; set false for long GPU runs)
    ray_num_cpus: int | None = None  # CPUs a local Ray advertises (null: what Ray detects)
    weight_sync: WeightSync = WeightSync.object_store  # object_store (bytes, any device) | ipc (CUDA, learner's GPU)
    staleness: int = 0  # steps actors may run ahead of learners (0: synchronous; k: generate step t+k while training t)
    # with continuous, cluster.staleness is the most syncs a trained sample's oldest token may lag
    rollout_mode: RolloutMode = RolloutMode.batch  # batch | continuous: actors never pause (rl/runtime/stream.py)
    segment_tokens: int = 64  # continuous: new tokens per sample per actor call (adapter updates land in between)
    groups_in_flight: int = 0  # continuous: prompt groups in generation or waiting (0: 2 x run.prompts_per_step)
    actor_max_restarts: int = 2  # times Ray restarts a dead rollout actor (its prompts go to a live one meanwhile)
    learner_chunk_size: int = 0  # prompts each learner generates per generate call, HF generate (0: actors only)
    colocate: bool = False  # actor i and learner i time-share one GPU: the engine sleeps while the learner trains
    num_teachers: int = 0  # vLLM judge/teacher engines (the `teacher` group's model; reward=judge, algorithm=distill)
    gpus_per_teacher: float = 1.0  # GPUs per judge/teacher engine (tensor parallel when > 1), when use_gpu
    cpus_per_teacher: float = 1.0  # Ray CPU resources reserved per judge/teacher engine
    teacher_memory_utilization: float | None = None  # vLLM memory fraction of a judge/teacher engine (null: as actors)

    def __post_init__(self) -> None:
        check_fields_finite(self, "cluster")
        check(self.num_actors >= 1, f"cluster.num_actors must be >= 1 (got {self.num_actors})")
        check(self.num_learners >= 1, f"cluster.num_learners must be >= 1 (got {self.num_learners})")
        for role in ("actor", "learner", "teacher"):
            gpus, cpus = getattr(self, f"gpus_per_{role}"), getattr(self, f"cpus_per_{role}")
            check(gpus > 0, f"cluster.gpus_per_{role} must be > 0 (got {gpus})")
            check(cpus >= 0, f"cluster.cpus_per_{role} must be >= 0 (got {cpus})")
        for key in ("actor_threads", "learner_threads", "ray_num_cpus"):
            value = getattr(self, key)
            check(value is None or value >= 1, f"cluster.{key} must be >= 1 or null (null: all cores; got {value})")
        check(0 < self.gpu_memory_utilization <= 1, "cluster.gpu_memory_utilization must be in (0, 1]")
        check(
            self.weight_sync == WeightSync.object_store or self.use_gpu,
            "cluster.weight_sync=ipc shares CUDA memory between processes: set cluster.use_gpu=true",
        )
        check(
            self.weight_sync == WeightSync.object_store or self.mode == ClusterMode.ray,
            "cluster.weight_sync=ipc connects separate processes: use cluster.mode=ray",
        )
        check(
            self.weight_sync == WeightSync.object_store or self.rollout_backend == RolloutBackend.vllm,
            "cluster.weight_sync=ipc loads into vLLM engines: set cluster.rollout_backend=vllm",
        )
        if self.weight_sync == WeightSync.ipc:
            self._check_ipc_placement()
        check(self.staleness >= 0, f"cluster.staleness must be >= 0 (0: synchronous; got {self.staleness})")
        check(
            self.learner_chunk_size >= 0,
            f"cluster.learner_chunk_size must be >= 0 (0: only the actors generate; got {self.learner_chunk_size})",
        )
        check(
            self.teacher_memory_utilization is None or 0 < self.teacher_memory_utilization <= 1,
            "cluster.teacher_memory_utilization must be in (0, 1] or null (null: cluster.gpu_memory_utilization)",
        )
        check(self.num_teachers >= 0, f"cluster.num_teachers must be >= 0 (got {self.num_teachers})")
        check(
            self.num_teachers == 0 or self.mode == ClusterMode.ray or self.num_teachers == 1,
            "cluster.mode=local runs one judge/teacher engine in-process: set cluster.num_teachers=1 (or 0)",
        )
        if self.rollout_mode == RolloutMode.continuous:
            self._check_continuous()
        check(self.actor_max_restarts >= 0, f"cluster.actor_max_restarts must be >= 0 (got {self.actor_max_restarts})")
        if self.colocate:
            self._check_colocate()
        if self.mode == ClusterMode.local:
            check(
                self.num_actors == 1 and self.num_learners == 1,
                "cluster.mode=local runs one actor and one learner in-process: set cluster.num_actors=1 "
                "cluster.num_learners=1, or use cluster.mode=ray",
            )
            check(
                self.staleness == 0,
                f"cluster.mode=local runs the roles one after the other, so it cannot overlap them: set "
                f"cluster.staleness=0 (got {self.staleness}) or use cluster.mode=ray",
            )

    def _check_continuous(self) -> None:
        why = "cluster.rollout_mode=continuous"
        check(self.mode == ClusterMode.ray, f"{why} overlaps actors and learners: use cluster.mode=ray")
        check(
            self.staleness >= 1,
            f"{why} trains tokens sampled by older adapters: set cluster.staleness >= 1 (the most syncs a sample's "
            f"oldest token may lag; got {self.staleness})",
        )
        check(
            self.learner_chunk_size == 0,
            f"{why} keeps the learners training while the actors generate: set cluster.learner_chunk_size=0",
        )
        check(
            not self.colocate,
            f"{why} never pauses the actors, which cluster.colocate does while the learner trains: set "
            "cluster.colocate=false (or cluster.rollout_mode=batch)",
        )
        check(self.segment_tokens >= 1, f"cluster.segment_tokens must be >= 1 (got {self.segment_tokens})")
        check(self.groups_in_flight >= 0, f"cluster.groups_in_flight must be >= 0 (got {self.groups_in_flight})")

    @property
    def gpus_needed(self) -> float:
        """GPUs the layout takes in all, when use_gpu: actors, learners (none of their own when colocated), teachers."""
        learners = 0 if self.colocate else self.num_learners * self.gpus_per_learner
        return self.num_actors * self.gpus_per_actor + learners + self.num_teachers * self.gpus_per_teacher

    @property
    def gpus_per_role_max(self) -> float:
        """The most GPUs one role takes (they must be on one node)."""
        return max(self.gpus_per_actor, self.gpus_per_learner, self.gpus_per_teacher if self.num_teachers else 0.0)

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs per vLLM engine (tensor parallel): whole GPUs of gpus_per_actor on GPUs, else 1."""
        return max(1, int(self.gpus_per_actor)) if self.use_gpu else 1

    def _check_ipc_placement(self) -> None:
        """A CUDA IPC handle opens only on the GPU that made it, and the sync hands learner 0's handles to every
        actor: all actors must sit on learner 0's GPU (Ray packs fractional bundles onto one GPU)."""
        if self.colocate:  # pairs: actor i shares learner i's GPU, so only actor 0 shares learner 0's
            check(
                self.num_actors == 1,
                f"cluster.weight_sync=ipc hands learner 0's policy to every actor, and cluster.colocate=true puts actor "
                f"i on learner i's GPU: set cluster.num_actors=1 cluster.num_learners=1 (got {self.num_actors}), or "
                "cluster.weight_sync=object_store",
            )
            return
        share = self.num_actors * self.gpus_per_actor + self.gpus_per_learner
        each = math.floor(100 / (self.num_actors + 1)) / 100  # an equal share per role that fits
        check(
            share <= 1,
            f"cluster.weight_sync=ipc needs every actor on learner 0's GPU, but cluster.num_actors={self.num_actors} x "
            f"cluster.gpus_per_actor={self.gpus_per_actor} + cluster.gpus_per_learner={self.gpus_per_learner} = "
            f"{share:g} GPUs: make them fit one GPU (e.g. cluster.gpus_per_actor={each:g} "
            f"cluster.gpus_per_learner={each:g}), set cluster.colocate=true, or use cluster.weight_sync=object_store",
        )

    def _check_colocate(self) -> None:
        """Time-sharing a GPU (vLLM sleep mode) works on CUDA only, pairs one actor with one learner on the same
        GPU, and cannot overlap generation with training."""
        check(
            self.use_gpu and self.mode == ClusterMode.ray,
            "cluster.colocate=true time-shares a GPU through vLLM's sleep mode (CUDA only): set cluster.use_gpu=true "
            "(and cluster.mode=ray)",
        )
        check(
            self.staleness == 0,
            f"cluster.colocate=true: the engine sleeps while the learner trains, so nothing is generated ahead: set "
            f"cluster.staleness=0 (got {self.staleness})",
        )
        check(
            self.num_actors == self.num_learners,
            f"cluster.colocate=true pairs actor i with learner i on one GPU: set cluster.num_actors equal to "
            f"cluster.num_learners (got {self.num_actors} and {self.num_learners})",
        )
        check(
            self.gpus_per_actor == self.gpus_per_learner and self.gpus_per_actor <= 1,
            f"cluster.colocate=true: each actor/learner pair shares one GPU (or the same fraction of one): set "
            f"cluster.gpus_per_actor = cluster.gpus_per_learner <= 1 (got {self.gpus_per_actor} and "
            f"{self.gpus_per_learner})",
        )
        check(
            self.learner_chunk_size == 0,
            "cluster.colocate=true: the learners cannot generate while the engine is awake: set cluster.learner_chunk_size=0",
        )
