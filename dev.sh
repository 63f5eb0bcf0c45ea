#!/usr/bin/env bash
# The README's set-up commands. Each one creates .venv and installs seqrec on first use.
#   ./dev.sh demo    run the main job on the built-in synthetic dataset and serve it (no data, no services)
#   ./dev.sh test    run the default test suite (slow benchmarks excluded)
#   ./dev.sh slow    run only the tests marked slow (long benchmarks; never in CI)
#   ./dev.sh lint    ruff and mypy
#   ./dev.sh docs    serve the docs site on http://127.0.0.1:8001 (mkdocs serve; .ci/run builds it --strict)
#   ./dev.sh setup   only create .venv and install
set -euo pipefail
cd "$(dirname "$0")"
VENV=${SEQREC_VENV:-.venv}
# A bare `torch` requirement pulls several GB of CUDA wheels on Linux; pin the CPU build
# first (override, e.g. SEQREC_TORCH="torch --index-url https://download.pytorch.org/whl/cpu").
TORCH=${SEQREC_TORCH:-torch==2.13.0}

setup() {
  local stamp="$VENV/.seqrec-installed" want
  want=$(cat pyproject.toml dev.sh | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  echo "installing seqrec into $VENV (first run only)..." >&2
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q $TORCH
  "$VENV/bin/python" -m pip install -q -e '.[dev]'
  echo "$want" > "$stamp"
}

demo() {
  # The pipeline on the built-in synthetic dataset, then the service on :8000 (Ctrl-C stops it).
  "$VENV/bin/seqrec" demo --out "${SEQREC_DEMO_OUT:-artifacts/demo}" "$@"
}

cmd=${1:-help}
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; demo "$@" ;;
  test) setup; "$VENV/bin/python" -m pytest -q "$@" ;;
  slow) setup; "$VENV/bin/python" -m pytest -q -m slow "$@" || [ $? -eq 5 ] ;;  # 5: no test selected
  lint) setup; "$VENV/bin/ruff" check . && "$VENV/bin/mypy" ;;
  docs) setup; "$VENV/bin/mkdocs" serve -a 127.0.0.1:8001 "$@" ;;
  *) sed -n '2,8p' "$0"; exit 2 ;;
esac
