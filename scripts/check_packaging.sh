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
# every subcommand's --help through the console script's entry point, in one process (a fresh venv's
# first imports of torch take seconds each)
"$venv/bin/python" - <<'PY'
import contextlib
import io

from sopfast.cli import build_parser, main

for cmd in [name for action in build_parser()._subparsers._group_actions for name in action.choices]:
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = main([cmd, "--help"])
    except SystemExit as stop:
        code = stop.code
    assert code in (0, None) and f"usage: sopfast {cmd}" in printed.getvalue(), (cmd, code, printed.getvalue())
    print(f"sopfast {cmd} --help: ok")
PY
