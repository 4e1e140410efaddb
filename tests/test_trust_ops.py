"""Nothing silently wrong at the ops' entry points and the metric / loss / output arguments (issue #42).

The ops' checks live once, in C++ (``csrc/op_checks.h``): the C++ kernels run them, and every kernel
registered from Python (the references, Triton, the fake/Meta kernels) runs them through
``sopfast._C.check_<kernel>``.  A hostile table calls every op through ``torch.ops.sopfast.<op>`` (on each
CPU backend) and through ``sopfast.ops.<op>`` with a wrong per-row ``k``, a tensor on another device
(``meta`` stands in for one: a mixed call used to reach the Meta kernel and return uninitialised memory),
a wrong dtype or shape: each is refused with a ValueError or TypeError naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import sopfast
from op_testing import needs_cpp
from sopfast import ops
from sopfast.model.losses import scaled_mse_loss
from sopfast.ops import _backends
from sopfast.prediction.explainers import check_explainer
from sopfast.testing import make_bert, make_hf_vit, text_batch

T = torch.ops.sopfast
META = "meta"  # another device than the CPU inputs (no GPU needed)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return t.to(META)


def _top_tau(logits=None, k=None, k_max=3, valid=None, blur=None, grid=(0, 0)):
    logits = torch.randn(2, 5) if logits is None else logits
    return T.top_tau(logits, k, k_max, valid, True, True, blur, *grid)


def _top_tau_backward(attention=None, mask=None, lam=None, grad_lam=None, grad_attention=None):
    attention = torch.rand(2, 5) if attention is None else attention
    mask = torch.zeros(2, 5, dtype=torch.bool) if mask is None else mask
    lam = torch.zeros(2) if lam is None else lam
    grad_lam = torch.ones(2) if grad_lam is None else grad_lam
    return T.top_tau_backward(attention, mask, lam, grad_lam, grad_attention, None, 0, 0)


X3 = torch.randn(2, 6, 4)
INDICES = torch.randint(0, 6, (2, 3, 2))
SELECTOR = (torch.randn(3, 4), torch.randn(2, 5, 4), torch.randn(6, 4), torch.randn(6, 4))
AGGREGATE = (torch.rand(2, 3, 5), torch.rand(2, 5), torch.rand(2, 5, 3))


def _replace(args: tuple, i: int, value: torch.Tensor) -> tuple:
    return (*args[:i], value, *args[i + 1 :])


# probe -> (call, the argument its error names); every call is a mistake
DIRECT: dict[str, tuple[Callable[[], object], str]] = {
    # top_tau: per-row k, k_max, devices, dtypes, shapes
    "top_tau k 9 > k_max 3": (lambda: _top_tau(k=torch.tensor([9, 9])), r"k must lie in \[1, k_max=3\].*got 9"),
    "top_tau k -2": (lambda: _top_tau(k=torch.tensor([-2, 1])), r"k must lie in \[1, k_max=3\].*got -2"),
    "top_tau k 0": (lambda: _top_tau(k=torch.tensor([1, 0])), r"k must lie in \[1, k_max=3\].*got 0"),
    "top_tau k_max 0": (lambda: _top_tau(k_max=0), r"k_max .* must lie in \[1, d=5\], got 0"),
    "top_tau k_max 6": (lambda: _top_tau(k_max=6), r"k_max .* must lie in \[1, d=5\], got 6"),
    "top_tau k on meta": (lambda: _top_tau(k=_meta(torch.ones(2, dtype=torch.int64))), "k is on meta"),
    "top_tau valid on meta": (lambda: _top_tau(valid=_meta(torch.ones(2, 5, dtype=torch.bool))), "valid is on meta"),
    "top_tau blur on meta": (lambda: _top_tau(blur=_meta(torch.ones(3))), "blur_kernel is on meta"),
    "top_tau k float": (lambda: _top_tau(k=torch.ones(2)), "k must be Long"),
    "top_tau k [3]": (lambda: _top_tau(k=torch.ones(3, dtype=torch.int64)), r"k must hold one count per row \(2\)"),
    "top_tau valid int": (lambda: _top_tau(valid=torch.ones(2, 5, dtype=torch.int64)), "valid must be Bool"),
    "top_tau valid [2, 4]": (lambda: _top_tau(valid=torch.ones(2, 4, dtype=torch.bool)), "valid must have the shape"),
    "top_tau logits int": (lambda: _top_tau(logits=torch.ones(2, 5, dtype=torch.int64)), "logits must be float32"),
    "top_tau logits 3-D": (lambda: _top_tau(logits=torch.randn(2, 5, 1)), "logits must have 2 dimensions"),
    "top_tau grid 2x2": (lambda: _top_tau(grid=(2, 2)), "grid 2x2 does not hold d=5"),
    "top_tau_backward grad_lam on meta": (
        lambda: _top_tau_backward(grad_lam=_meta(torch.ones(2))),
        "grad_lam is on meta",
    ),
    "top_tau_backward mask on meta": (
        lambda: _top_tau_backward(mask=_meta(torch.zeros(2, 5, dtype=torch.bool))),
        "mask is on meta",
    ),
    "top_tau_backward lam [3]": (lambda: _top_tau_backward(lam=torch.zeros(3)), r"lam must have shape \[N=2\]"),
    "top_tau_backward attention half": (
        lambda: _top_tau_backward(attention=torch.rand(2, 5).half()),
        "attention must be float32 or float64",
    ),
    "top_tau_backward grad_attention [2, 4]": (
        lambda: _top_tau_backward(grad_attention=torch.rand(2, 4)),
        "grad_attention must have the shape of attention",
    ),
    # sparsemax
    "sparsemax x int": (lambda: T.sparsemax(torch.ones(2, 3, dtype=torch.int64)), "x must be float32"),
    "sparsemax x 3-D": (lambda: T.sparsemax(torch.randn(2, 3, 4)), "x must have 2 dimensions"),
    "sparsemax_backward grad on meta": (
        lambda: T.sparsemax_backward(torch.rand(2, 3), _meta(torch.rand(2, 3))),
        "grad is on meta but p is on cpu",
    ),
    "sparsemax_backward p on meta": (
        lambda: T.sparsemax_backward(_meta(torch.rand(2, 3)), torch.rand(2, 3)),
        "grad is on cpu but p is on meta",
    ),
    "sparsemax_backward grad [3, 2]": (
        lambda: T.sparsemax_backward(torch.rand(2, 3), torch.rand(3, 2)),
        "grad must have the shape of p",
    ),
    "sparsemax_backward p double": (
        lambda: T.sparsemax_backward(torch.rand(2, 3).double(), torch.rand(2, 3)),
        "p must be Float, got Double",
    ),
    # gather_tokens
    "gather_tokens indices on meta": (lambda: T.gather_tokens(X3, _meta(INDICES), 0), "indices is on meta"),
    "gather_tokens indices 6 (T=6)": (
        lambda: T.gather_tokens(X3, torch.full((2, 3, 2), 6), 0),
        r"indices must lie in \[0, T=6\) or be -1 \(padding\), got 6",
    ),
    "gather_tokens indices -2": (lambda: T.gather_tokens(X3, torch.full((2, 3, 2), -2), 0), "got -2"),
    "gather_tokens indices int32": (lambda: T.gather_tokens(X3, INDICES.int(), 0), "indices must be Long"),
    "gather_tokens indices batch 1": (lambda: T.gather_tokens(X3, INDICES[:1], 0), "indices batch 1 does not match"),
    "gather_tokens prefix 7": (lambda: T.gather_tokens(X3, INDICES, 7), r"prefix must lie in \[0, T=6\], got 7"),
    "gather_tokens x int": (lambda: T.gather_tokens(X3.long(), INDICES, 0), "x must be float32"),
    "gather_tokens_backward indices on meta": (
        lambda: T.gather_tokens_backward(torch.randn(6, 2, 4), _meta(INDICES), 0, 6),
        "indices is on meta",
    ),
    "gather_tokens_backward indices 6 (T=6)": (
        lambda: T.gather_tokens_backward(torch.randn(6, 2, 4), torch.full((2, 3, 2), 6), 0, 6),
        r"indices must lie in \[0, T=6\)",
    ),
    "gather_tokens_backward grad [6, 3, 4]": (
        lambda: T.gather_tokens_backward(torch.randn(6, 3, 4), INDICES, 0, 6),
        r"grad must have shape \[6, 2, E\]",
    ),
    # the composites
    "group_select w_q [6, 3]": (
        lambda: T.group_select(*_replace(SELECTOR, 2, torch.randn(6, 3)), 1.0),
        r"w_q and w_k must both have shape \[H', H=4\]",
    ),
    "group_select w_k [7, 4]": (
        lambda: T.group_select(*_replace(SELECTOR, 3, torch.randn(7, 4)), 1.0),
        r"w_q and w_k must both have shape .*w_k \(7, 4\)",
    ),
    "group_select class_queries 1-D": (
        lambda: T.group_select(*_replace(SELECTOR, 0, torch.randn(4)), 1.0),
        "class_queries must have shape",
    ),
    "group_select z int": (
        lambda: T.group_select(*_replace(SELECTOR, 1, torch.ones(2, 5, 4).long()), 1.0),
        "z must be",
    ),
    "group_select w_q on meta": (
        lambda: T.group_select(*_replace(SELECTOR, 2, _meta(SELECTOR[2])), 1.0),
        "w_q on meta",
    ),
    "aggregate lam on meta": (lambda: T.aggregate(*_replace(AGGREGATE, 1, _meta(AGGREGATE[1]))), "lam on meta"),
    "aggregate lam int": (lambda: T.aggregate(*_replace(AGGREGATE, 1, AGGREGATE[1].long())), "lam must be float32"),
    "aggregate lam [2, 4]": (lambda: T.aggregate(*_replace(AGGREGATE, 1, torch.rand(2, 4))), "shapes do not line up"),
}

# the same mistakes through the Python ops
PUBLIC: dict[str, tuple[Callable[[], object], str]] = {
    "top_tau k 9": (lambda: ops.top_tau(torch.randn(2, 5), k=torch.tensor([9, 1])), "k must lie in"),
    "top_tau k -2": (lambda: ops.top_tau(torch.randn(2, 5), k=torch.tensor([-2, 1])), "k must lie in"),
    "top_tau k on meta": (lambda: ops.top_tau(torch.randn(2, 5), k=_meta(torch.ones(2).long())), "k on meta"),
    "top_tau meta logits, k on the CPU": (
        lambda: ops.top_tau(_meta(torch.randn(2, 5)), k=torch.ones(2).long()),
        "logits on meta, k on cpu",
    ),
    "top_tau meta k on meta logits": (
        lambda: ops.top_tau(_meta(torch.randn(2, 5)), k=_meta(torch.ones(2).long())),
        "k must be an int or a tensor with values",
    ),
    "top_tau valid on meta": (
        lambda: ops.top_tau(torch.randn(2, 5), 0.5, valid=_meta(torch.ones(2, 5, dtype=torch.bool))),
        "valid on meta",
    ),
    "sparsemax x int": (lambda: ops.sparsemax(torch.ones(2, 3, dtype=torch.int64)), "x must be float32"),
    "gather_tokens indices on meta": (lambda: ops.gather_tokens(X3, _meta(INDICES)), "indices on meta"),
    "gather_tokens indices 6": (lambda: ops.gather_tokens(X3, torch.full((2, 3, 2), 6)), "indices must lie in"),
    "gather_tokens_reference indices 2-D": (
        lambda: ops.gather_tokens_reference(X3, INDICES[0]),
        r"indices must have shape \[B, m, k\]",
    ),
    "gather_tokens_reference x 2-D": (
        lambda: ops.gather_tokens_reference(X3[0], INDICES),
        r"x must have shape \[B, T, E\]",
    ),
    "gather_tokens_reference batch 1": (
        lambda: ops.gather_tokens_reference(X3, INDICES[:1]),
        "indices batch 1 does not match x batch 2",
    ),
    "gather_tokens_reference indices on meta": (
        lambda: ops.gather_tokens_reference(X3, _meta(INDICES)),
        "indices on meta",
    ),
    "group_select w_q [6, 3]": (
        lambda: ops.group_select(*_replace(SELECTOR, 2, torch.randn(6, 3)), 1.0),
        r"w_q and w_k must both have shape \[H', H=4\]",
    ),
    "group_select_reference w_q 1-D": (
        lambda: ops.group_select_reference(*_replace(SELECTOR, 2, torch.randn(4)), 1.0),
        r"w_q must have shape \[H', H\]",
    ),
    "group_select z on meta": (lambda: ops.group_select(*_replace(SELECTOR, 1, _meta(SELECTOR[1])), 1.0), "z on meta"),
    "aggregate y on meta": (lambda: ops.aggregate(*_replace(AGGREGATE, 2, _meta(AGGREGATE[2]))), "y on meta"),
}

CPU_BACKENDS = [b for b in ("cpp", "torch", "triton") if ops.available_backends()[b]]


def _refused(call: Callable[[], object], message: str) -> None:
    """``call`` raises a ValueError or TypeError matching ``message`` (nothing silent, nothing generic)."""
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@needs_cpp
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("probe", list(DIRECT))
def test_the_dispatcher_ops_refuse_naming_the_argument(probe, backend, use_backend):
    """``torch.ops.sopfast.<op>`` on every CPU backend (the C++ kernels, the references and Triton behind the
    C++ checks, the Meta kernel for the mixed-device calls)."""
    use_backend(backend)
    _refused(*DIRECT[probe])


@pytest.mark.parametrize("probe", list(PUBLIC))
def test_the_python_ops_refuse_naming_the_argument(probe):
    _refused(*PUBLIC[probe])


@needs_cpp
def test_every_op_of_the_registry_is_probed():
    probed = {probe.split()[0] for probe in DIRECT}
    assert probed == {op.name for op in _backends.OPS.values()} | {"group_select", "aggregate"}


@needs_cpp
def test_the_checks_are_one_binding_per_kernel_and_skip_values_for_fake_tensors():
    """``sopfast._C.check_<kernel>`` is what the Python-registered kernels run; without ``values`` (the fake's
    call) nothing is read, so a count outside [1, k_max] passes the shape checks there."""
    extension = _backends.native_extension()
    for kernel in _backends.OPS:
        assert callable(getattr(extension, f"check_{kernel}"))
    k = torch.tensor([9, 9])
    extension.check_top_tau_forward(torch.randn(2, 5), k, 3, None, True, True, None, 0, 0, values=False)
    with pytest.raises(ValueError, match=r"k must lie in \[1, k_max=3\]"):
        extension.check_top_tau_forward(torch.randn(2, 5), k, 3, None, True, True, None, 0, 0)


@needs_cpp
def test_valid_calls_still_pass_every_entry_point(use_backend):
    """k = 1 and k = k_max, -1 padding, no rows, all on meta."""
    valid = torch.tensor([[True, True, True, False, False]] * 2)
    indices, mask, *_ = T.top_tau(torch.randn(2, 5), torch.tensor([3, 1]), 3, valid, True, True, None, 0, 0)
    assert mask.sum(dim=1).tolist() == [3, 1] and indices[1, 1:].tolist() == [-1, -1]
    assert T.top_tau(torch.randn(0, 5), torch.zeros(0, dtype=torch.int64), 0, None, True, True, None, 0, 0)[
        0
    ].shape == (
        0,
        0,
    )
    assert T.gather_tokens(X3, torch.full((2, 3, 2), -1), 1).abs()[:, 1:].sum() == 0
    meta = T.top_tau(_meta(torch.randn(2, 5)), _meta(torch.ones(2).long()), 3, None, True, True, None, 0, 0)
    assert meta[0].device.type == META and meta[0].shape == (2, 3)


@needs_cpp
def test_a_fake_tensor_trace_runs_the_checks_without_values():
    """Under FakeTensorMode (what torch.compile traces with) the fake kernels run the C++ checks on fake
    tensors: shapes are checked, values are not read."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        logits, k = torch.empty(2, 5), torch.empty(2, dtype=torch.int64)
        assert T.top_tau(logits, k, 3, None, True, True, None, 0, 0)[0].shape == (2, 3)
        with pytest.raises(ValueError, match="k must hold one count per row"):
            T.top_tau(logits, torch.empty(3, dtype=torch.int64), 3, None, True, True, None, 0, 0)


# -- the arguments of the explainers, the losses, the outputs, evaluate --------------------------------


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("occlusion", {"window": 0}, r"explainer_options\['window'\] must be an integer ≥ 1, got 0"),
        ("kernelshap", {"n_samples": 0}, r"explainer_options\['n_samples'\] must be an integer ≥ 1, got 0"),
        ("lime", {"perturbations_per_eval": -3}, r"explainer_options\['perturbations_per_eval'\]"),
        ("occlusion", {"window": 2.5}, r"explainer_options\['window'\]"),
    ],
)
def test_explainer_options_are_positive_integers(name, options, message):
    _refused(lambda: check_explainer(name, options), message)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_regression_loss_refuses_non_finite_targets(bad):
    b, m, c = 2, 3, 1
    args = (torch.randn(b, m, c), torch.rand(b, c, m), torch.rand(b, m))
    _refused(lambda: scaled_mse_loss(*args, torch.tensor([1.0, bad])), r"targets .* must be finite")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (torch.tensor([0, 5]), r"labels must lie in \[0, 2\] \(the 3 classes of the logits\), got \[5\]"),
        (torch.tensor([0.0, 1.0]), "labels must be an integer tensor"),
    ],
)
def test_accuracy_refuses_labels_that_are_no_class_ids(labels, message):
    _refused(lambda: sopfast.evaluation.metrics.accuracy(torch.randn(2, 3), labels), message)


@pytest.fixture(scope="module")
def vit_output():
    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=4).eval()
    with torch.no_grad():
        return model, model(torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("target", ["cat", True, [True, False], ["a", "b"]])
def test_feature_attributions_refuse_a_target_that_is_no_class_id(vit_output, target):
    _, out = vit_output
    _refused(lambda: out.feature_attributions(target=target), "target must be a class id")


@pytest.mark.parametrize("counts", ["group_counts", "curve_counts"])
def test_evaluate_refuses_group_counts_above_the_models_groups(vit_output, counts):
    model, _ = vit_output  # m = 4 groups over d = 16 features
    loader = [(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))]
    metric = "num_groups" if counts == "group_counts" else "curves"
    _refused(
        lambda: sopfast.evaluate(model, loader, metrics=[metric], progress=False, **{counts: [1, 5]}),
        rf"{counts} must be at most the model's num_groups m=4, got \[5\]",
    )


def test_evaluate_still_refuses_group_counts_above_the_features():
    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=20).eval()  # d = 16 features
    loader = [(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))]
    _refused(
        lambda: sopfast.evaluate(model, loader, metrics=["num_groups"], group_counts=[18], progress=False),
        r"group_counts must be at most the 16 features of the inputs, got \[18\]",
    )


@pytest.mark.parametrize("value", [0.5, 2.0, -1.0])
def test_attention_mask_holds_only_zeros_and_ones(value):
    ids, mask, types = text_batch()
    model = sopfast.SOP(make_bert(), num_groups=2).eval()
    bad = mask.float().clone()
    bad[0, 1] = value
    _refused(lambda: model(ids, bad, types), r"attention_mask must hold only the values \{0, 1\}")
