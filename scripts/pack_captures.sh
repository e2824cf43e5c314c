#!/usr/bin/env bash
# Pack a capture directory for the device tool's way back (at most 8 files of 16 MiB, 64 MiB in all):
# every pickle xz-compressed in parallel, then the truth files, the log and as many pickles as fit under
# BUDGET_MIB (smallest first, so the most families come back whole) in one tar, split into 15 MiB parts.
# Usage: scripts/pack_captures.sh CAPDIR OUTDIR [PREFIX]   (round 5's captures were lost for want of this)
set -euo pipefail
cap=$1 out=$(realpath "$2") prefix=${3:-cap}
budget=$(( ${BUDGET_MIB:-58} * 1024 * 1024 ))
find "$cap" -name '*.pickle' -print0 | xargs -0 -r -P "$(nproc)" -n 1 xz -6 -f
cd "$cap"
list=$(mktemp)
ls ./*.json ./*.txt 2>/dev/null >"$list" || true
total=$(cat $(cat "$list") 2>/dev/null | wc -c)
left_out=0
while read -r size name; do
  if (( total + size <= budget )); then echo "$name" >>"$list"; total=$(( total + size )); else left_out=$(( left_out + 1 )); echo "left out: $name ($size B)"; fi
done < <(find . -name '*.pickle.xz' -printf '%s %p\n' | sort -n)
echo "packing $(wc -l <"$list") files, $total B; $left_out pickles left out"
tar -cf - -T "$list" | split -b 15M -d - "$out/$prefix.tar.part"
ls -l "$out"
