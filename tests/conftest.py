"""Shared fixtures: tiny randomly initialised backbones of every supported family."""

from __future__ import annotations

import contextlib
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

import sopfast
from sopfast.testing import make_bert, make_cnn, make_hf_vit, make_timm_vit

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def environment_backend_restored():
    """A test that sets SOPFAST_BACKEND (read by backends(), use_backend, select_backend) leaves no override
    registered after it (the variable is restored first: monkeypatch tears down before this fixture)."""
    yield
    sopfast.ops._backends.sync_environment()


@pytest.fixture
def use_backend():
    """Force an op backend for the rest of one test: ``use_backend("cpp")`` (``sopfast.ops.use_backend``)."""
    with contextlib.ExitStack() as stack:
        yield lambda name: stack.enter_context(sopfast.ops.use_backend(name))


@pytest.fixture
def hf_vit():
    return make_hf_vit()


@pytest.fixture
def timm_vit():
    return make_timm_vit()


@pytest.fixture
def bert():
    return make_bert()


@pytest.fixture
def cnn():
    return make_cnn()
