#!/usr/bin/env bash
# timed.sh NAME COMMAND... [-- COMMAND...]: runs each command in turn (all of them, so one failing
# part still lets the others report), then prints how long they took together and exits with the
# first failure's status: "NAME: 27.4 min (1644 s, passed, on a CPU without AVX-512)". Where
# TORCHINDUCTOR_CACHE_DIR is set it also says whether torch.compile's cache held kernels before the
# start ("inductor cache warm"), as a run that reuses them compiles little (the compiled
# checkpointing test: 102 s cold, 10 s warm on the CPU without AVX-512).
set -uo pipefail
name="$1"; shift
cache=""
if [ -n "${TORCHINDUCTOR_CACHE_DIR:-}" ]; then
  if [ -n "$(ls -A "$TORCHINDUCTOR_CACHE_DIR" 2>/dev/null)" ]; then cache=", inductor cache warm"; else cache=", inductor cache cold"; fi
fi
start=$(date +%s)
status=0
command=()
run() {
  if [ "${#command[@]}" -gt 0 ]; then
    "${command[@]}"
    local code=$?
    [ "$status" -ne 0 ] || status=$code
  fi
  command=()
}
for word in "$@"; do
  if [ "$word" = "--" ]; then run; else command+=("$word"); fi
done
run
elapsed=$(( $(date +%s) - start ))
verdict=$([ "$status" -eq 0 ] && echo passed || echo "failed, exit $status")
printf '%s: %d.%d min (%d s, %s, on %s%s)\n' "$name" $((elapsed / 60)) $(( (elapsed % 60) * 10 / 60 )) "$elapsed" "$verdict" \
  "$(grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo 'an AVX-512 CPU' || echo 'a CPU without AVX-512')" "$cache"
exit "$status"
