"""bench/learner.py's sweep-pack sides on the tiny model, in this process: both step every job on its own samples
(the tokens/s numerator is all jobs' tokens), the grouped side in one forward per micro-batch over the jobs' rows,
and a pack whose learner refuses to group its jobs fails the grouped side with the learner's reason; the side
that switches the KL reference with PEFT's `disable_adapter()` differs from ours_full in nothing else."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from bench import learner as bench_learner
from rl.app import learner_args
from tests.helpers import LEARNER_TEST_OVERRIDES, make_samples, run_spec

SMALL = ["--threads", "1", "--dtype", "float32", "--rank", "4", "--groups", "2", "--group-size", "2"]
SMALL += ["--jobs", "3", "--micro-batch-size", "2", "--repeats", "1"]


def side_row(model, side: str) -> dict:
    return bench_learner.run_side(bench_learner.parser().parse_args([*SMALL, "--model", str(model), "--side", side]))


def test_pack_sides_step_every_job_on_its_own_samples_grouped_or_one_after_another(tiny_model):
    grouped, each = side_row(tiny_model, "ours_pack_grouped"), side_row(tiny_model, "ours_pack_each")
    for row in (grouped, each):
        assert row["jobs"] == 3 and row["samples"] == 3 * 2 * 2 and len(row["step_s"]) == 1
    args = bench_learner.parser().parse_args(SMALL)
    args.vocab = min(AutoConfig.from_pretrained(tiny_model).vocab_size, 32000)  # as the side draws its token ids
    per_job = [bench_learner.make_samples(args, seed=j) for j in range(3)]
    assert per_job[0] != per_job[1]  # each job its own samples
    assert (
        grouped["tokens"]
        == each["tokens"]
        == sum(len(s.prompt_ids) + len(s.completion_ids) for b in per_job for s in b)
    )
    assert grouped["grouped_jobs"] == 3 and each["grouped_jobs"] == 1
    assert grouped["micro_batches"] == 2 and each["micro_batches"] == 3 * 2  # forwards per timed step


def test_the_grouped_side_fails_with_the_learners_reason_when_it_steps_job_after_job(tiny_model):
    jobs = [
        learner_args(run_spec(tiny_model, *LEARNER_TEST_OVERRIDES, "model.lora_dropout=0.1", f"run.seed={j}"))
        for j in range(2)
    ]
    steps = bench_learner.PackSteps(jobs, grouped=True)
    batches = [make_samples(groups=1, group_size=2, seed=j) for j in range(2)]
    with pytest.raises(SystemExit, match="did not group the 2 jobs' steps: model.lora_dropout>0"):
        steps.train_step(batches)


def test_the_unsloth_backend_builds_the_demos_4bit_learner_and_refuses_the_raw_side(tiny_model):
    args = bench_learner.parser().parse_args([*SMALL, "--backend", "unsloth", "--device", "cuda"])
    kwargs = bench_learner.ours_args(args, str(tiny_model), share_prompt_prefix=False)
    assert kwargs["model"].learner_backend.value == "unsloth" and kwargs["model"].load_in_4bit
    with pytest.raises(SystemExit, match="drop `raw` from --sides"):
        bench_learner.compare(bench_learner.parser().parse_args([*SMALL, "--backend", "unsloth", "--sides", "raw"]))


def test_the_peft_switch_side_differs_from_ours_full_only_in_how_the_reference_is_switched(tiny_model, monkeypatch):
    """`ours_full_peft_switch` times PEFT's `disable_adapter()` for the KL reference: it is entered once per
    micro-batch, and the step's loss and metrics equal ours_full's (the same reference, reached another way)."""
    args = bench_learner.parser().parse_args([*SMALL, "--model", str(tiny_model), "--kl", "0.1"])
    args.vocab = min(AutoConfig.from_pretrained(tiny_model).vocab_size, 32000)
    samples = bench_learner.make_samples(args)
    ours = bench_learner.build_side("ours_full", args, str(tiny_model))
    peft = bench_learner.build_side("ours_full_peft_switch", args, str(tiny_model))
    entered = 0
    disable_adapter = type(peft.model).disable_adapter

    def counted(self):
        nonlocal entered
        entered += 1
        return disable_adapter(self)

    monkeypatch.setattr(type(peft.model), "disable_adapter", counted)
    a = ours.train_step(samples)
    assert entered == 0
    b = peft.train_step(samples)
    assert entered == 2  # 4 samples in micro-batches of 2
    drop = ("time/", "memory/", "perf/")
    assert {k: v for k, v in a.items() if not k.startswith(drop)} == {
        k: v for k, v in b.items() if not k.startswith(drop)
    }
