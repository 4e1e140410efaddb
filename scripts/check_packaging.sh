#!/usr/bin/env bash
# Packaging check: a venv of its own (no system site-packages), torch, then a plain `pip install .` with only
# the declared dependencies; `import sopfast`, `sopfast --help` and every subcommand's --help must work.
# The C++ extension is not built here (SOPFAST_NO_EXTENSION=1): this checks the Python package and its
# dependency declarations; the ops then run their PyTorch references.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TMPDIR:-/tmp}/sopfast-packaging"
torch_requirement="torch==2.14.1"
# The venv with pip and torch only (4 GB of files) is made once per Python and torch and kept in the CI
# cache; each run starts from a copy of it in hard links (seconds): pip replaces files, never writes into them.
cache="${SOPFAST_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sopfast-ci}"
base="$cache/packaging-$(python -c 'import platform; print(platform.python_version())')-$torch_requirement"
if [ ! -f "$base/complete" ]; then
  rm -rf "$base"
  mkdir -p "$cache"
  python -m venv "$base"
  "$base/bin/python" -m pip install -q --upgrade pip
  "$base/bin/python" -m pip install -q "$torch_requirement"
  touch "$base/complete"
fi
rm -rf "$venv"
cp -al "$base" "$venv" 2>/dev/null || { rm -rf "$venv" && cp -a "$base" "$venv"; }  # -a: another file system
rm "$venv/complete"
SOPFAST_NO_EXTENSION=1 "$venv/bin/python" -m pip install -q .
cd "$venv"  # away from the source tree, so the installed package is the one imported
# every public name, as `import sopfast` imports them on first use
"$venv/bin/python" -W error::DeprecationWarning -c "import sopfast; [getattr(sopfast, n) for n in sopfast.__all__]; print('sopfast', sopfast.__version__)"
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
