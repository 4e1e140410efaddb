"""Inference runs the batch in example chunks (bounded peak memory): the outputs equal a whole-batch run."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.model import sop as model_module
from sopfast.testing import make_bert, make_hf_vit, text_batch


def assert_chunked_equals_whole(model, args, monkeypatch) -> None:
    """Asserts that one-example chunks give the whole batch's outputs (logits to 1e-5, masks and indices equal)."""
    model.eval()
    with torch.enable_grad():
        whole = model(*args)  # autograd on: one chunk
    monkeypatch.setattr(model_module, "TOKENS_PER_EXAMPLE_CHUNK", 1)  # one example per chunk
    with torch.no_grad():
        assert model.example_chunk_size(model.prepare(*args)) == 1
        chunked = model(*args)
    for field in ("logits", "group_logits", "group_scores", "lam", "attention"):
        torch.testing.assert_close(getattr(chunked, field), getattr(whole, field).detach(), atol=1e-5, rtol=0)
    assert torch.equal(chunked.group_masks, whole.group_masks)
    assert torch.equal(chunked.group_indices, whole.group_indices)


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_chunked_image_inference_equals_the_whole_batch(mode, monkeypatch):
    model = sopfast.SOP(make_hf_vit(), num_groups=4, mode=mode)
    assert_chunked_equals_whole(model, (torch.randn(5, 3, 32, 32),), monkeypatch)


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_chunked_text_inference_pads_indices_to_one_width(mode, monkeypatch):
    model = sopfast.SOP(make_bert(), num_groups=3, tau=0.5, mode=mode)
    assert_chunked_equals_whole(model, text_batch(), monkeypatch)


def test_exact_group_calls_on_the_cpu_take_about_2048_tokens():
    model = sopfast.SOP(make_hf_vit(), num_groups=4, mode="exact")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert model.group_chunk_size(197, cpu, "exact") == 10
    assert model.group_chunk_size(197, cpu, "drop") == model.group_chunk_size(197, cpu) == 20
    assert model.group_chunk_size(197, cuda, "exact") == model.group_chunk_size(197, cuda, "drop") == 332
    model.group_batch_size = 3
    assert model.group_chunk_size(197, cpu, "exact") == 3


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_the_forward_sizes_its_group_calls_for_its_mode(mode, monkeypatch):
    model = sopfast.SOP(make_hf_vit(), num_groups=4, mode=mode).eval()
    sizes, run_groups = [], model.adapter.run_groups

    def spy(inputs, groups, mode, chunk_size):
        sizes.append(chunk_size)
        return run_groups(inputs, groups, mode, chunk_size)

    monkeypatch.setattr(model.adapter, "run_groups", spy)
    with torch.no_grad():
        inputs = model.prepare(torch.randn(1, 3, 32, 32))
        model(inputs.pixels)
    tokens = model.adapter.tokens_per_group(inputs, model.make_groups(inputs), mode)
    assert sizes == [model.group_chunk_size(tokens, torch.device("cpu"), mode)]
