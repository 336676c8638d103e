#!/usr/bin/env bash
# Create .venv (Python 3.12) with mcore-recipes and its pinned dependencies. Idempotent: a venv
# whose stamp matches pyproject.toml is reused. Usage: bash scripts/setup_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."

find_python312() {
  local candidate
  for candidate in "${PYTHON:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 \
                   /usr/local/bin/python3.12 /usr/bin/python3.12; do
    [ -n "$candidate" ] || continue
    # pyenv shims exist on PATH even when 3.12 is not the selected version: try running it.
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  PYENV_VERSION=$(ls "$HOME"/.pyenv/versions 2>/dev/null | grep '^3\.12' | tail -n1) \
    python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null && return 0
  echo "error: Python 3.12 not found; install it or set PYTHON=/path/to/python3.12" >&2
  return 1
}

stamp=".venv/.mcore-recipes-stamp"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python=$(find_python312)
echo "setting up .venv with $python (about 3-4 minutes on first run)"
"$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
echo "$want" > "$stamp"
