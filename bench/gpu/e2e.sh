#!/usr/bin/env bash
# One-GPU end-to-end run (GPU machine): a vLLM rollout actor and an Unsloth 4-bit LoRA learner share the GPU
# through Ray bundles of 0.5 GPU each (conf/experiment/gpu_shared_qwen0.5b.yaml), on a random-init Qwen2.5-0.5B
# shape (bench/shapes.py; speed does not depend on the weights). Prompts: 512 arithmetic questions in a jsonl;
# reward: tests.helpers.LengthReward (a random model's answers are never right; lengths differ, so there is
# signal and the learner does real work). Usage: bash bench/gpu/e2e.sh OUT_DIR [extra train.py overrides...]
# The split against `cluster.colocate=true` on this work, at any shape: python -m bench.colocate --shape S
# The run's summary and median step times are appended to bench/results.jsonl ($RLFT_BENCH_RESULTS if set).
set -euo pipefail
out=${1:?output dir}; shift
python -m bench.shapes qwen2.5-0.5b /tmp/shapes/qwen2.5-0.5b-v32000 >/dev/null
python -c "from bench.colocate import write_arith_prompts; write_arith_prompts('/tmp/arith.jsonl')"
python train.py +experiment=gpu_shared_qwen0.5b model.path=/tmp/shapes/qwen2.5-0.5b-v32000 env=jsonl \
  env.train=/tmp/arith.jsonl reward._target_=tests.helpers.LengthReward '~reward.workers' '~reward.timeout_s' '~reward.reward' \
  run.output_dir="$out" "$@"
python -m bench.common append-run gpu/e2e.sh "$out" "$out" "$@"
