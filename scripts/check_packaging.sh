#!/usr/bin/env bash
# Packaging check: a fresh venv (no system site-packages), torch, then a plain `pip install .` with only
# the declared dependencies; `import sopfast`, `sopfast --help` and every subcommand's --help must work.
# The C++ extension is not built here (SOPFAST_NO_EXTENSION=1): this checks the Python package and its
# dependency declarations; the ops then run their PyTorch references.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TMPDIR:-/tmp}/sopfast-packaging"
rm -rf "$venv"
python -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==2.14.1"
SOPFAST_NO_EXTENSION=1 "$venv/bin/python" -m pip install -q .
cd "$venv"  # away from the source tree, so the installed package is the one imported
"$venv/bin/python" -W error::DeprecationWarning -c "import sopfast; print('sopfast', sopfast.__version__)"
"$venv/bin/sopfast" --help >/dev/null
commands=$("$venv/bin/python" -c "from sopfast.cli import build_parser; p = build_parser(); \
print(' '.join(name for a in p._subparsers._group_actions for name in a.choices))")
for cmd in $commands; do
  "$venv/bin/sopfast" "$cmd" --help >/dev/null
  echo "sopfast $cmd --help: ok"
done
