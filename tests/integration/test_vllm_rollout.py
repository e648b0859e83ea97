"""VLLMRollout.generate against vLLM's own output for the same requests: our path skips vLLM's per-step
detokenisation and per-token logprob objects (decodes once at the end, reads flat logprobs); the texts, token ids
and logprobs must be the ones vLLM itself returns."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, sys
from rl.app import rollout_args
from rl.rollout.vllm import VLLMRollout, cpu_threads_env
from rl.types import Sampling
from rl.resolve import from_overrides

if __name__ == "__main__":  # vLLM may spawn its engine process
    os.environ.update(cpu_threads_env(None))
    from vllm import SamplingParams
    r = VLLMRollout(**rollout_args(from_overrides(sys.argv[1], "model.dtype=float32", "model.max_prompt_tokens=256")))
    prompts = [[1, 520, 1314, 42], [1, 7, 8, 9, 10, 11], [1, 300], [1, 2000, 3000]]
    ours = r.generate(prompts, Sampling(n=1, temperature=0.0, max_tokens=12))
    params = SamplingParams(n=1, temperature=0.0, max_tokens=12, logprobs=0)  # vLLM's defaults: detokenised, dicts
    ref = r.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    rows = []
    for o, pr in zip(ours, ref):
        for c, rc in zip(o.completions, pr.outputs):
            rows.append({
                "ids": [c.token_ids, list(rc.token_ids)],
                "text": [c.text, rc.text],
                "lp": [c.logprobs, [d[t].logprob for t, d in zip(rc.token_ids, rc.logprobs)]],
                "finish": [c.finish_reason, rc.finish_reason],
                "prompt": o.prompt_ids,
            })
    groups = r.generate(prompts[:2], Sampling(n=3, temperature=1.0, max_tokens=12))  # n > 1: grouped per prompt
    grouped = [{"prompt": g.prompt_ids, "n": len(g.completions),
                "decoded": [r.tokenizer.decode(c.token_ids, skip_special_tokens=True) == c.text
                            and len(c.logprobs) == len(c.token_ids) for c in g.completions]} for g in groups]
    print("ROWS " + json.dumps(rows))
    print("GROUPS " + json.dumps(grouped))

    sampling = Sampling(n=4, temperature=1.0, max_tokens=8)
    target, seed = [1, 520, 1314, 42, 7, 8], 12345
    # 40 prompts x 4 samples x 100 tokens: more prompt tokens than one engine step takes (4096 on CPU)
    others = [[1] + [(97 * i + 13 * k) % 5000 + 10 for k in range(99)] for i in range(40)]
    alone = r.generate([target], sampling, [seed])[0]
    crowded = r.generate(others + [target], sampling, list(range(40)) + [seed])[-1]
    again = r.generate([target], sampling, [seed])[0]
    other_seed = r.generate([target], sampling, [seed + 100])[0]
    r.close()
    print("SEEDED " + json.dumps({
        "alone": [c.token_ids for c in alone.completions], "crowded": [c.token_ids for c in crowded.completions],
        "again": [c.token_ids for c in again.completions], "other": [c.token_ids for c in other_seed.completions],
        "lp_alone": [c.logprobs for c in alone.completions], "lp_crowded": [c.logprobs for c in crowded.completions],
    }))
"""


@pytest.fixture(scope="module")
def engine_output(tiny_model) -> dict[str, object]:
    """What one vLLM engine answered to both tests' requests (they only read it): an engine start is most of the
    cost here. Keyed by the script's line tags."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tags = ("ROWS ", "GROUPS ", "SEEDED ")
    return {t.strip(): json.loads(x[len(t) :]) for x in proc.stdout.splitlines() for t in tags if x.startswith(t)}


def test_generate_matches_vllms_own_detokenised_output(engine_output):
    rows = engine_output["ROWS"]
    assert len(rows) == 4
    for row in rows:
        assert row["ids"][0] == row["ids"][1] and len(row["ids"][0]) > 0
        assert row["text"][0] == row["text"][1]
        assert len(row["lp"][0]) == len(row["ids"][0])
        assert row["lp"][0] == pytest.approx(row["lp"][1], abs=1e-6)
        assert row["finish"][0] == ("length" if row["finish"][1] == "length" else "stop")
    assert any(r["text"][0] for r in rows)  # some text was decoded
    groups = engine_output["GROUPS"]
    assert [g["prompt"] for g in groups] == [[1, 520, 1314, 42], [1, 7, 8, 9, 10, 11]]
    assert [g["n"] for g in groups] == [3, 3]
    assert all(all(g["decoded"]) for g in groups)


def test_a_seeded_prompt_samples_the_same_alone_and_in_a_batch_larger_than_an_engine_step(engine_output):
    """Per-request seeds on vLLM CPU: the same tokens for a prompt whatever else is in the call, also when the
    call's prompts do not fit one engine step (vLLM then prefills some prompts in parts; with chunked prefill a
    seeded request cut in two made vLLM rewind its CPU generator, which has no offset, and the engine died:
    VLLMRollout turns chunked prefill off on CPU)."""
    out = engine_output["SEEDED"]
    assert out["alone"] == out["crowded"] == out["again"]
    assert len({tuple(t) for t in out["alone"]}) > 1  # the 4 samples differ (seed + k each)
    assert out["other"] != out["alone"]
    assert out["lp_alone"] == out["lp_crowded"]  # bit for bit: vLLM's CPU kernels give a row the same logits
