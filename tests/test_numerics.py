"""Subnormal floats flushed to zero in SOP's backward on the CPU (``sopfast.model.numerics``)."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.model.numerics import flush_denormal, flushing_denormals, intra_op_threads_flushing, set_flush_denormal
from sopfast.ops._backends import has_cpp
from sopfast.testing import make_hf_vit


def _supported() -> bool:
    supported = torch.set_flush_denormal(True)
    torch.set_flush_denormal(False)
    return supported


pytestmark = pytest.mark.skipif(not _supported(), reason="this CPU cannot flush subnormal floats")

SUBNORMAL = torch.tensor([1e-39, 5e-40])


def test_flush_denormal_flushes_inside_and_restores_after():
    assert not flushing_denormals() and bool((SUBNORMAL * 1.0 != 0).all())
    with flush_denormal() as on:
        assert on and flushing_denormals()
        assert bool((SUBNORMAL * 1.0 == 0).all())
        with flush_denormal():
            pass
        assert flushing_denormals()  # the inner block restored the state it found: on
    assert not flushing_denormals() and bool((SUBNORMAL * 1.0 != 0).all())


def test_flush_denormal_restores_on_an_exception_and_leaves_a_state_set_outside():
    with pytest.raises(RuntimeError, match="boom"), flush_denormal():
        raise RuntimeError("boom")
    assert not flushing_denormals()
    torch.set_flush_denormal(True)
    try:
        with flush_denormal():
            pass
        assert flushing_denormals()
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.skipif(not has_cpp(), reason="the intra-op threads are reached through sopfast._C")
def test_flush_denormal_reaches_every_intra_op_thread():
    """torch.set_flush_denormal sets the calling thread only; a two-thread backward's matmuls also run
    on the pool's second thread, which must flush too, and each thread gets its own state back after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        set_flush_denormal(False)
        torch.set_flush_denormal(True)
        assert intra_op_threads_flushing() == [True, False]  # what torch's own flag leaves unflushed
        with flush_denormal():
            assert intra_op_threads_flushing() == [True, True]
        assert intra_op_threads_flushing() == [True, False]
        torch.set_flush_denormal(False)
        with flush_denormal():
            wide = torch.full((1 << 16,), 1e-38) * 0.5  # split over both threads
            assert bool((wide == 0).all())
        assert intra_op_threads_flushing() == [False, False]
        assert bool((torch.full((1 << 16,), 1e-38) * 0.5 != 0).all())
    finally:
        set_flush_denormal(False)
        torch.set_num_threads(threads)


def test_disabled_changes_nothing():
    with flush_denormal(enabled=False) as on:
        assert not on and not flushing_denormals()


def _model() -> sopfast.SOP:
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25, mode="drop", recipe="paper")


def test_results_are_bit_identical_for_normal_inputs():
    model = _model().train()
    x, labels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 2])
    results = []
    for flush in (False, True):
        model.zero_grad(set_to_none=True)
        with flush_denormal(flush):
            out = model(x, labels=labels)
            out.loss.backward()
        results.append((out.logits, [p.grad.clone() for p in model.trainable_parameters() if p.grad is not None]))
    (plain, plain_grads), (flushed, flushed_grads) = results
    assert torch.equal(plain, flushed)
    assert len(plain_grads) == len(flushed_grads) > 0
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, flushed_grads))


def test_train_flushes_the_backward_only(tmp_path):
    """The backward runs flushed; the forward keeps subnormal attention (the authors' tie rule ranks it)."""
    model = _model()
    seen: dict[str, list[bool]] = {"forward": [], "backward": []}
    model.generator.register_forward_hook(lambda *_: seen["forward"].append(flushing_denormals()))
    model.generator.heads[0].register_hook(lambda grad: seen["backward"].append(flushing_denormals()))
    data = torch.utils.data.TensorDataset(torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0]))
    sopfast.train(model, data, batch_size=2, max_steps=2, output_dir=tmp_path, progress=False)
    assert seen["backward"] == [True, True]
    assert seen["forward"] and not any(seen["forward"])
    assert not flushing_denormals()
