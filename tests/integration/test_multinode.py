"""A real two-node Ray cluster on this machine: a head and a second node, each started with `ray start ... --block`
as its own process tree and given one CPU, so that roles reserving a whole CPU cannot share a node. Against that
running cluster: `python train.py cluster.address=<head>` places the rollout actor and the learners on different
nodes, trains, checkpoints and resumes with two learners (an HF actor); a `-m` sweep with hydra/launcher=ray_cluster runs its
jobs as tasks on it; a vLLM rollout actor killed with SIGKILL in the middle of a run is restarted by Ray and every
prompt is trained once. The cluster is started once for the module and stopped by its fixture."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rl.loop import checkpoint
from rl.rollout.vllm import VLLMRollout
from tests.helpers import REPO, LengthReward, metric_rows, repo_env, run_train, sigkill_self_once, tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

# Ray (2.60) turns token authentication on for `ray start --head` when ~/.ray/auth_token exists (any earlier local
# ray.init writes one), and then only processes with RAY_AUTH_MODE=token and that token may join by host:port. The
# cluster here always uses token authentication, with a token of its own, whether or not this machine has one.
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
PLACED = re.compile(r"placement: bundle \d+ -> (actor|learner) (\d+) .* on node (\w+) ")


@dataclass
class TwoNodes:
    address: str  # host:port of the head's GCS
    head: str  # node ID of the head node
    worker: str  # node ID of the second node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def ray_nodes(address: str, env: dict) -> list[dict]:
    """The cluster's live nodes, asked by a separate driver (this test process never joins the cluster)."""
    code = (
        "import json, sys, ray; ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False); "
        "print(json.dumps([{'id': n['NodeID'], 'head': 'node:__internal_head__' in n['Resources']} "
        "for n in ray.nodes() if n['Alive']]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, address], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def start_node(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    """`ray start <args> --block`: the command stays in the foreground and takes down its node's processes when
    it gets SIGTERM, so the fixture stops exactly the nodes it started (`ray stop` would stop every Ray here)."""
    ports = [f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"]
    with log.open("w") as f:
        return subprocess.Popen(
            [
                str(Path(sys.executable).parent / "ray"),
                "start",
                *args,
                *ports,
                "--num-cpus=1",
                "--object-store-memory=300000000",
                "--disable-usage-stats",
                "--block",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def wait_for(what: str, check, procs: list[subprocess.Popen], logs: list[Path], tries: int = 240) -> None:
    for _ in range(tries):
        if check():
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}\n{p.read_text()[-2000:]}" for p in logs if p.is_file())
    pytest.fail(f"the two-node Ray cluster did not come up ({what}):\n{tails}")


@pytest.fixture(scope="module")
def two_nodes():
    # a short temp dir of its own: Ray's socket paths must stay under 108 characters
    temp = Path(tempfile.mkdtemp(prefix="rlft-2n-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | AUTH
    port = free_port()
    procs: list[subprocess.Popen] = []
    logs = [temp / "head.log", temp / "worker.log"]
    try:
        procs.append(
            start_node(
                [
                    "--head",
                    f"--port={port}",
                    f"--temp-dir={temp}",
                    "--include-dashboard=false",
                    f"--dashboard-port={free_port()}",
                    f"--ray-client-server-port={free_port()}",
                ],
                logs[0],
                env,
            )
        )
        address_file = temp / "ray_current_cluster"  # written by the head once its GCS is up
        wait_for("head", address_file.is_file, procs, logs)
        address = address_file.read_text().strip()
        # a temp dir of its own, as on another machine (sharing the head's, both nodes' log monitors would stream
        # every worker's output to the driver)
        procs.append(start_node([f"--address={address}", f"--temp-dir={temp / 'w'}"], logs[1], env))
        nodes: list[dict] = []

        def both_up() -> bool:
            nodes[:] = ray_nodes(address, env)
            return len(nodes) == 2

        wait_for("second node", both_up, procs, logs, tries=60)
        (head,) = [n["id"] for n in nodes if n["head"]]
        (worker,) = [n["id"] for n in nodes if not n["head"]]
        yield TwoNodes(address, head, worker)
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


def log_of(run: Path) -> str:
    return (run / "logs" / "driver.log").read_text()


def placements(text: str) -> dict[tuple[str, int], str]:
    """(role, index) -> the 12-character node ID prefix, from a run's placement log."""
    return {(role, int(i)): node for role, i, node in PLACED.findall(text)}


def test_roles_on_two_nodes_train_checkpoint_and_resume_with_two_learners(two_nodes, tiny_model, tmp_path, monkeypatch):
    """One rollout actor (a whole CPU: a node of its own) and two learners (half a CPU each: together on the other
    node) train 2 steps with a checkpoint after each; resume=auto continues at step 3 with the data cursor and
    the adapter versions of the checkpoint, and the two learners hold equal adapters before and after. The actor
    generates with HF: a vLLM engine on a node of this cluster, and its adapter, run in the fault test below, and
    the two runs here would start two more."""
    for k, v in AUTH.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "run"
    common = [
        *tiny_args(tiny_model, in_process=False),
        f"cluster.address={two_nodes.address}",
        "cluster.num_learners=2",
        "cluster.rollout_backend=hf",
        "cluster.cpus_per_actor=1",
        "cluster.cpus_per_learner=0.5",
        "cluster.actor_threads=1",
        "cluster.learner_threads=1",
        f"run.output_dir={out}",
        "logger=none",
        "run.prompts_per_step=2",
        "algorithm.group_size=2",
        "model.max_new_tokens=8",
        "eval.size=0",
        "checkpoint.interval=1",
    ]
    first = run_train([*common, "run.steps=2"], timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    placed = placements(log_of(out))  # the run's log: rl/logs.py
    assert set(placed) == {("actor", 0), ("learner", 0), ("learner", 1)}, first.stdout[-3000:]
    nodes = {two_nodes.head[:12], two_nodes.worker[:12]}
    assert set(placed.values()) == nodes  # both nodes of this cluster are used, and no other node
    assert placed["actor", 0] != placed["learner", 0] == placed["learner", 1]
    state, _ = checkpoint.load(out / "checkpoints" / "step_0002")
    assert state["step"] == 2 and state["adapter_version"] == 2 and state["data"]["cursor"] == 4

    resumed = run_train([*common, "run.steps=3", "run.resume=auto"], timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'step_0002'}: step 2, adapter version 2, data cursor 4" in (
        resumed.stdout
    )
    assert set(placements(log_of(out)).values()) == nodes
    train_rows = [r for r in metric_rows(out, timings=True) if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3]  # each step once, none repeated after the resume
    step3 = train_rows[-1]
    assert step3["data/cursor"] == 6 and step3["sync/version"] == 3
    assert step3["actor/adapter_version"] == 2  # step 3 was sampled with the restored adapter, pushed to the actor
    # both learners restored the checkpoint: their adapters agree after the resumed step as before it
    assert [r["learner/checksum_spread"] for r in train_rows] == [0.0, 0.0, 0.0]


def test_ray_launcher_sweep_joins_the_running_cluster(two_nodes, tiny_model, tmp_path, monkeypatch):
    """hydra/launcher=ray_cluster with the cluster's address: both jobs run as Ray tasks of that cluster and
    place their roles (an HF rollout actor and a learner, half a CPU each) on its nodes."""
    for k, v in AUTH.items():
        monkeypatch.setenv(k, v)
    sweep = tmp_path / "sweep"
    proc = run_train(
        [
            "-m",
            "hydra/launcher=ray_cluster",
            f"hydra.launcher.ray.init.address={two_nodes.address}",
            "algorithm=grpo,pg",
            *tiny_args(tiny_model, in_process=False),
            "cluster.rollout_backend=hf",
            "cluster.cpus_per_actor=0.5",
            "cluster.cpus_per_learner=0.5",
            "cluster.learner_threads=1",
            "run.steps=1",
            "run.prompts_per_step=2",
            "algorithm.group_size=2",
            "eval.size=0",
            "checkpoint.interval=0",
            "model.max_new_tokens=4",
            "logger=none",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=600,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "Ray Launcher is launching 2 jobs" in text
    assert "(_run_job pid=" in text  # the jobs ran inside Ray tasks, not in this process
    assert "Started a local Ray instance" not in text  # neither the launcher nor a job started a Ray of its own
    # each job's placement map, in the job's own run log (rl/logs.py)
    placed = {(job, *key): node for job in ("0", "1") for key, node in placements(log_of(sweep / job)).items()}
    assert len(placed) == 4, text[-3000:]  # 2 jobs x (actor, learner)
    assert set(placed.values()) <= {two_nodes.head[:12], two_nodes.worker[:12]}
    for job in ("0", "1"):
        assert [r["step"] for r in metric_rows(sweep / job, timings=True) if "train/loss" in r] == [1]
    with (sweep / "sweep_summary.csv").open() as f:
        assert [(r["overrides"], r["status"]) for r in csv.DictReader(f)] == [
            ("algorithm=grpo", "done"),
            ("algorithm=pg", "done"),
        ]


class KilledOnceVLLM(VLLMRollout):
    """A vLLM rollout actor that kills its own process with SIGKILL when its first training generate call after
    the first adapter sync starts (step 2's rollouts: max_tokens is the run's 8, the sync probe samples 16). The
    marker file, created exclusively, records the pid, so its restart does not do it again."""

    marker = ""  # set on a subclass made per run (the class travels to the actor by value)

    def generate(self, prompts, sampling, seeds=None):
        if self.version >= 1 and sampling.max_tokens == 8:
            sigkill_self_once(self.marker)
        return super().generate(prompts, sampling, seeds)


class Env:
    def train_items(self):
        return [{"messages": [{"role": "user", "content": f"Count to {i}."}], "answer": ""} for i in range(12)]

    def eval_items(self):
        return []


def killed_actor_run(address: str, model: str, run_dir: str) -> None:
    """The driver of the fault test, run in a child process (`python -c`): Ray reads RAY_AUTH_MODE once per
    process, and the test process itself never joins the cluster. One vLLM actor and one learner (a CPU each: a
    node each) train 3 steps with rl.rollout.rollout_class patched to KilledOnceVLLM; writes the prompt groups of
    every optimizer step and the ones the data order says to `trained.json` in run_dir."""
    from transformers import AutoTokenizer

    import rl.rollout
    from rl import app
    from rl.config.choices import DType
    from rl.config.cluster import ClusterConfig
    from rl.config.schema import AlgorithmConfig, CheckpointConfig, EvalConfig, ModelConfig, RunConfig, TrainConfig
    from rl.loop import driver
    from rl.loop.driver import prompt_data
    from rl.metrics import MetricsLogger
    from rl.resolve import resolve

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    cfg = TrainConfig(
        run=RunConfig(steps=3, prompts_per_step=2, sync_probe_threshold=0.01),
        eval=EvalConfig(size=0),
        checkpoint=CheckpointConfig(interval=0),
        algorithm=AlgorithmConfig(group_size=2),
        model=ModelConfig(path=model, dtype=DType.float32, learner_dtype=DType.float32, max_new_tokens=8, lora_rank=4),
        cluster=ClusterConfig(
            address=address,
            cpus_per_actor=1,
            cpus_per_learner=1,
            actor_threads=1,
            learner_threads=1,
            gpu_memory_utilization=0.1,
            actor_max_restarts=1,
        ),
    )
    killer = type("KilledOnceVLLMHere", (KilledOnceVLLM,), {"marker": str(Path(run_dir) / "killed.pid")})
    rl.rollout.rollout_class = lambda backend: killer  # app.build_runtime looks it up at call time
    cfg = resolve(cfg, Path(run_dir), model_path=model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    logger = MetricsLogger(Path(run_dir), kind="none", total_steps=cfg.run.steps)
    trained: list[list[list[int]]] = []
    runtime, teardown = app.build_runtime(cfg)
    try:
        real_step = runtime.submit_train_step  # the driver starts every learners' step through it
        runtime.submit_train_step = lambda samples: (
            trained.append([list(p) for p in dict.fromkeys(tuple(s.prompt_ids) for s in samples)]),
            real_step(samples),
        )[1]
        driver.train(cfg, runtime, tokenizer, Env(), LengthReward(), logger, resolved={})
    finally:
        teardown()
        logger.close()
    data = prompt_data(Env().train_items(), tokenizer, cfg)
    expected = [[list(data.prompt_ids[i]) for i in data.next_batch(2)] for _ in range(cfg.run.steps)]
    (Path(run_dir) / "trained.json").write_text(json.dumps({"trained": trained, "expected": expected}))


def test_killed_vllm_actor_is_restarted_and_every_prompt_is_trained_once(two_nodes, tiny_model, tmp_path):
    """The vLLM actor dies by SIGKILL at step 2; with no other actor the run waits for Ray's restart (a new vLLM
    engine on the same node), sends it the current adapter first and generates step 2's prompts again, so every
    prompt is trained once and the restarted engine runs the learner's adapter (the sync probe)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = "import sys; from tests.integration.test_multinode import killed_actor_run as f; f(*sys.argv[1:])"
    proc = subprocess.run(
        [sys.executable, "-c", code, two_nodes.address, str(tiny_model), str(run_dir)],
        cwd=REPO,
        env=repo_env(**AUTH),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    placed = placements(proc.stdout)
    assert placed["actor", 0] != placed["learner", 0]
    assert set(placed.values()) == {two_nodes.head[:12], two_nodes.worker[:12]}
    result = json.loads((run_dir / "trained.json").read_text())
    assert result["trained"] == result["expected"]  # every prompt of every step, once, in order
    assert (run_dir / "killed.pid").is_file()  # it really was killed
    metrics = metric_rows(run_dir, timings=True)
    assert [r["fault/actor_restarts"] for r in metrics] == [0.0, 1.0, 0.0]
    # the restarted engine got the adapter before its first work: steps 2 and 3 sample versions 1 and 2
    assert [r["actor/adapter_version"] for r in metrics] == [0.0, 1.0, 2.0]
    assert all(r["sync/logprob_abs_diff"] < 0.01 for r in metrics)  # it runs the learner's adapter
    assert "rollout actor 0 died during generate" in proc.stdout
    assert "Ray restarts it (restart 1 of 1)" in proc.stdout
    assert "rollout actor 0 is back after its restart; adapter version 1 sent first" in proc.stdout
