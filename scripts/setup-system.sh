#!/usr/bin/env bash
# System packages the test suite drives for real: headless Chromium (the HTML report is rendered
# and screenshotted) and a PostgreSQL server (a tune study shared by two processes). Installed
# from Debian's packages when missing; without root or apt-get the set-up says so and the tests
# that need them are skipped with that reason.
set -uo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-system: cannot install ${missing[*]} (needs root and apt-get); the tests that use them will skip"
  exit 0
fi
echo "setup-system: installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/scaletrain-apt.log 2>&1; then
  apt-get update -q >>/tmp/scaletrain-apt.log 2>&1
  apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/scaletrain-apt.log 2>&1 \
    || { echo "setup-system: apt-get failed (see /tmp/scaletrain-apt.log); the tests that need ${missing[*]} will skip"; exit 0; }
fi
