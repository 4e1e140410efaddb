"""How a grouped prediction relates to the backbone it explains: how well each group alone makes the
frozen backbone predict what it predicts on the whole input (SOP's ``agreement_prior`` and
``sufficiency_weight``), and where a grouped prediction can lose agreement (:func:`group_bounds`: what
``sopfast.diagnose`` and the ``bounds`` metric of ``sopfast.evaluate`` report)."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..checks import Checked, check_number
from ..types import GroupPredictions
from .recipes import FOLLOWS


def agreement_scores(group_logits: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
    """``[B, m]``: ``log p_i(ŷ)``, the log-probability each group's logits ``[B, m, C]`` give to the class
    ``ŷ`` the frozen backbone predicts on the whole input (``reference_logits [B, C]``): how well a group
    alone makes the backbone say what it says on the full input (fp32, no gradient)."""
    target = reference_logits.detach().argmax(dim=-1)
    logp = torch.log_softmax(group_logits.detach().float(), dim=-1)
    return logp.gather(2, target.view(-1, 1, 1).expand(-1, logp.shape[1], 1)).squeeze(2)


def group_bounds(
    group_logits: torch.Tensor,
    reference_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Where a grouped prediction can lose, per example (1/0), from the backbone's logits on each group
    ``group_logits [B, m, C]`` and on the whole input ``reference_logits [B, C]``:

    * ``generator_bound`` – some group alone makes the backbone predict its full-input class;
    * ``generator_bound_correct`` – some group alone is predicted correctly (with ``labels [B]``);
    * ``selector_bound`` – the label-free rule "the first group that agrees with the backbone, else the
      most confident group" predicts correctly (with ``labels``): what a selector that finds the agreeing
      group would score with these groups;
    * ``selector_misses`` – some group agrees with the backbone but the method's prediction (its ``logits
      [B, C]``) does not: the inputs its selector loses. Where a group agrees the rule is right exactly
      where the backbone is, so the method's accuracy differs from the rule's only on these inputs and on
      those where no group agrees (where the rule falls back on the most confident group);
    * ``one_group_agrees`` – the share of the ``m`` groups that alone agree.
    """
    group_class = group_logits.argmax(dim=-1)
    backbone_class = reference_logits.argmax(dim=-1)
    agrees = group_class == backbone_class.unsqueeze(1)
    out = {"generator_bound": agrees.any(dim=1).float(), "one_group_agrees": agrees.float().mean(dim=1)}
    if logits is not None:
        out["selector_misses"] = (agrees.any(dim=1) & (logits.argmax(dim=-1) != backbone_class)).float()
    if labels is not None:
        out["generator_bound_correct"] = (group_class == labels.unsqueeze(1)).any(dim=1).float()
        confident = torch.softmax(group_logits.float(), dim=-1).amax(dim=-1).argmax(dim=1)
        pick = torch.where(agrees.any(dim=1), agrees.float().argmax(dim=1), confident)
        out["selector_bound"] = (group_class.gather(1, pick.unsqueeze(1)).squeeze(1) == labels).float()
    return out


class FullInputLogits:
    """The frozen backbone's logits ``[B, C]`` (fp32, no gradient) on whole inputs, through ``adapter``'s
    ``full_forward``, kept for the last inputs: an evaluation asks for them once per method and sparsity.
    What is kept is used again only for the same input tensors, unchanged since (their in-place versions),
    and the backbone's weights unchanged (their versions, dtypes and devices)."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self._kept: tuple[tuple, list, torch.Tensor] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"adapter": self.adapter, "_kept": None}  # what is kept is a cache: never saved or copied

    def _key(self, inputs: Any) -> tuple:
        tensors = tuple((id(t), t._version) for t in vars(inputs).values() if isinstance(t, torch.Tensor))
        backbone = self.adapter.backbone
        weights = tuple((p._version, p.dtype, p.device) for p in backbone.parameters())
        return tensors, id(backbone), weights

    def __call__(self, inputs: Any) -> torch.Tensor:
        key = self._key(inputs)
        if self._kept is not None and self._kept[0] == key and all(r() is not None for r in self._kept[1]):
            return self._kept[2]
        with torch.no_grad():
            logits = self.adapter.full_forward(inputs)[0].float()
        tensors = [t for t in vars(inputs).values() if isinstance(t, torch.Tensor)]
        self._kept = (key, [weakref.ref(t) for t in tensors], logits)
        return logits


def _prior(name: str, value: Any) -> float | None:
    return check_number(name, value, 0.0, optional=name in FOLLOWS)


class AgreementSelection:
    """The agreement prior of :class:`sopfast.SOP` (a mixin): the prior in use and the selector's weights
    with it. Both priors may change after construction (saved with their current values), each set checked."""

    training: bool
    task: str
    selector: Any
    agreement_prior = Checked(_prior, "The selector's prior at inference, and in training unless the next is set.")
    train_agreement_prior = Checked(_prior, "The selector's prior in training; ``None``: ``agreement_prior``.")

    @property
    def selection_prior(self) -> float:
        """The agreement prior the selector uses now (:meth:`prior_in_use`)."""
        return self.prior_in_use()[1]

    def prior_in_use(self) -> tuple[str, float]:
        """The option the selector's prior comes from now and its value: ``train_agreement_prior`` in training
        when set, else ``agreement_prior``."""
        if self.training and self.train_agreement_prior is not None:
            return "train_agreement_prior", self.train_agreement_prior
        return "agreement_prior", self.agreement_prior

    def select(self, preds: GroupPredictions, reference: torch.Tensor | None = None) -> torch.Tensor:
        """The selector's weights ``c [B, C, m]`` for group predictions ``preds`` (logits ``[B, m, C]``, keys
        ``[B, m, H]``); with an agreement prior (:attr:`selection_prior`) the backbone's full-input logits
        ``reference [B, C]`` are needed (and the task must be classification)."""
        name, prior = self.prior_in_use()
        if prior == 0 or preds.logits.shape[0] == 0:
            return self.selector(preds.keys)
        if reference is None or self.task != "classification":
            needs = "the backbone's full-input logits" if reference is None else "classes, which a regression lacks"
            raise ValueError(f"{name}={prior} > 0: the selector needs {needs}")
        return self.selector(preds.keys, prior * agreement_scores(preds.logits, reference))
