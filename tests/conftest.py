"""Shared fixtures: tiny randomly initialised backbones of every supported family."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from backbones import make_bert, make_cnn, make_hf_vit, make_timm_vit

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def use_backend(monkeypatch):
    """Force an op backend for one test: ``use_backend("cpp")``."""

    def select(name: str) -> None:
        monkeypatch.setenv("SOPFAST_BACKEND", name)

    return select


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
