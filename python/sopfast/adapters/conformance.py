"""An adapter proves itself: :func:`check_adapter` compares what it computes with what its backbone computes,
on a few examples (``sopfast.adapters.check``, ``sopfast check-adapter``; ``register_adapter(...,
check_with=...)`` runs it when an adapter is registered).

* **full forward**: :meth:`~BackboneAdapter.full_forward` on the input gives the model's own logits;
* **classifier**: the classifier weight is ``[C, H]`` for ``C`` logits and keys of width ``H``;
* **features**: ``d`` features, the candidate mask ``[B, d]`` bool, the grid ``(h, w)`` with ``h · w = d``;
* **embedding**: the generator embedding ``[B, d, E]`` equals the model's own hidden state
  (:meth:`~BackboneAdapter.reference_embed`) where the adapter names one;
* **exact groups**: every group pass in ``exact`` gives the logits and keys of the model on the masked
  input (:func:`masked_inputs`: the authors' masking — pixels zeroed outside the group, tokens set to
  [PAD] and attention-masked);
* **drop**: a claim that ``drop`` computes the backbone's own function (``exact_modes``) holds: its group
  passes equal ``exact``'s.  Where it does not, the faithful mode is ``exact``: the explainers of
  :mod:`sopfast.masking` follow the measurement (:data:`~sopfast.adapters.base.MEASURED_EXACT_MODES`).

Groups are fixed (every candidate, every second one, the first quarter, the middle one), so a check is the
same on every run.  Values agree when ``max |a − b| ≤ tolerance · spread(b)`` (:func:`spread`: how much the
expected values vary across examples, groups or features — what explanations are made of; ``tolerance``:
1e-4 for float32 and float64 backbones, 1e-2 for float16 and bfloat16).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..types import FeatureInputs, Groups
from .base import MEASURED_EXACT_MODES, BackboneAdapter
from .images import parameter_dtype, pixel_grid_mask

#: ``tolerance`` by the backbone's parameter dtype (module docstring).
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2}
DEFAULT_TOLERANCE = 1e-4
TEXT_FIELDS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Finding:
    """One comparison: its ``name``, whether it ``passed``, and what was compared (and how far apart)."""

    name: str
    passed: bool
    detail: str


@dataclass
class AdapterCheck:
    """What :func:`check_adapter` found: one :class:`Finding` per comparison, and the modes measured to compute
    the backbone's own function (``exact_modes``; the faithful mode follows them)."""

    adapter: str
    examples: int
    tolerance: float
    findings: list[Finding] = field(default_factory=list)
    exact_modes: tuple[str, ...] = ("exact",)

    @property
    def ok(self) -> bool:
        """Whether every comparison passed (a refuted ``drop`` claim is a failure too)."""
        return all(f.passed for f in self.findings)

    @property
    def faithful_mode(self) -> str:
        return "drop" if "drop" in self.exact_modes else "exact"

    def failed(self, *, but: tuple[str, ...] = ()) -> list[Finding]:
        """The findings that failed, leaving out those named in ``but``."""
        return [f for f in self.findings if not f.passed and f.name not in but]

    def __str__(self) -> str:
        head = f"sopfast adapter check: {self.adapter} on {self.examples} example(s)"
        lines = [f"{head}, tolerance {self.tolerance:g} × spread"]
        lines += [f"  {'ok  ' if f.passed else 'FAIL'}  {f.name}: {f.detail}" for f in self.findings]
        verdict = "passed" if self.ok else f"FAILED ({', '.join(f.name for f in self.failed())})"
        lines.append(f"  {verdict}; the explainers' faithful mode: {self.faithful_mode!r}")
        return "\n".join(lines)


class AdapterCheckError(ValueError):
    """An adapter computes something else than its backbone (the message is the :class:`AdapterCheck`)."""


def masked_inputs(adapter: BackboneAdapter, inputs: FeatureInputs, masks: torch.Tensor) -> FeatureInputs:
    """The ``B·m`` inputs of ``masks [B, m, d]`` masked the authors' way: images have the pixels outside a
    group zeroed (the grid mask upsampled, nearest), texts have the tokens outside it (but the second
    segment) set to the adapter's ``pad_token_id`` and attention-masked."""
    b, m, d = masks.shape
    if inputs.pixels is not None:
        grid = adapter.feature_grid(inputs)
        if grid is None:
            raise TypeError(f"{type(adapter).__name__} has image inputs but no feature grid to mask pixels with")
        size = (inputs.pixels.shape[-2], inputs.pixels.shape[-1])
        pixel_masks = pixel_grid_mask(masks.reshape(b * m, d), grid, size).to(inputs.pixels.dtype)
        return FeatureInputs(pixels=inputs.pixels.repeat_interleave(m, dim=0) * pixel_masks)
    attention_mask = inputs.require_attention_mask()
    token_type_ids = inputs.require_token_type_ids()
    keep = masks | (attention_mask.bool() & (token_type_ids == 1)).unsqueeze(1)
    ids = inputs.require_input_ids().unsqueeze(1).expand(b, m, d)
    pad = getattr(adapter, "pad_token_id", None)  # text adapters mask a token with it; the protocol does not say
    if not isinstance(pad, int):
        raise TypeError(f"{type(adapter).__name__} has no int pad_token_id, which masking a text needs")
    return FeatureInputs(
        input_ids=torch.where(keep, ids, torch.full_like(ids, pad)).flatten(0, 1),
        attention_mask=(attention_mask.unsqueeze(1) * keep).flatten(0, 1),
        token_type_ids=token_type_ids.unsqueeze(1).expand(b, m, d).flatten(0, 1),
    )


def example_inputs(adapter: BackboneAdapter, examples: int = 2, seed: int = 0) -> FeatureInputs:
    """Random inputs the adapter takes, for a check without data: images ``[examples, C, H, W]`` of normal
    pixels (the adapter's channels and size; 224 × 224 without one), or texts of 16 random token ids (of the
    model's ``config.vocab_size``), the second one padded after 12 (TypeError for other adapters)."""
    generator = torch.Generator().manual_seed(seed)
    if adapter.modality == "image":
        h, w = adapter.image_size or (224, 224)
        return adapter.prepare(torch.randn(examples, adapter.channels or 3, h, w, generator=generator))
    vocab = getattr(getattr(adapter.backbone, "config", None), "vocab_size", None)
    if adapter.modality != "text" or not isinstance(vocab, int):
        raise TypeError(f"{type(adapter).__name__}: no random example can be made for it; give an example (--data)")
    length = min(16, adapter.max_tokens or 16)
    ids = torch.randint(0, vocab, (examples, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[1:, 12:] = 0
    ids[mask == 0] = adapter.pad_token_id or 0
    return adapter.prepare(ids, mask, torch.zeros_like(ids))


def default_tolerance(adapter: BackboneAdapter) -> float:
    """:data:`TOLERANCE` for the backbone's parameter dtype."""
    return TOLERANCE.get(parameter_dtype(adapter.backbone) or torch.float32, DEFAULT_TOLERANCE)


def spread(values: torch.Tensor) -> float:
    """How much ``values [N, ...]`` vary across their rows (examples, groups, features): the root mean square
    about their mean row (about 0 for a single row) — the scale differences are measured against."""
    if values.numel() == 0:
        return 0.0
    rows = values.reshape(values.shape[0], -1) if values.dim() > 1 else values.reshape(-1, 1)
    centred = rows - rows.mean(dim=0) if rows.shape[0] > 1 else rows
    return float(centred.pow(2).mean().sqrt())


def _compare(name: str, what: str, got: torch.Tensor, want: torch.Tensor, tolerance: float) -> Finding:
    """Whether ``got`` equals ``want`` within ``tolerance · rms(want)`` (shapes first)."""
    if got.shape != want.shape:
        return Finding(name, False, f"{what}: shape {list(got.shape)}, expected {list(want.shape)}")
    got, want = got.detach().double(), want.detach().double()
    error = float((got - want).abs().max()) if got.numel() else 0.0
    allowed = tolerance * spread(want)
    passed = error <= allowed
    return Finding(name, passed, f"{what} (max |Δ| {error:.2g} {'≤' if passed else '>'} {allowed:.2g})")


def own_logits(backbone: Any, inputs: FeatureInputs) -> torch.Tensor:
    """The backbone's own logits on ``inputs``: called on the pixels, or with the text fields its ``forward``
    names (``input_ids``, ``attention_mask``, ``token_type_ids``)."""
    if inputs.pixels is not None:
        out = backbone(inputs.pixels)
    else:
        named = inspect.signature(backbone.forward).parameters
        given = {k: getattr(inputs, k) for k in TEXT_FIELDS if getattr(inputs, k) is not None and k in named}
        out = backbone(**given)
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out[0]


def probe_groups(adapter: BackboneAdapter, inputs: FeatureInputs) -> torch.Tensor:
    """``[B, 4, d]`` bool: every candidate, every second one, the first quarter and the middle one."""
    valid = adapter.candidate_mask(inputs)
    rank = valid.long().cumsum(dim=1) - 1
    count = valid.sum(dim=1, keepdim=True)
    groups = (rank >= 0, rank % 2 == 0, rank < (count // 4).clamp_min(1), rank == count // 2)
    return torch.stack(groups, dim=1) & valid.unsqueeze(1)


def _passes(adapter: BackboneAdapter, inputs: FeatureInputs, masks: torch.Tensor, mode: str) -> tuple:
    """Logits ``[B·G, C]`` and keys of one group pass per example and mask (groups of one size per call)."""
    logits, keys = [], []
    for b in range(masks.shape[0]):
        one = inputs.rows(slice(b, b + 1))
        for mask in masks[b]:
            out = adapter.run_groups(one, Groups.from_masks(mask.view(1, 1, -1)), mode, 1)
            logits.append(out.logits[0, 0])
            keys.append(out.keys[0, 0])
    return torch.stack(logits), torch.stack(keys)


def measure_drop(adapter: BackboneAdapter, inputs: FeatureInputs, tolerance: float | None = None) -> Finding:
    """``drop``'s group passes against ``exact``'s on :func:`probe_groups` (a claimed ``drop = exact`` must hold;
    a measurement is recorded in :data:`~sopfast.adapters.base.MEASURED_EXACT_MODES` for the class)."""
    tolerance = default_tolerance(adapter) if tolerance is None else tolerance
    masks = probe_groups(adapter, inputs)
    with torch.no_grad(), evaluating(adapter.backbone):
        exact = _passes(adapter, inputs, masks, "exact")[0]
        drop = _passes(adapter, inputs, masks, "drop")[0]
    claimed = "drop" in adapter.exact_modes
    finding = _compare("drop = exact" if claimed else "drop", "drop's group logits vs exact's", drop, exact, tolerance)
    if claimed:
        MEASURED_EXACT_MODES[type(adapter)] = adapter.exact_modes if finding.passed else ("exact",)
        if not finding.passed:
            finding.detail += (
                ": exact_modes claims drop computes the backbone's own function; the faithful mode is exact"
            )
    else:
        finding = Finding(finding.name, True, finding.detail + ": not claimed exact (the explainers run exact)")
    return finding


def check_adapter(adapter: BackboneAdapter, inputs: FeatureInputs, tolerance: float | None = None) -> AdapterCheck:
    """Every comparison of the module docstring on ``inputs``, with the backbone in eval mode."""
    tolerance = default_tolerance(adapter) if tolerance is None else tolerance
    report = AdapterCheck(type(adapter).__name__, inputs.batch_size, tolerance)
    steps: list[tuple[str, Callable[[], Finding]]] = [
        ("full forward", lambda: _full_forward(adapter, inputs, tolerance)),
        ("classifier", lambda: _classifier(adapter, inputs)),
        ("features", lambda: _features(adapter, inputs)),
        ("embedding", lambda: _embedding(adapter, inputs, tolerance)),
        ("exact groups", lambda: _exact_groups(adapter, inputs, tolerance)),
    ]
    if "drop" in adapter.supported_modes:
        steps.append(("drop", lambda: measure_drop(adapter, inputs, tolerance)))
    with torch.no_grad(), evaluating(adapter.backbone):
        report.findings = [_run(name, step) for name, step in steps]
    drop_ok = all(f.passed for f in report.findings if f.name == "drop = exact")
    report.exact_modes = adapter.exact_modes if drop_ok else ("exact",)
    return report


@contextmanager
def evaluating(module: Any) -> Iterator[None]:
    """``module`` in eval mode inside (no dropout: a comparison must be repeatable), as it was after."""
    training = bool(getattr(module, "training", False))
    module.eval()
    try:
        yield
    finally:
        module.train(training)


def _run(name: str, step: Callable[[], Finding]) -> Finding:
    """``step()``, or the error it raised as a failed finding called ``name`` (a check reports, it does not stop)."""
    try:
        return step()
    except Exception as err:  # any error of the adapter's code is what the check reports
        return Finding(name, False, f"{type(err).__name__}: {err}")


def _full_forward(adapter: BackboneAdapter, inputs: FeatureInputs, tolerance: float) -> Finding:
    logits, keys = adapter.full_forward(inputs)
    finding = _compare(
        "full forward", "the model's own logits", logits, own_logits(adapter.backbone, inputs), tolerance
    )
    if finding.passed and keys.shape != (inputs.batch_size, adapter.key_dim):
        return Finding("full forward", False, f"keys {list(keys.shape)}, expected [B, key_dim={adapter.key_dim}]")
    return finding


def _classifier(adapter: BackboneAdapter, inputs: FeatureInputs) -> Finding:
    logits, keys = adapter.full_forward(inputs)
    try:
        weight = adapter.classifier_weight()
    except (AttributeError, ValueError) as err:
        return Finding("classifier", True, f"no classifier weight ({err}): SOP needs class_weights=[C, H]")
    expected = [int(logits.shape[-1]), int(keys.shape[-1])]
    passed = list(weight.shape) == expected
    return Finding("classifier", passed, f"weight {list(weight.shape)}, [C, H] of the logits and keys: {expected}")


def _features(adapter: BackboneAdapter, inputs: FeatureInputs) -> Finding:
    d = adapter.num_features(inputs)
    valid = adapter.candidate_mask(inputs)
    grid = adapter.feature_grid(inputs)
    problems = []
    if valid.dtype != torch.bool or tuple(valid.shape) != (inputs.batch_size, d):
        problems.append(
            f"candidates {valid.dtype} {list(valid.shape)}, expected bool [B, d] = [{inputs.batch_size}, {d}]"
        )
    if grid is not None and grid[0] * grid[1] != d:
        problems.append(f"grid {grid} holds {grid[0] * grid[1]} cells, not the d = {d} features")
    if inputs.pixels is not None and grid is None:
        problems.append("image features without a grid (pictures, blur and pixel masks need one)")
    shape = f"grid {grid[0]}×{grid[1]}" if grid is not None else "a sequence"
    return Finding("features", not problems, "; ".join(problems) or f"d = {d} ({shape}), candidates [B, d] bool")


def _embedding(adapter: BackboneAdapter, inputs: FeatureInputs, tolerance: float) -> Finding:
    projection = adapter.make_projection()
    emb = adapter.embed(projection, inputs)
    expected = (inputs.batch_size, adapter.num_features(inputs), adapter.embed_dim)
    if tuple(emb.shape) != expected:
        return Finding("embedding", False, f"embed gives {list(emb.shape)}, expected [B, d, E] = {list(expected)}")
    if type(adapter).reference_embed is BackboneAdapter.reference_embed:
        return Finding("embedding", True, f"[B, d, E] = {list(expected)}; no reference_embed names the model's own")
    reference = adapter.reference_embed(projection, inputs)
    return _compare("embedding", "the model's own hidden state (reference_embed)", emb, reference, tolerance)


def _exact_groups(adapter: BackboneAdapter, inputs: FeatureInputs, tolerance: float) -> Finding:
    if "exact" not in adapter.supported_modes:
        return Finding("exact groups", False, f"{type(adapter).__name__} does not run mode 'exact'")
    masks = probe_groups(adapter, inputs)
    logits, keys = _passes(adapter, inputs, masks, "exact")
    want_logits, want_keys = adapter.full_forward(masked_inputs(adapter, inputs, masks))
    found = _compare("exact groups", "the model on the masked inputs: logits", logits, want_logits, tolerance)
    if not found.passed:
        return found
    with_keys = _compare("exact groups", "and keys", keys, want_keys, tolerance)
    return Finding("exact groups", with_keys.passed, f"{found.detail}, {with_keys.detail}")
