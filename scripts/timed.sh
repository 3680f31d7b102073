#!/usr/bin/env bash
# timed.sh NAME COMMAND... [-- COMMAND...]: runs each command in turn (all of them, so one failing
# part still lets the others report), then prints how long they took together and exits with the
# first failure's status: "NAME: 27.4 min (1644 s, passed, on a CPU without AVX-512)".
set -uo pipefail
name="$1"; shift
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
printf '%s: %d.%d min (%d s, %s, on %s)\n' "$name" $((elapsed / 60)) $(( (elapsed % 60) * 10 / 60 )) "$elapsed" "$verdict" \
  "$(grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo 'an AVX-512 CPU' || echo 'a CPU without AVX-512')"
exit "$status"
