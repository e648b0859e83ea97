#!/usr/bin/env bash
# vLLM 0.26.0 (CUDA 13, torch 2.11.0) on the GPU machine, from wheels carried over in pieces.
#
# The GPU machine reaches no package registry. The 304 MB vllm wheel is split into 50 MiB chunks and, with the
# 19 small wheels it needs beyond what that machine already has, grouped into folders .vllm026/part1..part7
# (each at most about 52 MiB, so each fits one transfer beside a small working tree). Each small wheel is one
# that vLLM imports at module level on the path from `from vllm import LLM` through the engine, GPU worker,
# Qwen2 model and LoRA, and that the GPU machine lacks.
#
# Usage, from the repo root:
#   bash bench/gpu/vllm-wheels.sh fetch      # CPU machine only: download + split into .vllm026/part1..7
#   bash .vllm026/partK/vllm-wheels.sh       # GPU machine: copy whichever .vllm026/partK is present to /tmp/v26parts
#   bash .vllm026/partK/vllm-wheels.sh install # GPU machine: + verify, reassemble, pip install into /tmp/site
#   bash .vllm026/partK/vllm-wheels.sh imports # GPU machine: + import probe (platform, FA2/FA3, V2 runner, LoRA ops)
#   bash .vllm026/partK/vllm-wheels.sh test    # GPU machine: + tiny random Qwen2 + LoRA generation with timings
#   bash .vllm026/partK/vllm-wheels.sh all     # install, imports, test
# Bring the parts over one at a time (each with its own copy of this script) and run it after each;
# /tmp/v26parts survives between calls only while the machine stays up. The last transfer can bring the last
# part and run "... all". Seen on the H200 on 2026-11-29 (with 58 MiB chunks): install 7 s, imports 26 s,
# LLM() ready in 18 s with VLLM_ENABLE_V1_MULTIPROCESSING=0 (the multiprocess engine core hung at worker start),
# greedy base and LoRA outputs equal to transformers' on a tiny random Qwen2.
#
# Knobs (env): PY (python, default /opt/torch/.venv/bin/python3 if present), V26_PARTS (/tmp/v26parts),
# V26_SITE (/tmp/site), V26_WORK (/tmp/v26test), V26_ATTN (attention backend name, e.g. FLASH_ATTN or
# TRITON_ATTN; default: vLLM's own choice), V26_V2 (0/1: force the V1/V2 GPU model runner).
set -euo pipefail

VWHL=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
VSHA=adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de
PARTS=${V26_PARTS:-/tmp/v26parts}
SITE=${V26_SITE:-/tmp/site}
WORK=${V26_WORK:-/tmp/v26test}
if [ -z "${PY:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=python3; fi
fi
mode=${1:-collect}

# The 19 wheels vLLM 0.26.0 imports at module level that the GPU machine lacks (cp312 / abi3 / py3).
SMALL=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 msgspec==0.22.0
       pyzmq==27.3.0 cbor2==6.3.0 pybase64==1.5.1 cachetools==8.0.2 openai-harmony==0.0.8 openai==2.54.0
       sniffio==1.3.1 distro==1.9.0 llguidance==1.7.6 xgrammar==0.2.7 apache-tvm-ffi==0.1.10 fastapi==0.136.3
       starlette==1.10.0 partial-json-parser==0.2.1.1.post7)

fetch() {  # CPU machine: rebuild .vllm026/part1..6 from PyPI (about 320 MB)
  local out=.vllm026 stage plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --abi cp312 --abi abi3 --abi none)
  local t
  for t in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
           manylinux_2_17 manylinux2014; do plat+=(--platform "${t}_x86_64"); done
  plat+=(--platform any)
  if [ -d .git ]; then grep -qxF '/.vllm026/' .git/info/exclude 2>/dev/null || echo '/.vllm026/' >> .git/info/exclude; fi
  rm -rf "$out"; stage="$out/stage"; mkdir -p "$stage"
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$stage" vllm==0.26.0 "${SMALL[@]}"
  echo "$VSHA  $VWHL" | (cd "$stage" && sha256sum -c --quiet -)
  (cd "$stage" && split -b 50M -a 2 "$VWHL" "$VWHL.part-" && rm "$VWHL" \
     && sha256sum ./*.whl ./*.whl.part-* | sed 's#  \./#  #' > ../SHA256SUMS)
  echo "$VSHA  $VWHL" > "$out/VLLM_WHEEL.sha256"
  : > "$out/LAYOUT.txt"
  local i=1 c w p
  for c in "$stage/$VWHL".part-*; do
    mkdir -p "$out/part$i"; mv "$c" "$out/part$i/"; echo "part$i $(basename "$c")" >> "$out/LAYOUT.txt"; i=$((i+1))
  done
  mkdir -p "$out/part$i"
  for w in "$stage"/*.whl; do mv "$w" "$out/part$i/"; echo "part$i $(basename "$w")" >> "$out/LAYOUT.txt"; done
  rmdir "$stage"
  for p in "$out"/part*; do cp "$out/SHA256SUMS" "$out/VLLM_WHEEL.sha256" "$out/LAYOUT.txt" "$p/"; cp "$0" "$p/vllm-wheels.sh"; done
  rm "$out/SHA256SUMS" "$out/VLLM_WHEEL.sha256" "$out/LAYOUT.txt"
  for p in "$out"/part*; do
    local b; b=$(du -sb "$p" | cut -f1)
    [ "$b" -le 62914560 ] || { echo "ERROR: $p is over 60 MiB"; exit 1; }
    echo "$p: $(awk -v b="$b" 'BEGIN{printf "%.2f MiB", b/1048576}'), $(ls "$p" | wc -l) files"
  done
}

collect() {  # copy whichever part folders were carried into this checkout
  mkdir -p "$PARTS"
  local d found=0
  for d in .vllm026/part*/; do
    [ -d "$d" ] || continue
    cp -f "$d"* "$PARTS"/
    found=1
    echo "collected $d ($(du -sm "$d" | cut -f1) MiB) -> $PARTS"
  done
  [ "$found" = 1 ] || echo "no .vllm026/partK folder in this checkout (bring one over first)"
  if [ -f "$PARTS/LAYOUT.txt" ]; then
    local part f missing=""
    while read -r part f; do
      [ -f "$PARTS/$f" ] && continue
      case "$f" in *.part-*) [ -f "$PARTS/$VWHL" ] && continue ;; esac  # already reassembled
      case " $missing " in *" $part "*) ;; *) missing="$missing $part" ;; esac
    done < "$PARTS/LAYOUT.txt"
    if [ -n "$missing" ]; then echo "still missing:$missing"; else echo "all parts present in $PARTS"; fi
  fi
}

install() {
  [ -f "$PARTS/SHA256SUMS" ] || { echo "ERROR: no parts in $PARTS yet"; exit 1; }
  (
    cd "$PARTS"
    grep -v '\.part-' SHA256SUMS | sha256sum -c --quiet - || { echo "ERROR: a small wheel is missing or corrupt"; exit 1; }
    if [ -f "$VWHL" ] && echo "$VSHA  $VWHL" | sha256sum -c --quiet - 2>/dev/null; then
      echo "vllm wheel already reassembled and checked"
    else
      grep '\.part-' SHA256SUMS | sha256sum -c --quiet - || { echo "ERROR: a vllm chunk is missing or corrupt"; exit 1; }
      cat "$VWHL".part-* > "$VWHL.tmp"
      echo "$VSHA  $VWHL.tmp" | sha256sum -c --quiet - || { echo "ERROR: reassembled wheel hash differs"; exit 1; }
      mv "$VWHL.tmp" "$VWHL"
      rm -f "$VWHL".part-*   # the checked wheel replaces them
      echo "vllm wheel reassembled and checked"
    fi
  )
  local t0=$SECONDS
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$PARTS"/*.whl
  echo "installed $(ls "$PARTS"/*.whl | wc -l) wheels into $SITE ($(du -sm "$SITE" | cut -f1) MiB) in $((SECONDS - t0)) s"
}

setenv() {
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  # Required: the sampler (V1 and V2 runner) otherwise probes FlashInfer at start-up and its import fails.
  export VLLM_USE_FLASHINFER_SAMPLER=0
  # No usage-stats thread trying to reach the internet; no hub look-ups.
  export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  # Defensive: a bf16 model never needs DeepGEMM; skip its vendored-module probing.
  export VLLM_USE_DEEP_GEMM=0
  export TOKENIZERS_PARALLELISM=false
  # Seen 2026-11-29: the multiprocess engine core hangs at worker start on that machine; in-process works.
  export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
  if [ -n "${V26_V2:-}" ]; then export VLLM_USE_V2_MODEL_RUNNER="$V26_V2"; fi
}

imports() {
  setenv
  "$PY" - <<'PYEOF'
import importlib, platform, sys, time, traceback
t0 = time.perf_counter()
print("python", sys.version.split()[0], "glibc", platform.libc_ver()[1], "(llguidance needs >= 2.31)")
import torch
import vllm
from vllm.platforms import current_platform
print(f"vllm {vllm.__version__} from {vllm.__file__}; torch {torch.__version__}; "
      f"platform {type(current_platform).__name__}; "
      f"gpu {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")
mods = ["vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.engine.core_client", "vllm.v1.worker.gpu_worker",
        "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner", "vllm.model_executor.models.qwen2",
        "vllm.lora.request", "vllm.lora.worker_manager", "vllm.lora.punica_wrapper.punica_gpu",
        "vllm.platforms.cuda", "vllm.vllm_flash_attn", "vllm.v1.attention.backends.flash_attn",
        "vllm.v1.attention.backends.triton_attn"]
bad = 0
for m in mods:
    try:
        importlib.import_module(m)
        print("OK  ", m)
    except BaseException as e:  # noqa: BLE001
        bad += 1
        print("FAIL", m, type(e).__name__, str(e)[:300])
        traceback.print_exc(limit=3)
try:
    from vllm.vllm_flash_attn.flash_attn_interface import (FA2_AVAILABLE, FA3_AVAILABLE,
                                                           fa_version_unsupported_reason)
    print("FA2", FA2_AVAILABLE, fa_version_unsupported_reason(2), "| FA3", FA3_AVAILABLE,
          fa_version_unsupported_reason(3), "| FA4", fa_version_unsupported_reason(4))
except BaseException as e:  # noqa: BLE001
    print("FA probe failed:", type(e).__name__, e)
from vllm.triton_utils import HAS_TRITON
print("HAS_TRITON", HAS_TRITON, f"; imports took {time.perf_counter() - t0:.1f} s; failures: {bad}")
PYEOF
}

run_test() {
  setenv
  mkdir -p "$WORK"
  cat > "$WORK/v26test.py" <<'PYEOF'
"""Tiny random Qwen2 + LoRA through vLLM 0.26.0 LLM(); prints token ids and timings.

python v26test.py WORKDIR [--build-only]   (--build-only: make the model, tokenizer and adapter, then stop)
"""
import os
import sys
import time
import traceback

VOCAB = 512
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(work):
    import torch
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    mdir, tdir, ldir = (os.path.join(work, n) for n in ("tiny-qwen2", "tok", "tiny-lora"))
    torch.manual_seed(0)
    vocab = {"[UNK]": 0, "[PAD]": 1, "<|endoftext|>": 2, "hello": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##")  # decode joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                  eos_token="<|endoftext|>")
    # The tokenizer goes in its own folder WITHOUT config.json: next to a qwen2 config.json,
    # transformers 5.x AutoTokenizer swaps in Qwen2Tokenizer, which turns this WordLevel vocab into a
    # merge-less BPE that encodes "hello" to [] (seen on the CPU machine with transformers 5.17.0).
    tok.save_pretrained(tdir)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=2, pad_token_id=1, bos_token_id=None)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(mdir)
    lcfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, init_lora_weights=False, target_modules=TARGETS)
    get_peft_model(model, lcfg).save_pretrained(ldir)  # random A and B: the adapter changes the output
    ids = AutoTokenizer.from_pretrained(tdir)("hello w5").input_ids
    assert ids == [3, 5], f"tokenizer check failed: {ids}"
    return mdir, tdir, ldir


def hf_greedy(mdir, ldir, n):
    import torch
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(mdir, dtype=torch.bfloat16).cuda().eval()
    model.generation_config.eos_token_id = None  # like ignore_eos=True
    ids = torch.tensor([[3]], device="cuda")
    with torch.no_grad():
        base = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=1)[0, 1:].tolist()
        from peft import PeftModel

        pm = PeftModel.from_pretrained(model, ldir).eval()
        lora = pm.generate(input_ids=ids, max_new_tokens=n, do_sample=False, pad_token_id=1)[0, 1:].tolist()
    return base, lora


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/v26test"
    t = time.perf_counter()
    mdir, tdir, ldir = build(work)
    print(f"V26 built tiny model, tokenizer, LoRA in {time.perf_counter() - t:.1f} s under {work}", flush=True)
    if "--build-only" in sys.argv:
        return 0

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    # no CUDA call in this process before LLM(): vLLM can then fork its engine process as by default
    print(f"V26 vllm {vllm.__version__} ({vllm.__file__}), torch {torch.__version__}", flush=True)
    kw = {}
    if os.environ.get("V26_ATTN"):
        kw["attention_backend"] = os.environ["V26_ATTN"]
    t = time.perf_counter()
    llm = LLM(model=mdir, tokenizer=tdir, enforce_eager=True, gpu_memory_utilization=0.3,
              enable_lora=True, max_lora_rank=16, seed=0, **kw)
    print(f"V26 LLM() ready in {time.perf_counter() - t:.1f} s on {torch.cuda.get_device_name(0)}", flush=True)

    # 1. the snippet from the brief
    t = time.perf_counter()
    out = llm.generate(["hello"], SamplingParams(max_tokens=8, logprobs=0))
    o = out[0].outputs[0]
    try:
        lps = [round(d[tid].logprob, 3) for tid, d in zip(o.token_ids, o.logprobs or [])]
    except Exception as e:  # noqa: BLE001
        lps = f"unreadable ({type(e).__name__}: {e})"
    print(f"V26 sample: ids={list(o.token_ids)} logprobs={lps} text={o.text!r} "
          f"({time.perf_counter() - t:.2f} s)", flush=True)

    # 2. greedy, base vs LoRA, and the same through transformers on the GPU
    n = 8
    greedy = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    lreq = LoRARequest("tiny-lora", 1, ldir)
    t = time.perf_counter()
    base = list(llm.generate(["hello"], greedy)[0].outputs[0].token_ids)
    t_base = time.perf_counter() - t
    t = time.perf_counter()
    lora = list(llm.generate(["hello"], greedy, lora_request=lreq)[0].outputs[0].token_ids)
    t_lora = time.perf_counter() - t
    print(f"V26 greedy base={base} ({t_base:.2f} s)  lora={lora} ({t_lora:.2f} s, includes adapter load)",
          flush=True)

    # 3. a batch for throughput (64 prompts x 16 tokens in, 64 tokens out), base and LoRA
    prompts = [" ".join(f"w{4 + (i * 7 + j) % (VOCAB - 4)}" for j in range(16)) for i in range(64)]
    sp = SamplingParams(max_tokens=64, ignore_eos=True, temperature=1.0, seed=None)
    for name, lr in (("base", None), ("lora", lreq)):
        t = time.perf_counter()
        outs = llm.generate(prompts, sp, lora_request=lr, use_tqdm=False)
        dt = time.perf_counter() - t
        ntok = sum(len(x.outputs[0].token_ids) for x in outs)
        print(f"V26 batch {name}: {ntok} tokens in {dt:.2f} s = {ntok / dt:.0f} tok/s", flush=True)

    try:
        hf_base, hf_lora = hf_greedy(mdir, ldir, n)
        mb = sum(a == b for a, b in zip(base, hf_base))
        ml = sum(a == b for a, b in zip(lora, hf_lora))
        print(f"V26 transformers greedy base={hf_base} (match {mb}/{n})  lora={hf_lora} (match {ml}/{n})",
              flush=True)
    except Exception:  # noqa: BLE001 - the reference is informative only
        traceback.print_exc()
    ok = len(o.token_ids) > 0 and len(base) == n and len(lora) == n
    print("V26 RESULT:", "OK" if ok else "FAIL", "| LoRA changed greedy output:", base != lora, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":  # vLLM may start its engine process with spawn: keep this guard
    sys.exit(main())
PYEOF
  local t0=$SECONDS
  "$PY" "$WORK/v26test.py" "$WORK"
  echo "test wall time: $((SECONDS - t0)) s"
}

case "$mode" in
  fetch) fetch ;;
  collect) collect ;;
  install) collect; install ;;
  imports) collect; imports ;;
  test) collect; run_test ;;
  all) collect; install; imports; run_test ;;
  *) echo "usage: $0 [fetch|collect|install|imports|test|all]"; exit 2 ;;
esac
