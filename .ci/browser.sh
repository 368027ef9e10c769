#!/usr/bin/env bash
# CI for the JupyterLab sidebar: install Debian's Chromium and Python Playwright (no browser
# download), build and install kerasmagic with its sidebar, check `jupyter labextension list`,
# then drive a real JupyterLab and Notebook 7 in headless Chromium. Run from .ci/run after the
# main venv exists.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Everything this run writes (listing, screenshots, pytest's temp dirs with the Jupyter
# servers' config, runtime and notebooks) goes under one private folder of its own.
work=$(mktemp -d "${TMPDIR:-/tmp}/kerasmagic-browser.XXXXXXXX")
echo "browser CI files: $work"

if ! [ -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q "jupyterlab>=4.6.4,<5" 'notebook>=7,<8' playwright hatchling \
  'hatch-jupyter-builder>=0.9' editables

# Build the sidebar (jlpm + webpack) unless an earlier install already did, then install it.
if ! [ -f kerasmagic/labextension/static/style.js ]; then
  (cd labextension && jlpm install && jlpm build:prod)
fi
pip install -q --no-build-isolation -e '.[test]'
jupyter labextension list 2>&1 | tee "$work/labextensions.txt"
grep -E "kerasmagic v[0-9.]+.*enabled.*OK" "$work/labextensions.txt" >/dev/null \
  || { echo "kerasmagic sidebar is not enabled and OK"; exit 1; }

KERASMAGIC_REQUIRE_BROWSER=1 KERASMAGIC_SCREENSHOT="${KERASMAGIC_SCREENSHOT:-$work/sidebar.png}" \
  KERASMAGIC_WIDGET_SCREENSHOT="${KERASMAGIC_WIDGET_SCREENSHOT:-$work/live_widget.png}" \
  pytest -q -p no:cacheprovider --basetemp="$work/pytest" tests/browser tests/test_version.py

echo "browser CI finished in $(( $(date +%s) - start )) s"
