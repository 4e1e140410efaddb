"""What :func:`sopfast.evaluate` scores: a :class:`Method` makes groups for a batch and predicts from
them on SOP's masked-inference path (``model.adapter.run_groups``, exact or drop).  SOP itself is
one (:class:`SOPMethod`); the baselines (:mod:`sopfast.evaluation.baselines`) are the others.

A :class:`Method` does the per-batch work that does not depend on the sparsity in
:meth:`Method.prepare` and returns a :class:`Prediction` at a sparsity τ from :meth:`Method.predict`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import torch

from ..masking import run_masked
from ..ops import aggregate, top_tau
from ..types import FeatureInputs, GroupPredictions, Groups

if TYPE_CHECKING:
    from ..model.sop import SOP

COMBINES = ("mean", "selector", "per_output")
#: What a :class:`Method`'s :meth:`~Method.prepare` hands to its :meth:`~Method.predict`.
StateT = TypeVar("StateT")


@dataclass
class Prediction:
    """A self-attributing prediction: ``logits [B, C]``, ``attributions [B, C, m]`` (summing to the
    logits), ``group_masks [B, m, d]`` bool, ``used [B, C, m]`` (the groups each class uses) and
    ``group_logits [B, m, C]``, the backbone's logits on each group alone (``None`` for a method that does not
    give them: the ``bounds`` metric needs them)."""

    logits: torch.Tensor
    attributions: torch.Tensor
    group_masks: torch.Tensor
    used: torch.Tensor
    group_logits: torch.Tensor | None = None


class Method(ABC, Generic[StateT]):
    """Something :func:`sopfast.evaluate` can score: it makes groups and predicts from them.

    ``StateT`` is the type of the per-batch state :meth:`prepare` returns and :meth:`predict` takes.
    """

    name: str = "method"

    def prepare(self, model: SOP, inputs: FeatureInputs, mode: str) -> StateT:
        """Per-batch work independent of the sparsity (attributions, attention); passed to :meth:`predict`.

        The default does no work and returns ``None`` (a subclass keeping it is a ``Method[None]``)."""
        # The type system cannot tie "StateT is None" to "prepare is not overridden".
        return cast(StateT, None)

    #: Whether :meth:`predict` takes ``num_groups`` (a method with several groups whose count can change).
    varies_groups: bool = False

    @abstractmethod
    def predict(
        self,
        model: SOP,
        inputs: FeatureInputs,
        state: StateT,
        tau: float | None,
        largest: bool | None,
        mode: str,
        num_groups: int | None = None,
    ) -> Prediction:
        """Predict with groups of sparsity ``tau`` (``None``: the model's τ) holding the highest-ranked
        features (``largest=False``: the lowest; ``None``: the method's own choice); methods that
        :attr:`varies_groups` use the first ``num_groups`` of their groups (``None``: all)."""


# -- shared group execution -----------------------------------------------------------------
def candidate_mask(model: SOP, inputs: FeatureInputs) -> torch.Tensor:
    """``[B, d]`` bool: the features that may join a group."""
    return model.adapter.candidate_mask(inputs)


def top_tau_masks(scores: torch.Tensor, valid: torch.Tensor, tau: float, largest: bool = True) -> torch.Tensor:
    """``[B, m, d]`` bool: per row of ``scores [B, m, d]`` the top-τ valid features (SOP's rule:
    ``k = max(1, floor(τ·d_valid))``, ties to the lower index)."""
    b, m, d = scores.shape
    rows_valid = None if bool(valid.all()) else valid.unsqueeze(1).expand(b, m, d).reshape(b * m, d)
    flat = torch.nan_to_num(scores.detach().float(), nan=0.0).reshape(b * m, d)
    return top_tau(flat, tau, valid=rows_valid, largest=largest, ties="logits").mask.view(b, m, d)


def run_masks(model: SOP, inputs: FeatureInputs, masks: torch.Tensor, mode: str) -> GroupPredictions:
    """The frozen backbone on every mask of ``masks [B, P, d]`` → logits ``[B, P, C]``, keys ``[B, P, H]``
    (:func:`sopfast.masking.masked_forward`: a ViT in ``drop`` mode runs masks of each size together;
    masks that keep nothing run as the input with every feature removed)."""
    b, p, d = masks.shape
    example = torch.arange(b, device=masks.device).repeat_interleave(p)
    out = run_masked(model.adapter, inputs, example, masks.reshape(b * p, d), mode, allow_empty=True)
    return GroupPredictions(out.logits.view(b, p, -1), out.embeddings.view(b, p, -1))


def combine_groups(
    model: SOP, preds: GroupPredictions, masks: torch.Tensor, how: str, reference: torch.Tensor | None = None
) -> Prediction:
    """Turn group predictions into a :class:`Prediction`.

    ``"mean"``: average of the group logits (BagNet); ``"selector"``: SOP's trained selector
    with ``λ = 1`` (with its agreement prior, ``selection_prior``, which needs the backbone's full-input logits
    ``reference [B, C]``); ``"per_output"``: group ``c`` alone predicts output ``c`` (needs ``m = C``).
    """
    y = preds.logits.float()
    b, m, c = y.shape
    if how == "mean":
        alpha = y.transpose(1, 2) / m
        return Prediction(alpha.sum(-1), alpha, masks, torch.ones_like(alpha, dtype=torch.bool), y)
    if how == "selector":
        with torch.no_grad():
            scores = model.select(preds, reference)
            logits = aggregate(scores, masks.new_ones(b, m, dtype=torch.float32), preds.logits)
        return Prediction(logits.float(), scores * y.transpose(1, 2), masks, scores > 0, y)
    if how == "per_output":
        if m != c:
            raise ValueError(f"combine='per_output' needs one group per output (m = C = {c}), got m={m}")
        eye = torch.eye(c, dtype=torch.bool, device=y.device).expand(b, c, c)
        alpha = y.transpose(1, 2) * eye
        return Prediction(alpha.sum(-1), alpha, masks, eye.clone(), y)
    raise ValueError(f"combine must be one of {COMBINES}, got {how!r}")


def backbone_logits(model: SOP, inputs: FeatureInputs) -> torch.Tensor:
    """``[B, C]``: the plain backbone on the full input (:meth:`sopfast.SOP.reference_logits`)."""
    return model.reference_logits(inputs)


# -- score-based methods ------------------------------------------------------------------
class ScoreBaseline(Method[torch.Tensor]):
    """Groups are the top-τ features of per-group scores ``[B, m, d]``; the backbone predicts on each."""

    combine: str = "mean"

    @abstractmethod
    def scores(self, model: SOP, inputs: FeatureInputs, mode: str = "exact") -> torch.Tensor:
        """``[B, m, d]`` feature scores, one row per group (higher = kept first); perturbation
        methods run their masked inputs in ``mode``."""

    def combine_mode(self, model: SOP) -> str:
        return self.combine

    def prepare(self, model: SOP, inputs: FeatureInputs, mode: str) -> torch.Tensor:
        return self.scores(model, inputs, mode).detach()

    def predict(
        self,
        model: SOP,
        inputs: FeatureInputs,
        state: torch.Tensor,
        tau: float | None,
        largest: bool | None,
        mode: str,
        num_groups: int | None = None,
    ) -> Prediction:
        tau = model.tau if tau is None else tau
        scores = state if num_groups is None else state[:, :num_groups]
        masks = top_tau_masks(scores, candidate_mask(model, inputs), tau, largest is not False)
        how = self.combine_mode(model)
        reference = backbone_logits(model, inputs) if how == "selector" and model.selection_prior > 0 else None
        return combine_groups(model, run_masks(model, inputs, masks, mode), masks, how, reference)


# -- SOP as a method ------------------------------------------------------------------------
@dataclass
class _SOPState:
    emb: torch.Tensor
    valid: torch.Tensor
    grid: tuple[int, int] | None
    demote: torch.Tensor | None = None
    logits: dict[int, torch.Tensor] = field(default_factory=dict)


class SOPMethod(Method[_SOPState]):
    """The SOP model itself: the generator embedding runs once per batch (:meth:`prepare`), and
    groups at any τ / group count come from the same attention logits (:meth:`groups`)."""

    name = "SOP"
    varies_groups = True

    def prepare(self, model: SOP, inputs: FeatureInputs, mode: str) -> _SOPState:
        with torch.no_grad():
            emb = model.adapter.embed(model.projection, inputs)
        grid = model.adapter.feature_grid(inputs)
        return _SOPState(emb, candidate_mask(model, inputs), grid, model.demoted(inputs))

    def groups(self, model: SOP, state: _SOPState, tau: float, largest: bool, num_groups: int | None = None) -> Groups:
        """What ``model.make_groups`` returns for this τ (eval mode; ``largest=False`` = ``deletion=True``)."""
        m = model.num_groups if num_groups is None else num_groups
        if m not in state.logits:
            with torch.no_grad(), torch.autocast(device_type=state.emb.device.type, enabled=False):
                state.logits[m] = model.generator.logits(state.emb, state.valid, m, None, state.demote)
        return model.generator.binarise(state.logits[m], state.valid, tau, deletion=not largest, grid=state.grid)

    def predict(
        self,
        model: SOP,
        inputs: FeatureInputs,
        state: _SOPState,
        tau: float | None,
        largest: bool | None,
        mode: str,
        num_groups: int | None = None,
    ) -> Prediction:
        tau = model.tau if tau is None else tau
        largest = (not model.deletion) if largest is None else largest
        out = model.predict_groups(inputs, self.groups(model, state, tau, largest, num_groups), mode)
        return Prediction(
            out.logits.float(), out.attributions.float(), out.group_masks, out.group_scores > 0, out.group_logits
        )
