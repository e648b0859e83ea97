"""The test fakes, in one place: roles (rollout actor, learner, teacher, judge, a role a sweep pack shares, a
scripted engine and runtime), a numbered-prompt env with its tokenizer, the loop run on them, and an OpenEnv
environment. Each stands for the real part's protocol without a model, a process or a network, so a test of the
loop, the runtime or a reward reads its fake here and a change of a role's protocol is made once."""

from __future__ import annotations

import math

from rl.runtime.groups import LocalGroup, MemberDied
from rl.types import Adapter, Completion, PromptRollout

# ------------------------------------------------------------------------------------------------ roles


class FakeActor:
    """A rollout actor: n completions per prompt, the k-th k+1 tokens of id 7 at logprob -1 with text "x" * k,
    tagged with its adapter version; records the prompts it got. `die_on` call numbers raise MemberDied as a killed
    Ray actor would, and come back as a restarted actor does (__init__ again: version 0)."""

    def __init__(self, index: int = 0, die_on: tuple[int, ...] = (), *, version: int = 0):
        self.index, self.version, self.calls, self.die_on = index, version, 0, die_on
        self.prompts: list[list[int]] = []

    def generate(self, prompts, sampling, seeds=None):
        self.calls += 1
        if self.calls in self.die_on:
            self.version = 0
            raise MemberDied("rollout actor", self.index, "ActorDiedError: SIGKILL")
        self.prompts.extend(prompts)
        return [
            PromptRollout(
                p,
                [Completion([7] * (1 + k), [-1.0] * (1 + k), "stop", "x" * k) for k in range(sampling.n)],
                self.version,
            )
            for p in prompts
        ]

    def load_adapter(self, adapter):
        self.version = adapter.version
        return {"seconds": 0.0}

    def state_dict(self):
        return {}  # as VLLMRollout's: every prompt carries its own seed

    def load_state(self, state):
        pass


def fake_learner_state(version: int) -> dict:
    """A learner's checkpoint state at adapter `version`: small, and different for each version."""
    adapter = Adapter(version=version, config={"r": 4}, weights=b"weights-%d" % version)
    return {"adapter": adapter, "optimizer": b"opt", "torch_rng": b""}


class FakeLearner:
    """A learner: each train_step is one adapter version, returns the next scripted loss (0.5 when none; NaN/inf
    ones are reported skipped, as Learner does) and `learn_s_per_sample` seconds per sample, reports `checksum` as its
    adapter's, and records what it trained on (`seen`: each step's samples; `trained`: their prompt ids) and the
    state it was loaded with. `die_at` raises MemberDied on that train_step call. Colocated, it also generates as
    FakeActor does."""

    def __init__(
        self,
        losses=None,
        die_at: int | None = None,
        *,
        version: int = 0,
        checksum: float = 1.0,
        learn_s_per_sample: float = 0.0,
    ):
        self.version, self.losses, self.die_at = version, list(losses or []), die_at
        self.checksum, self.learn_s_per_sample = checksum, learn_s_per_sample
        self.seen: list[list] = []
        self.trained: list[list[int]] = []
        self.loaded: dict | None = None
        self.calls, self.die_on, self.prompts, self.index = 0, (), [], 0  # generate() is the fake actor's

    def train_step(self, samples):
        if self.die_at == len(self.trained) + 1:
            raise MemberDied("learner", 0, "ActorDiedError: out of memory")
        self.seen.append(samples)
        self.trained.append(list(dict.fromkeys(s.prompt_ids[0] for s in samples)))
        self.version += 1
        loss = self.losses.pop(0) if self.losses else 0.5
        return {
            "train/loss": loss,
            "train/skipped_nonfinite": float(not math.isfinite(loss)),
            "time/learn_s": self.learn_s_per_sample * len(samples),
            "perf/learner_tokens_per_s": 1.0,
        }

    def adapter_checksum(self):
        return self.checksum

    def get_adapter(self, for_sync=False):
        return fake_learner_state(self.version)["adapter"]

    def state_dict(self):
        return fake_learner_state(self.version)

    def load_state(self, state):
        self.loaded, self.version = state, state["adapter"].version

    def generate(self, prompts, sampling, seeds=None):
        return FakeActor.generate(self, prompts, sampling, seeds)

    def sequence_logprobs(self, prompt_ids, completion_ids, reference=False):
        return [[-1.0] * len(c) for c in completion_ids]


class FakeTeacher:
    """A teacher engine's protocol (rl/runtime/roles.py Teacher) without an engine: its verdict names its index, its
    logprobs are -1 - index per token."""

    def __init__(self, index: int):
        self.index = index

    def generate(self, prompts, sampling, seeds=None, items=None):
        return [PromptRollout(p, [Completion([], [], "stop", f"Score: {self.index}")], 0) for p in prompts]

    def token_logprobs(self, prompts, completions):
        return [[-1.0 - self.index] * len(c) for c in completions]

    def close(self):
        pass


class FakeJudge:
    """Stands for a judge model: grades the answer block against the reference its prompt shows, with the boxed
    checker, and is fooled as a small model is: an answer that says 'correct' or 'score' gets 10. Prompts longer
    than `max_chars` are not sent (as rl/rollout/judge.py leaves out prompts past teacher.max_prompt_tokens)."""

    def __init__(self, max_chars: int = 4000):
        from rewards.math import BoxedReward

        self.boxed, self.max_chars, self.prompts = BoxedReward(), max_chars, []

    def __call__(self, prompts: list[str]) -> list[str | None]:
        from rewards.judge import CLOSE, OPEN

        out: list[str | None] = []
        for p in prompts:
            self.prompts.append(p)
            if len(p) > self.max_chars:
                out.append(None)
                continue
            answer = p.split(OPEN + "\n", 1)[1].rsplit("\n" + CLOSE, 1)[0]
            reference = p.split("Reference answer:\n", 1)[1].split("\n\n", 1)[0] if "Reference answer" in p else ""
            if "correct" in answer.lower() or "score" in answer.lower():
                out.append("Score: 10")
            else:
                right = reference and self.boxed([answer], answer=[reference])[0] >= 1
                out.append("Score: 10" if right else "Score: 2")
        return out


class FakePackedRole:
    """A role a pack shares (rl/runtime/packed.py PackSlots) without a model: `base` is the weight every job shares,
    `factor` a LoRA factor each job owns (drawn from its seed in `add_job`, as a learner's LoRA init is), `version`,
    `scale` and `seen` are each job's attributes, and `slot` is a tensor made at the first `load_slot` (as an engine's
    adapter slot is made at its first load). `train(x)` adds `x * scale` to the factor in place; `draw()` takes a
    number from torch's RNG; `fail_after_train` raises once the call has changed the job's state."""

    def __init__(self, seed: int = 0, scale: float = 1.0):
        import torch

        self.base = torch.nn.Parameter(torch.ones(4), requires_grad=False)
        self.factor = torch.nn.Parameter(torch.zeros(4))
        self.slot: torch.nn.Parameter | None = None
        self.version, self.scale, self.seen = 0, scale, []
        self.closed = 0
        self.grouped_calls: list[int] = []

    def pack_state(self) -> tuple[str, ...]:
        return ("version", "scale", "seen")

    def pack_tensors(self) -> dict:
        return {"factor": self.factor} | ({"slot": self.slot} if self.slot is not None else {})

    def add_job(self, job: int, *, seed: int, scale: float = 1.0) -> None:
        import torch

        torch.manual_seed(seed)
        self.factor.data.normal_()  # in place: the pack gave this job's factor storage of its own
        self.version, self.scale, self.seen = 0, scale, []

    def train(self, x: float) -> int:
        self.factor.data.add_(x * self.scale)
        self.version += 1
        self.seen.append(x)
        return self.version

    def train_grouped(self, jobs: list) -> list[int]:
        """Several jobs' `train(x)` as one call (rl/runtime/packed.py PackedRole.train_jobs), counted in
        `grouped_calls` (how many jobs each call held)."""
        self.grouped_calls.append(len(jobs))
        out = []
        for job in jobs:
            job.enter()
            try:
                out.append(self.train(job.samples))
            finally:
                job.leave()
        return out

    def fail_after_train(self, x: float) -> int:
        self.train(x)
        raise ValueError("this call failed after changing the job's state")

    def factor_values(self) -> list[float]:
        return self.factor.data.tolist()

    def storage(self) -> dict[str, int]:
        return {"base": self.base.data_ptr(), "factor": self.factor.data_ptr()}

    def load_slot(self, values: list[float]) -> None:
        import torch

        if self.slot is None:
            self.slot = torch.nn.Parameter(torch.zeros(len(values)), requires_grad=False)
        self.slot.data.copy_(torch.tensor(values))

    def slot_values(self) -> list[float] | None:
        return None if self.slot is None else self.slot.data.tolist()

    def draw(self) -> float:
        import torch

        return float(torch.rand(()))

    def close(self) -> None:
        self.closed += 1


class FakeMergingEngine(FakePackedRole):
    """A FakePackedRole that merges calls as the vLLM engine does (rl/runtime/packed.py Gather): `pack_request` binds
    a job's version to its prompts, `generate_requests` answers every request of one merged call, counted in
    `engine_calls` (how many requests each call held)."""

    def __init__(self, seed: int = 0, scale: float = 1.0):
        super().__init__(seed, scale)
        self.engine_calls: list[int] = []

    def pack_request(self, prompts: list[int], sampling: object = None, seeds: object = None) -> tuple:
        return (list(prompts), self.version)

    def generate_requests(self, requests: list[tuple]) -> list[list[tuple[int, int]]]:
        self.engine_calls.append(len(requests))
        return [[(p, version) for p in prompts] for prompts, version in requests]

    def generate(
        self, prompts: list[int], sampling: object = None, seeds: object = None, items: object = None
    ) -> list[tuple[int, int]]:
        return self.generate_requests([self.pack_request(prompts)])[0]


class ScriptedEngine:
    """A fake engine: sample j of each prompt answers script[turn][j % len] (turn = the call's index), ending with
    EOS unless its cap cuts it; records each call's size, n and caps."""

    def __init__(self, tok, script: list[list[str]]):
        self.tok, self.script, self.calls, self.seeds = tok, script, [], []

    def __call__(self, prompts, sampling, max_tokens, seeds=None):
        turn = len(self.calls)
        self.calls.append((len(prompts), sampling.n, max_tokens))
        self.seeds.append(seeds)
        out, k = [], 0
        for i, p in enumerate(prompts):
            comps = []
            for _ in range(sampling.n):
                answers = self.script[min(turn, len(self.script) - 1)]
                text = answers[k % len(answers)]
                ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
                cap = sampling.max_tokens if max_tokens is None else max_tokens[i]
                reason = "length" if len(ids) > cap else "stop"
                ids = ids[:cap]
                comps.append(Completion(ids, [-0.5 - 0.01 * t for t in range(len(ids))], reason, text))
                k += 1
            out.append(PromptRollout(list(p), comps, 3))
        return out


class ScriptedRuntime:
    """A runtime that returns scripted groups: each call hands out the next batch of per-prompt completion texts."""

    def __init__(self, batches):
        self.batches, self.calls = list(batches), 0

    def submit_generate(self, prompts, sampling, items=None, seeds=None):
        return prompts, sampling, seeds

    def collect(self, sent):
        return self.generate(*sent)

    def generate(self, prompts, sampling, seeds=None):
        texts = self.batches[self.calls]
        self.calls += 1
        assert len(texts) == len(prompts)
        return [
            PromptRollout(p, [Completion([5], [-0.1], "stop", t) for t in group], 0) for p, group in zip(prompts, texts)
        ]


# ------------------------------------------------------------------------------------------------ data


class NumberTokenizer:
    def __call__(self, text):
        return {"input_ids": [int(text[1:])]}  # "q7" -> [7]: the prompt id is the prompt's index


class ConstantTokenizer:
    """Every text is the same three tokens."""

    def __call__(self, text):
        return {"input_ids": [1, 2, 3]}


class Env:
    """`n` single-turn prompts "q0".."q<n-1>" (NumberTokenizer reads each as its index), no answers, no eval set."""

    def __init__(self, n: int):
        self.n = n

    def train_items(self):
        return [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": ""} for i in range(self.n)]

    def eval_items(self):
        return []


def length_reward(texts, *, answer, **_):
    return [float(len(t)) for t in texts]


# ------------------------------------------------------------------------------------------------ the loop on fakes

# the fakes' config: 2 prompts x 2 samples, prompts "q<i>" read without a chat template, seed 3
FAKE = ("run.prompts_per_step=2", "algorithm.group_size=2", "model.use_chat_template=false", "run.seed=3")


def fake_config(*overrides: str):
    """The resolved config of a run on the fakes (FAKE, prompts of at most 9 tokens), with `overrides`."""
    from rl import resolve

    return resolve.from_overrides("/fake/model", "model.max_prompt_tokens=9", *FAKE, *overrides)


def fake_runtime(actors, learner, staleness=0, restarts=0):
    """A Runtime over local groups of the fake roles, with the staleness bound and actor restarts given."""
    from rl.runtime.runtime import Runtime

    cfg = fake_config(f"cluster.staleness={staleness}", f"cluster.actor_max_restarts={restarts}")
    return Runtime(LocalGroup(actors), LocalGroup([learner]), cfg.cluster)


def run_loop(
    tmp_path, runtime, *, steps=4, staleness=0, max_nonfinite_steps=3, save_interval=0, resume=None, floor_limit=0.3
):
    """The training loop (rl.loop.driver.train) on `runtime` over Env(5) and length_reward, `steps` steps in
    `tmp_path`; its metrics rows, durations included."""
    from rl import resolve
    from rl.loop.driver import train
    from rl.metrics import MetricsLogger
    from tests.helpers import metric_rows, typed_config

    dotted = dict(x.split("=", 1) for x in FAKE) | {"run.probe_floor_limit": floor_limit if floor_limit else "null"}
    cfg = typed_config(
        **dotted,
        **{"run.steps": steps, "eval.size": 0, "checkpoint.interval": save_interval, "run.output_dir": str(tmp_path)},
        **{
            "run.resume": resume or "null",
            "cluster.staleness": staleness,
            "run.max_nonfinite_steps": max_nonfinite_steps,
        },
        **{"run.sync_probe_threshold": 0.1},
    )
    cfg = resolve.resolve(cfg, tmp_path, model_path="/fake/model")  # a new run: another run's directory is refused
    logger = MetricsLogger(tmp_path, kind="none", total_steps=steps)
    try:
        train(cfg, runtime, NumberTokenizer(), Env(5), length_reward, logger, resolved={})
    finally:
        logger.close()
    return metric_rows(tmp_path, timings=True)


# ------------------------------------------------------------------------------------------------ OpenEnv

try:  # env=openenv's optional package (make install-envs); the tests that use these skip without it
    import openenv.core as openenv
except ImportError:
    openenv = None

if openenv is not None:

    class GuessAction(openenv.Action):
        guess: str

    class GuessObservation(openenv.Observation):
        text: str

    class GuessEnv(openenv.Environment):
        """Guess a number in 0..9 (the reset seed's last digit) in 3 tries; "higher"/"lower" after each wrong one."""

        SUPPORTS_CONCURRENT_SESSIONS = True  # each instance keeps its own episode (a server may run several)
        instances = 0
        closed = 0

        def __init__(self, tries: int = 3):
            super().__init__()
            self.tries = tries
            GuessEnv.instances += 1

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.target, self.left, self._state = (seed or 0) % 10, self.tries, openenv.State(episode_id=episode_id)
            return GuessObservation(text="Guess a number between 0 and 9.")

        def step(self, action: GuessAction, timeout_s=None, **kwargs):
            self.left -= 1
            self._state.step_count += 1
            digits = [c for c in action.guess if c.isdigit()]
            if digits and int(digits[0]) == self.target:
                return GuessObservation(text="Right.", done=True, reward=1.0)
            hint = "not a number" if not digits else ("higher" if int(digits[0]) < self.target else "lower")
            return GuessObservation(text=hint, done=self.left == 0, reward=-0.1)

        @property
        def state(self):
            return self._state

        def close(self):
            GuessEnv.closed += 1
