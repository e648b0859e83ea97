"""Run a reward safely: a hard per-sample timeout, scoring in worker processes, and error counting.

The rule-based reward configs (conf/reward/: boxed, boxed_format, think_answer_tags, seed_10_5_0, callable, the
boxed half of judge_boxed, and format_strict and format_soft with `workers: 0`) wrap their reward in `RewardRunner`,
so that reward cannot crash a run, nor with workers stall it: an exception, a non-finite score or a sample past
`timeout_s` scores 0 and is counted; the driver logs the counts as `reward/errors` and `reward/timeouts`
(`pop_metrics`). The others are not wrapped:
code_tests runs each program in the sandbox under its own limits (envs/sandbox.py), judge asks the judge engines
(which a worker does not have), episode reads the terms the env computed, and reasoning_gym calls its task's scorer
in the driver's process.

Workers are spawned (not forked: the driver holds Ray and torch threads) on the first call and reused. A worker
stuck on one sample (math-verify/sympy can hang on adversarial strings) is killed and replaced; the other
workers keep going. A worker whose process dies on a sample (a crash, os._exit, the OOM killer) is replaced the
same way and the sample scores 0, counted in `reward/errors`; only when a fresh worker cannot even start does
scoring fall back to this process. With `workers=0` scoring runs in this process and the timeout is math-verify's own
(signal-based, main thread only); a plain Python reward that hangs then hangs the run.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from rewards.combine import load_callable, score_sample
from rewards.protocol import Judge, UsesJudge, needs_judge

log = logging.getLogger(__name__)
_MAX_LOGGED = 5  # errors logged with their message; later ones are only counted
STARTUP_TIMEOUT_S = 120.0  # a worker that has not imported its reward by then counts as unable to start


def _worker_loop(conn: Connection, reward: Callable) -> None:
    from rewards.math import RewardTimeout

    conn.send("ready")  # imports done: from now on a sample's deadline measures scoring, not start-up
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg is None:
            return
        idx, completion, answer, extra = msg
        try:
            conn.send((idx, score_sample(reward, completion, answer, extra), None, ""))
        except RewardTimeout as e:
            conn.send((idx, 0.0, "timeout", str(e)))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which counts it
            conn.send((idx, 0.0, "error", f"{type(e).__name__}: {e}"[:300]))


class _Worker:
    def __init__(self, ctx: Any, reward: Callable):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_loop, args=(child, reward), daemon=True, name="reward-worker")
        self.proc.start()
        child.close()
        self.job: int | None = None  # sample index in flight
        self.deadline = math.inf

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until the worker has started (a spawned process imports torch, sympy, ...: seconds on a busy
        machine). Per-sample deadlines only start after this, so slow start-up never reads as a timeout."""
        try:
            return self.conn.poll(timeout_s) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            return False

    def stop(self, kill: bool = False) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                kill = True
        self.proc.join(timeout=0 if kill else 2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


class RewardRunner:
    """Wrap `reward` (an object or a dotted path to a callable) for safe, parallel scoring.

    workers: worker processes (0 = score in this process). timeout_s: hard limit per sample in a worker.
    Call it like any reward; `pop_metrics()` returns and resets the error and timeout counts. When workers
    die before scoring anything (they cannot start), scoring falls back to this process, with a warning.
    """

    def __init__(self, reward: Any, workers: int = 2, timeout_s: float = 10.0, start_method: str = "spawn"):
        if workers < 0:
            raise ValueError(f"reward.workers must be >= 0 (got {workers}); 0 scores in the driver process")
        if not 0 < timeout_s < math.inf:  # NaN or infinity would leave a stuck sample stuck
            raise ValueError(f"reward.timeout_s must be a number of seconds > 0 (got {timeout_s})")
        self.reward = load_callable(reward)
        self.workers, self.timeout_s, self.start_method = workers, timeout_s, start_method
        self.errors = self.timeouts = 0
        self._logged = 0
        self._pool: list[_Worker] = []

    # a runner can be pickled (e.g. sent to a Ray actor); its worker processes stay behind
    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": []}

    def __call__(self, completions: list[str], *, answer: list[Any], **kwargs) -> list[float]:
        n = len(completions)
        if len(answer) != n:
            raise ValueError(f"reward got {n} completions but {len(answer)} answers")
        extras = [
            {k: (v[i] if isinstance(v, list | tuple) and len(v) == n else v) for k, v in kwargs.items()}
            for i in range(n)
        ]
        if self.workers == 0:
            return [self._in_process(completions[i], answer[i], extras[i]) for i in range(n)]
        return self._in_workers(completions, answer, extras)

    batched = True  # a batch call fans out over its workers (rewards.combine.WeightedSum calls it once per batch)

    @property
    def needs_judge(self) -> bool:
        return needs_judge(self.reward)

    def bind_judge(self, judge: Judge) -> None:
        """A model judge cannot run here: the workers are separate processes without the run's judge engines."""
        if isinstance(self.reward, UsesJudge):
            raise ValueError(
                "a judge reward cannot run inside rewards.runner.RewardRunner (its workers have no judge engine): "
                "put it beside the runner as a term of rewards.combine.WeightedSum (conf/reward/judge_boxed.yaml)"
            )

    def pop_metrics(self) -> dict[str, float]:
        out = {"reward/errors": float(self.errors), "reward/timeouts": float(self.timeouts)}
        self.errors = self.timeouts = 0
        return out

    def close(self) -> None:
        for w in self._pool:
            w.stop()
        self._pool = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ---------------------------------------------------------------------------------------------- internals

    def _record(self, kind: str | None, msg: str, score: float) -> float:
        if kind is None and not math.isfinite(score):
            kind, msg = "error", f"non-finite score {score}"
        if kind is None:
            return score
        if kind == "timeout":
            self.timeouts += 1
        else:
            self.errors += 1
        if self._logged < _MAX_LOGGED:
            self._logged += 1
            log.warning("reward %s (scored 0, counted in reward/%ss): %s", kind, kind, msg)
        return 0.0

    def _in_process(self, completion: str, answer: Any, extra: dict) -> float:
        from rewards.math import RewardTimeout

        try:
            return self._record(None, "", score_sample(self.reward, completion, answer, extra))
        except RewardTimeout as e:
            return self._record("timeout", str(e), 0.0)
        except Exception as e:  # noqa: BLE001
            return self._record("error", f"{type(e).__name__}: {e}"[:300], 0.0)

    def _start_pool(self) -> bool:
        """Start workers up to `self.workers`; False if one could not start (the caller falls back)."""
        ctx = mp.get_context(self.start_method)
        new = [_Worker(ctx, self.reward) for _ in range(self.workers - len(self._pool))]
        self._pool.extend(new)
        return all(w.wait_ready(STARTUP_TIMEOUT_S) for w in new)

    def _in_workers(self, completions: list[str], answer: list[Any], extras: list[dict]) -> list[float]:
        scores = [0.0] * len(completions)
        if not self._start_pool():
            return self._fall_back(
                self._pool[-1], {}, list(range(len(completions))), completions, answer, extras, scores
            )
        todo = list(range(len(completions)))[::-1]
        busy: dict[Connection, _Worker] = {}
        while todo or busy:
            for w in list(self._pool):
                if w.job is None and todo:
                    i = todo.pop()
                    try:
                        w.conn.send((i, completions[i], answer[i], extras[i]))
                    except OSError:  # it died while idle (killed from outside): replace it, the sample waits
                        todo.append(i)
                        if not self._replace(w):
                            return self._fall_back(self._pool[-1], busy, todo, completions, answer, extras, scores)
                        continue
                    w.job, w.deadline = i, time.monotonic() + self.timeout_s
                    busy[w.conn] = w
            if not busy:
                continue
            wait_s = max(0.0, min(w.deadline for w in busy.values()) - time.monotonic())
            for conn in cast(list[Connection], wait(list(busy), timeout=wait_s)):
                w = busy.pop(conn)
                try:
                    i, score, kind, msg = conn.recv()
                except (EOFError, OSError):  # the worker died on this sample (a crash, os._exit, out of memory)
                    w.proc.join(timeout=1)
                    msg = f"reward worker died on a sample (exit code {w.proc.exitcode}); worker replaced"
                    scores[w.job] = self._record("error", msg, 0.0)
                    if not self._replace(w):  # a replacement cannot start: score the rest here
                        return self._fall_back(self._pool[-1], busy, todo, completions, answer, extras, scores)
                    continue
                scores[i] = self._record(kind, msg, float(score))
                w.job = None
            now = time.monotonic()
            for conn, w in list(busy.items()):
                if w.deadline <= now:
                    del busy[conn]
                    scores[w.job] = self._record("timeout", f"sample took over {self.timeout_s}s; worker replaced", 0.0)
                    if not self._replace(w):
                        return self._fall_back(self._pool[-1], busy, todo, completions, answer, extras, scores)
        return scores

    def _fall_back(
        self,
        dead: _Worker,
        busy: dict,
        todo: list[int],
        completions: list[str],
        answer: list[Any],
        extras: list[dict],
        scores: list[float],
    ) -> list[float]:
        log.warning(
            "reward workers exited before scoring anything (exit code %s); scoring in this process (reward.workers=0)",
            dead.proc.exitcode,
        )
        pending = [i for i in (dead.job, *(w.job for w in busy.values()), *todo) if i is not None]
        self.close()
        self.workers = 0
        for i in pending:
            scores[i] = self._in_process(completions[i], answer[i], extras[i])
        return scores

    def _replace(self, w: _Worker) -> bool:
        """Kill `w` and start a fresh worker; False if it could not start."""
        w.stop(kill=True)
        self._pool.remove(w)
        return self._start_pool()
