"""Benchmarks share the tests' tiny backbones and thread settings."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
