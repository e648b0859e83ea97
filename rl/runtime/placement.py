"""Ray: start or join a cluster, place the roles, wrap the plain role classes as actors.

The only module that imports ray. Resources are given at the call site (`ray.remote(num_cpus=...)(Cls)`),
never hard-coded on the classes. One function (`place_roles`) decides placement and logs the map.

Past 400 lines because everything that talks to Ray is here, a placement group Ray refuses explained beside the
code that asked for it (`placement_failure`), so that no other module needs Ray's API or its error texts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple

from rl.config.cluster import ClusterConfig
from rl.errors import RoleStartFailed, UserFacingError, cause_of
from rl.logs import role_log_env
from rl.runtime.groups import Handle, MemberDied, RestartFailed, broadcast_shared, call_each, method_name
from rl.runtime.roles import Learner, Method, P, R, RolloutActor, T, Teacher
from rl.runtime.runtime import Runtime

log = logging.getLogger(__name__)

REPO_ROOT = str(Path(__file__).resolve().parents[2])


class RayStartError(UserFacingError):
    """Ray could not be started or joined, or the roles do not fit it; the message names the key to change."""


def _timed(member: Any, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Runs inside the actor (through Ray's __ray_call__): the call's result and the seconds it took there."""
    t0 = time.perf_counter()
    out = getattr(member, method)(*args, **kwargs)
    return out, time.perf_counter() - t0


class RayGroup(Generic[R]):
    """Members are Ray actor handles of one role (`R`, the protocol their class implements); calls run concurrently
    and are gathered in member order. A member whose process dies turns the failed calls into MemberDied (role and
    index named)."""

    def __init__(self, handles: list[Any], pg: Any = None, role: str = "actor"):
        self.handles = handles
        self.pg = pg
        self.role = role
        self._busy_s = 0.0

    def __len__(self) -> int:
        return len(self.handles)

    def submit(self, index: int, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> Handle[T]:
        handle, name = self.handles[index], method_name(method)
        getattr(handle, name)  # AttributeError here, at once, when the role has no such method
        return Handle(index, handle.__ray_call__.remote(_timed, name, *args, **kwargs))

    def result(self, submitted: Handle[T]) -> T:
        import ray
        from ray.exceptions import RayActorError

        try:
            out, seconds = ray.get(submitted.token)
        except RayActorError as e:
            raise MemberDied(self.role, submitted.index, _actor_error(e)) from e
        self._busy_s += seconds
        return out

    def wait(self, handles: list[Handle[Any]], timeout_s: float) -> list[int]:
        import ray

        if not handles:
            return []
        refs = [h.token for h in handles]
        ray.wait(refs, num_returns=1, timeout=timeout_s)
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done_refs = set(done)  # ObjectRefs compare by their object id
        return [k for k, r in enumerate(refs) if r in done_refs]

    def put(self, value: T) -> T:
        import ray

        return ray.put(value)  # an ObjectRef, which a call receives as the value (Group.put)

    def ready(self, index: int, timeout_s: float = 2.0) -> bool:
        """True when the member answers (a restarting actor fails at once with ActorUnavailableError); RestartFailed
        when Ray's restart ran __init__ and it raised: Ray gives that actor up, so waiting for it would be in vain."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return bool(ray.get(self.handles[index].__ray_ready__.remote(), timeout=timeout_s))
        except RayActorError as e:
            if e.actor_init_failed:
                raise RestartFailed(self.role, index, cause_of(e)) from e
            return False
        except GetTimeoutError:
            return False

    def call(self, method: Method[R, ..., T], args: list[tuple]) -> list[T]:
        return call_each(self, method, args)

    def broadcast(self, method: Method[R, P, T], *args: P.args, **kwargs: P.kwargs) -> list[T]:
        return broadcast_shared(self, method, *args, **kwargs)  # one copy of each argument in the object store

    def pop_busy_s(self) -> float:
        busy, self._busy_s = self._busy_s, 0.0
        return busy

    def close(self) -> None:
        import ray

        for h in self.handles:
            try:
                ray.get(h.close.remote(), timeout=60)
            except Exception:  # the actor may already be gone; kill it regardless
                pass
            ray.kill(h)
        self.handles = []


@dataclass
class RolePlan:
    role: str  # "actor" or "learner"
    index: int
    resources: dict[str, float]  # what the role's Ray actor asks of its bundle
    bundle: int = 0  # its bundle in the placement group
    node: str = ""  # the Ray node its bundle was placed on: "<node id prefix> (<node ip>)", once the group is ready


def role_plans(c: ClusterConfig) -> tuple[list[RolePlan], list[dict[str, float]]]:
    """Each role's resources and bundle, and the bundles. A bundle per role; colocated (`cluster.colocate`), actor
    i and learner i share bundle i, which holds their GPU (or GPU fraction) once, so Ray gives both the same GPU
    and each asks for half of it."""
    gpu = (lambda g: {"GPU": g}) if c.use_gpu else (lambda g: {})
    if c.colocate:
        plans, bundles = [], []
        for i in range(c.num_actors):
            bundles.append({"CPU": c.cpus_per_actor + c.cpus_per_learner, **gpu(c.gpus_per_actor)})
            plans.append(RolePlan("actor", i, {"CPU": c.cpus_per_actor, **gpu(c.gpus_per_actor / 2)}, bundle=i))
        for i in range(c.num_learners):
            plans.append(RolePlan("learner", i, {"CPU": c.cpus_per_learner, **gpu(c.gpus_per_learner / 2)}, bundle=i))
        return _with_teachers(c, plans, bundles)
    plans = [RolePlan("actor", i, {"CPU": c.cpus_per_actor, **gpu(c.gpus_per_actor)}) for i in range(c.num_actors)]
    plans += [
        RolePlan("learner", i, {"CPU": c.cpus_per_learner, **gpu(c.gpus_per_learner)}) for i in range(c.num_learners)
    ]
    for b, plan in enumerate(plans):
        plan.bundle = b
    return _with_teachers(c, plans, [dict(plan.resources) for plan in plans])


def _with_teachers(
    c: ClusterConfig, plans: list[RolePlan], bundles: list[dict[str, float]]
) -> tuple[list[RolePlan], list[dict[str, float]]]:
    """The judge/teacher engines after the other roles, a bundle each (never colocated: a judge answers while the
    learners train)."""
    gpu = {"GPU": c.gpus_per_teacher} if c.use_gpu else {}
    for i in range(c.num_teachers):
        plans.append(RolePlan("teacher", i, {"CPU": c.cpus_per_teacher, **gpu}, bundle=len(bundles)))
        bundles.append(dict(plans[-1].resources))
    return plans, bundles


def start_ray(
    address: str | None,
    num_cpus: int | None,
    verbose: bool = True,
    *,
    log_dir: Path | None = None,
    gpus: tuple[float, float] = (0.0, 0.0),
) -> bool:
    """Start a local Ray (address None) or join one; returns True when this process started it. Unless `verbose`,
    Ray's own notices while it starts are left out and it does not stream the workers' output (each role writes
    its own file, rl/logs.py). Inside a SLURM job, address None starts the job's own Ray across its step
    (rl/runtime/slurm.py; node logs under `log_dir`/nodes), after checking that its GPUs hold `gpus` (the layout's
    total, the most one role takes)."""
    import ray

    from rl import logs
    from rl.runtime import slurm

    if ray.is_initialized():
        return False
    job = slurm.Allocation.from_env() if address is None else None
    if job is not None:
        slurm.check_gpus(job, *gpus)
        try:
            start_ray(slurm.start_job_head(job, (log_dir or Path("logs")) / "nodes"), None, verbose)
            slurm.wait_for_nodes(job.step_nodes, job)
        except BaseException:
            stop_ray(True)
            raise
        return True
    # keep the user's PYTHONPATH after ours: packages installed with `pip --target` (the GPU machine) live there
    pythonpath = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    runtime_env = {"env_vars": {"PYTHONPATH": pythonpath}}
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # what Ray streams (run.verbose=true) comes without colour codes
    ray_logger, level = logging.getLogger("ray"), logging.getLogger("ray").level
    # Ray's core worker installs its own SIGTERM handler in the driver, which aborts it (exit 134 and a stack dump,
    # no teardown): the process's own handler (train.py: end as Ctrl-C does) is put back once Ray is up
    on_sigterm = signal.getsignal(signal.SIGTERM)
    if not verbose:  # Ray's notices while it starts (token auth, ...) are left out; its errors still show
        ray_logger.setLevel(logging.ERROR)
    try:
        if address is None:
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                runtime_env=runtime_env,
                log_to_driver=verbose,
                configure_logging=False,
            )
            return True
        check_reachable(address)
        ray.init(address=address, runtime_env=runtime_env, configure_logging=False, log_to_driver=verbose)
        return False
    except RayStartError:
        raise
    except Exception as e:  # noqa: BLE001 - reported as one line with the key to change
        where = "a local Ray (cluster.address=null)" if address is None else f"cluster.address={address!r}"
        raise RayStartError(
            f"could not start or join Ray at {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    finally:
        ray_logger.setLevel(level)  # from now on Ray's warnings show, and reach the driver's log file
        logs.quiet_console(ray_logger, verbose)
        if on_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when a host:port Ray address has nothing listening (ray.init would retry
    the GCS connection for a long time). "auto" and ray:// client addresses are left to Ray."""
    import socket

    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise RayStartError(
            f"could not join Ray at cluster.address={address!r}: {type(e).__name__}: {e}; start a head node there "
            "(`ray start --head`) or set cluster.address=null to start a local Ray"
        ) from None


def place_roles(c: ClusterConfig) -> tuple[Any, list[RolePlan]]:
    """Build one placement group with a bundle per role; log and return the bundle -> role map."""
    import ray
    from ray.util.placement_group import placement_group

    plans, bundles = role_plans(c)
    need_cpu = sum(b["CPU"] for b in bundles)
    need_gpu = sum(b.get("GPU", 0) for b in bundles)
    have = ray.cluster_resources()
    if need_cpu > have.get("CPU", 0) or need_gpu > have.get("GPU", 0):
        raise RayStartError(
            f"the roles need {need_cpu:g} CPU and {need_gpu:g} GPU but Ray has {have.get('CPU', 0):g} CPU and "
            f"{have.get('GPU', 0):g} GPU: lower cluster.num_actors/num_learners or cluster.cpus_per_actor/"
            f"cpus_per_learner/gpus_per_actor/gpus_per_learner, or set cluster.ray_num_cpus"
        )
    strategy = c.placement_strategy.value
    pg = placement_group(bundles, strategy=strategy)
    wait_placed(pg, bundles, strategy, fail_fast=c.address is None)
    nodes = bundle_nodes(pg)
    for r in plans:
        r.node = nodes[r.bundle]
        log.info("placement: bundle %d -> %s %d %s on node %s", r.bundle, r.role, r.index, r.resources, r.node)
    return pg, plans


def bundle_nodes(pg: Any) -> list[str]:
    """The node each bundle of a ready placement group sits on, as "<node id prefix> (<node ip>)": on a cluster
    the node ID tells nodes apart even where several share one IP (several Ray nodes on one machine)."""
    import ray
    from ray.util.placement_group import placement_group_table

    ips = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}
    on = placement_group_table(pg).get("bundles_to_node_id", {})
    return [f"{on[b][:12]} ({ips.get(on[b], '?')})" if b in on else "?" for b in range(len(pg.bundle_specs))]


def wait_placed(
    pg: Any, bundles: list[dict[str, float]], strategy: str, *, fail_fast: bool, timeout_s: float = 120.0
) -> None:
    """Wait until Ray has placed the group, at most `timeout_s`; with `fail_fast` (a local Ray: no autoscaler adds
    nodes) stop as soon as Ray calls it infeasible. A group not placed is removed and ends the run with the
    resources asked and those the cluster has (`placement_failure`)."""
    import ray
    from ray.util.placement_group import placement_group_table, remove_placement_group

    t0 = time.monotonic()
    ready = pg.ready()
    state = None
    while not ray.wait([ready], timeout=1.0)[0]:
        state = placement_group_table(pg).get("stats", {}).get("scheduling_state")
        if (fail_fast and state == "INFEASIBLE") or time.monotonic() - t0 > timeout_s:
            remove_placement_group(pg)
            nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
            raise RayStartError(
                placement_failure(bundles, strategy, nodes, ray.available_resources(), state, time.monotonic() - t0)
            )


class Role(NamedTuple):
    """How one role's actors start: the class, its constructor's keyword arguments (the config groups and named
    values it takes, rl/app.py: small plain objects, pickled into each actor) and the environment of its process."""

    cls: type
    kwargs: dict[str, Any]
    env: dict[str, str]


def build_ray_runtime(
    c: ClusterConfig,
    log_dir: Path,
    *,
    rollout: Role,
    learner: Role,
    teacher: Role | None = None,
    episodes: bool = False,
) -> Runtime:
    """Place and start the roles of the resolved `cluster` group `c`; each writes its output under `log_dir`.
    Rollout actors (and judge/teacher engines, `teacher`) are restarted by Ray up to `cluster.actor_max_restarts`
    times, with no task retries: a call in flight when one dies fails, and the Runtime sends its work to a live
    actor. Learners are never restarted (their optimizer state would be lost): a learner's death ends the run.
    `episodes`: the actors run multi-turn episodes."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg, plans = place_roles(c)
    handles: dict[str, list] = {"actor": [], "learner": [], "teacher": []}
    names = {"actor": "rollout actor", "learner": "learner", "teacher": "judge/teacher"}

    def wait_ready(
        role: str,
    ) -> None:  # a constructor's error (model load, engine start), role named; rl/app.py has it explained
        for i, h in enumerate(handles[role]):
            try:
                ray.get(h.__ray_ready__.remote())
            except Exception as e:
                for hh in handles["actor"] + handles["learner"] + handles["teacher"]:
                    ray.kill(hh)
                raise RoleStartFailed(f"{names[role]} {i}", cause_of(e)) from e

    roles = {"actor": rollout, "learner": learner} | ({"teacher": teacher} if teacher else {})
    for plan in plans:
        if (c.use_gpu or c.colocate) and plan.role == "learner" and plan.index == 0:
            # vLLM measures free GPU memory while it starts and fails if another process on the same GPU frees
            # memory meanwhile (a learner quantising its weights does): on GPUs the engines start first
            wait_ready("actor")
            if c.colocate:  # and then sleep, so that the learners load into the memory the engines gave back
                ray.get([h.sleep.remote() for h in handles["actor"]])
        if c.use_gpu and plan.role == "teacher" and plan.index == 0:
            wait_ready("learner")  # as above: a teacher's engine measures free memory on a GPU it may share
        role = roles[plan.role]
        env = dict(role.env) | role_log_env(log_dir, plan.role, plan.index)  # its output: <run dir>/logs/<role>.log
        opts = dict(
            num_cpus=plan.resources["CPU"],
            num_gpus=plan.resources.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=plan.bundle
            ),
            runtime_env={"env_vars": env},
            max_restarts=0 if plan.role == "learner" else c.actor_max_restarts,
            max_task_retries=0,
        )
        handles[plan.role].append(ray.remote(**opts)(role.cls).remote(**role.kwargs))
    wait_ready("actor")
    wait_ready("learner")
    wait_ready("teacher")
    if c.num_learners > 1:
        try:
            connect_learners(handles["learner"], pg, first_bundle=next(r.bundle for r in plans if r.role == "learner"))
        except Exception:
            for hh in handles["actor"] + handles["learner"] + handles["teacher"]:
                ray.kill(hh)
            raise
    teachers: RayGroup[Teacher] | None = (
        RayGroup(handles["teacher"], pg, "judge/teacher") if handles["teacher"] else None
    )
    actors: RayGroup[RolloutActor] = RayGroup(handles["actor"], pg, "rollout actor")
    learners: RayGroup[Learner] = RayGroup(handles["learner"], pg, "learner")
    return Runtime(actors, learners, c, teachers, episodes=episodes)


def connect_learners(learners: list[Any], pg: Any, *, first_bundle: int) -> None:
    """Form the learners' torch.distributed group: rank = learner index, rendezvous on a free port of learner
    0's node (found by a zero-CPU task placed in learner 0's bundle, so it runs on that node)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    def free_port() -> tuple[str, int]:
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    on_learner0 = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=first_bundle)
    address, port = ray.get(ray.remote(num_cpus=0, scheduling_strategy=on_learner0)(free_port).remote())
    refs = [h.init_process_group.remote(address, port, len(learners), rank) for rank, h in enumerate(learners)]
    try:
        ray.get(refs, timeout=300)
    except Exception as e:
        raise RuntimeError(
            f"the {len(learners)} learners could not form their torch.distributed group at {address}:{port}: "
            f"{_first_line(e)}"
        ) from e
    log.info("placement: %d learners in one torch.distributed group at %s:%d", len(learners), address, port)


def run_task(fn: Any, *args: Any, gpus: float, cpus: float, env: dict[str, str], **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` once, as a Ray task in a fresh process with these resources and environment (outside
    the roles' placement group: called before it exists); its result."""
    import ray

    task = ray.remote(num_gpus=gpus, num_cpus=cpus, runtime_env={"env_vars": env}, max_retries=0)(fn)
    return ray.get(task.remote(*args, **kwargs))


def stop_ray(started_here: bool) -> None:
    import ray

    if started_here and ray.is_initialized():
        ray.shutdown()
    if started_here:
        from rl.runtime import slurm

        slurm.stop_job_head()  # a SLURM job's own Ray head, when this run started one


def _actor_error(e: BaseException) -> str:
    """RayActorError in a few words: its type and the first sentence (the rest is Ray's general advice)."""
    text = " ".join(str(e).split()).split(". ")[0]
    return f"{type(e).__name__}: {text[:160]}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    cause = [line for line in text if "Error" in line]
    return (cause[-1] if cause else (text[0] if text else type(e).__name__)).strip()


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
