#!/usr/bin/env bash
# GPU machine (no package registry): install whatever wheels arrived in .whl/* (../shared/gpu/fetch-wheels.sh)
# into /tmp/site, skipping those already installed, then print the environment to export. Run from the repo root
# after each transfer:  bash bench/gpu/setup.sh && source /tmp/rlft-env.sh
set -euo pipefail
if [ -z "${PY:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=python3; fi
fi
mkdir -p /tmp/site /tmp/whl-done
new=()
for w in .whl/*/*.whl; do
  [ -e "$w" ] || continue
  [ -e "/tmp/whl-done/$(basename "$w")" ] || new+=("$w")
done
if [ ${#new[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${new[@]}"
  for w in "${new[@]}"; do touch "/tmp/whl-done/$(basename "$w")"; done
  echo "installed ${#new[@]} wheels into /tmp/site"
fi
cat > /tmp/rlft-env.sh <<ENV
export PATH=$(dirname "$PY"):\$PATH
export PYTHONPATH=$PWD:/tmp/site HF_HUB_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
ENV
