#!/usr/bin/env bash
# Chromium and its driver from the operating system's packages, for the playground's headless
# browser test (tests/test_playground.py). Debian/Ubuntu as root (or with sudo); elsewhere it says
# so and the browser tests skip.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-chromium: no apt-get here; install Chromium and chromedriver yourself" >&2
  exit 1
fi
run=()
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null && sudo -n true 2>/dev/null || { echo "install-chromium: needs root" >&2; exit 1; }
  run=(sudo -n)
fi
export DEBIAN_FRONTEND=noninteractive
"${run[@]}" apt-get update -qq
"${run[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "setup: installed $(chromium --version 2>/dev/null | head -1)"
