"""Hypothesis fuzzing of the public API: any argument either works or is a clear ValueError/TypeError
naming what is wrong — never another exception from deep inside torch or transformers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sopfast
from sopfast.testing import make_bert, make_hf_vit

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
VIT = make_hf_vit()
BERT = make_bert()

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=3),
)


def _clear(err: Exception, *names: str) -> bool:
    """The message names one of ``names`` (the argument) and says what is allowed."""
    text = str(err)
    return any(n in text for n in names) and any(w in text for w in ("must", "got", "not", "need"))


@FUZZ
@given(
    num_groups=st.one_of(st.integers(-2, 30), anything),
    tau=st.one_of(st.floats(-1, 2), anything),
    mode=st.sampled_from(["exact", "drop", "fast", "", None, 3]),
    num_heads=st.one_of(st.integers(-1, 4), anything),
    ties=st.sampled_from(["authors", "logits", "random", None]),
    gen_scale=st.one_of(st.floats(allow_nan=True, allow_infinity=True), anything),
    blur=st.one_of(st.integers(-3, 9), anything),
    task=st.sampled_from(["classification", "regression", "ranking"]),
)
def test_constructor_accepts_or_names_the_argument(num_groups, tau, mode, num_heads, ties, gen_scale, blur, task):
    kwargs = dict(
        num_groups=num_groups,
        tau=tau,
        mode=mode,
        num_heads=num_heads,
        ties=ties,
        group_gen_scale=gen_scale,
        blur_kernel_size=blur,
        task=task,
    )
    try:
        model = sopfast.SOP(VIT, **kwargs)
    except (ValueError, TypeError) as err:
        assert _clear(err, *kwargs, "group_gen_scale", "blur", "kernel_size"), err
        return
    assert model.num_groups >= 1 and 0 < model.tau <= 1 and math.isfinite(model.generator.scale)
    x = torch.randn(1, 3, 32, 32)
    try:
        with torch.no_grad():
            out = model(x)
    except ValueError as err:  # a blur kernel too large for the 4×4 grid is only known at the first call
        assert "blur kernel_size" in str(err), err
        return
    assert torch.isfinite(out.logits).all()


@FUZZ
@given(
    batch=st.integers(0, 3),
    channels=st.sampled_from([1, 3, 4]),
    size=st.sampled_from([16, 32, 33]),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.float64, torch.int64, torch.bool]),
    scale=st.sampled_from([0.0, 1.0, 1e4, float("nan"), float("inf")]),
    tau=st.one_of(st.none(), st.floats(-0.5, 1.5)),
    mode=st.sampled_from([None, "exact", "drop", "x"]),
)
def test_image_forward_works_or_says_why(batch, channels, size, dtype, scale, tau, mode):
    model = sopfast.SOP(VIT, num_groups=4).eval()
    x = (torch.randn(batch, channels, size, size) * scale).to(dtype)
    try:
        with torch.no_grad():
            out = model(x, tau=tau, mode=mode)
    except (ValueError, TypeError) as err:
        assert _clear(err, "images", "tau", "mode", "logits"), err
        return
    assert out.logits.shape == (batch, 3) and torch.isfinite(out.logits).all()


@FUZZ
@given(
    batch=st.integers(0, 3),
    length=st.integers(1, 80),
    id_high=st.sampled_from([3, 60, 100]),
    mask_kind=st.sampled_from(["ones", "zeros", "random", "missing", "wrong_shape"]),
    types_high=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 5),
)
def test_text_forward_works_or_says_why(batch, length, id_high, mask_kind, types_high, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, id_high, (batch, length), generator=g)
    masks = {
        "ones": torch.ones(batch, length, dtype=torch.long),
        "zeros": torch.zeros(batch, length, dtype=torch.long),
        "random": torch.randint(0, 2, (batch, length), generator=g),
        "missing": None,
        "wrong_shape": torch.ones(batch, length + 1, dtype=torch.long),
    }
    types = torch.randint(0, types_high, (batch, length), generator=g)
    model = sopfast.SOP(BERT, num_groups=3).eval()
    try:
        with torch.no_grad():
            out = model(ids, masks[mask_kind], types)
    except (ValueError, TypeError) as err:
        assert _clear(err, "input_ids", "attention_mask", "token_type_ids", "logits", "candidate"), err
        return
    assert out.logits.shape == (batch, 2)


def _outcome(call) -> str:
    try:
        call()
    except (ValueError, TypeError):
        return "clear error"
    return "ran"


@pytest.mark.parametrize("op", ["sparsemax", "top_tau", "gather_tokens"])
def test_ops_run_or_raise_value_or_type_errors(op):
    from sopfast import ops

    calls = {
        "sparsemax": lambda v: ops.sparsemax(v),
        "top_tau": lambda v: ops.top_tau(v, 0.5),
        "gather_tokens": lambda v: ops.gather_tokens(v, torch.zeros(1, 1, 1, dtype=torch.long)),
    }
    bad_inputs = [None, 3, torch.tensor(1.0), torch.randn(2), torch.randn(0, 4), torch.zeros(2, 3, dtype=torch.long)]
    outcomes = [_outcome(lambda v=v: calls[op](v)) for v in bad_inputs]
    assert set(outcomes) <= {"ran", "clear error"} and "clear error" in outcomes
