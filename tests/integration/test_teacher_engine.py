"""The judge/teacher engine (rl/rollout/teacher.py) on a real vLLM CPU engine: the logprobs it gives a completion
are the ones the same weights gave the tokens while sampling them (so a teacher equal to the student is 0 nats
away), a teacher adapter moves them, and its verdicts are text."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.tier2]  # about 60 s each on the 2-core machine: the second tier

SCRIPT = r"""
import json, os, sys
from rl.rollout.vllm import cpu_threads_env
from rl.app import teacher_args
from rl.rollout.teacher import TeacherEngine
from rl.types import Sampling
from rl.resolve import from_overrides

if __name__ == "__main__":  # vLLM may spawn its engine process
    os.environ.update(cpu_threads_env(None))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cfg = from_overrides(sys.argv[1], "model.dtype=float32", "model.max_prompt_tokens=64", "model.max_new_tokens=12",
                         "cluster.num_teachers=1", "cluster.gpu_memory_utilization=0.05", *sys.argv[2:])
    t = TeacherEngine(**teacher_args(cfg))
    prompts = [[1, 520, 1314, 42], [1, 7, 8, 9, 10, 11]]
    rollouts = t.generate(prompts, Sampling(n=2, temperature=1.0, max_tokens=12), [3, 4])
    pairs = [(r.prompt_ids, c) for r in rollouts for c in r.completions]
    scored = t.token_logprobs([p for p, _ in pairs], [c.token_ids for _, c in pairs])
    print("OUT " + json.dumps({"sampled": [c.logprobs for _, c in pairs], "scored": scored,
                               "texts": [c.text for _, c in pairs]}))
    t.close()
"""


def run_engine(model, *overrides: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model), *overrides], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("OUT "))[4:])


def test_teacher_logprobs_of_a_completion_equal_the_sampling_logprobs_of_the_same_weights(tiny_model):
    out = run_engine(tiny_model)
    assert all(isinstance(t, str) for t in out["texts"])
    for sampled, scored in zip(out["sampled"], out["scored"]):
        assert len(sampled) == len(scored) > 0
        assert max(abs(a - b) for a, b in zip(sampled, scored)) < 1e-3


def test_a_teacher_adapter_is_merged_into_the_teacher(tiny_model, tmp_path):
    """teacher.adapter: the same base plus an adapter is another model (its samples and their logprobs differ from
    the base's), and its token logprobs are the adapted model's own."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny_model)),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1.0)
    model.save_pretrained(tmp_path / "adapter")
    base, adapted = run_engine(tiny_model), run_engine(tiny_model, f"teacher.adapter={tmp_path / 'adapter'}")
    assert base["sampled"] != adapted["sampled"]
    for sampled, scored in zip(adapted["sampled"], adapted["scored"]):
        assert max(abs(a - b) for a, b in zip(sampled, scored)) < 1e-3
