#!/usr/bin/env bash
# The browser tests alone, with screenshots: for refreshing the README's images
# (KERASMAGIC_SCREENSHOT_DIR=docs bash .ci/browser.sh). .ci/run already runs these tests as part
# of the README's test command; this script needs the venv that command made.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Everything this run writes (listing, screenshots, pytest's temp dirs with the Jupyter
# servers' config, runtime and notebooks) goes under one private folder of its own.
work=$(mktemp -d "${TMPDIR:-/tmp}/km-browser.XXXXXXXX")  # no "kerasmagic": see .ci/run
echo "browser CI files: $work"

if ! [ -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
. .venv/bin/activate
jupyter labextension list 2>&1 | tee "$work/labextensions.txt"
grep -E "kerasmagic v[0-9.]+.*enabled.*OK" "$work/labextensions.txt" >/dev/null \
  || { echo "kerasmagic sidebar is not enabled and OK"; exit 1; }

KERASMAGIC_REQUIRE_BROWSER=1 KERASMAGIC_SCREENSHOT_DIR="${KERASMAGIC_SCREENSHOT_DIR:-$work}" \
  pytest -q -p no:cacheprovider --basetemp="$work/pytest" tests/browser tests/test_version.py

echo "browser CI finished in $(( $(date +%s) - start )) s"
