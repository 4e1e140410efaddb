"""The result of one SOP forward pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from ..checks import check_values
from .losses import classification_loss, scaled_mse_loss


@dataclass
class SOPOutput:
    """Everything a prediction is made of.

    Shapes: ``B`` examples, ``m`` groups, ``C`` classes/outputs, ``d`` features.

    * ``logits [B, C]`` – ``ŷ_c = Σ_i c_{c,i} λ_i y_{i,c}``
    * ``group_logits [B, m, C]`` – the frozen backbone's logits ``y_i`` on each group
    * ``group_scores [B, C, m]`` – the selector's sparse weights ``c`` (each row sums to 1)
    * ``lam [B, m]`` – the gradient-passing scales ``λ_i ∈ [−1, 1]``
    * ``group_masks [B, m, d]`` – the groups as bool masks at feature resolution
    * ``group_indices [B, m, k]`` – the same groups as ascending feature positions (``-1`` padding)
    * ``attention [B, m, d]`` – the generator's softmax rows (what insertion/deletion order by)
    * ``task`` – ``"classification"`` or ``"regression"``
    * ``labels`` – the labels given to the forward (``model(x, labels=y)``), or ``None``; with them
      :attr:`loss` is the loss tensor, as in Hugging Face ``Trainer`` / Lightning-style loops
    * ``backbone_logits [B, C]`` – the frozen backbone's logits on the whole input, where the forward computed
      them (``agreement_prior``, training with the recipe's penalties), else ``None``

    Indexing follows transformers' ``ModelOutput``: ``out["logits"]`` (any field by name), and
    ``out[0]`` is the loss when labels were given (else the logits); see :meth:`to_tuple`.
    """

    logits: torch.Tensor
    group_logits: torch.Tensor
    group_scores: torch.Tensor
    lam: torch.Tensor
    group_masks: torch.Tensor
    group_indices: torch.Tensor
    attention: torch.Tensor
    task: str = "classification"
    labels: torch.Tensor | None = None
    backbone_logits: torch.Tensor | None = None

    @property
    def attributions(self) -> torch.Tensor:
        """``α [B, C, m] = c · λ · y``; ``α.sum(-1) == logits`` exactly (fidelity 0)."""
        return self.group_scores * self.lam.unsqueeze(1) * self.group_logits.transpose(1, 2)

    @property
    def active_groups(self) -> torch.Tensor:
        """``[B, C]`` number of groups with a non-zero score, per class."""
        return (self.group_scores > 0).sum(dim=-1)

    def compute_loss(self, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy (classification) or the paper's scaled MSE (regression) against ``labels``."""
        if self.task == "regression":
            return scaled_mse_loss(self.group_logits, self.group_scores, self.lam, labels)
        return classification_loss(self.logits, labels)

    def loss_terms(self, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loss by term, each a scalar tensor that sums to :meth:`compute_loss`: ``task_loss`` (what
        :meth:`compute_loss` is without training penalties: the quantity a validation loss measures) and,
        in training with the recipe's penalties, ``diversity_penalty`` / ``saliency_penalty``."""
        return {"task_loss": SOPOutput.compute_loss(self, labels)}

    def with_labels(self, labels: torch.Tensor) -> SOPOutput:
        """Attach ``labels``: :attr:`loss` becomes the loss tensor (computed here, so bad labels fail now)."""
        self.labels = labels
        self._loss = self.compute_loss(labels)
        return self

    @property
    def loss(self) -> torch.Tensor | Callable[[torch.Tensor], torch.Tensor]:
        """The loss: a scalar tensor when the forward got ``labels=`` (computed once); otherwise the
        function :meth:`compute_loss`, so that ``out.loss(labels)`` works as well."""
        if self.labels is None:
            return self.compute_loss
        if getattr(self, "_loss", None) is None:
            self._loss = self.compute_loss(self.labels)
        return self._loss

    def feature_attributions(self, target: int | torch.Tensor | None = None) -> torch.Tensor:
        """``[B, d]`` per-feature attributions for class ``target``: each feature's ``c·λ·y``
        (:attr:`attributions`) summed over the groups that hold it, ``Σ_i α_{target,i} · g_i``.

        A feature in no group with a non-zero score gets 0; groups overlap, so the ``d`` values do
        not sum to the logit (each group is counted once per feature it holds).  ``target``: a
        class id, ``[B]`` class ids, or ``None`` for each example's predicted class.
        """
        b, c, _ = self.group_scores.shape
        if target is None:
            target = self.logits.argmax(dim=-1)
        allowed = f"a class id (int), {b} class ids (a tensor or list) or None"
        try:
            target = torch.as_tensor(target, device=self.logits.device)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"target must be {allowed}, got {target!r} ({type(target).__name__})") from None
        if target.dtype == torch.bool or target.is_complex():
            raise TypeError(f"target must be {allowed}, got a tensor of dtype {target.dtype}")
        if target.is_floating_point() or target.dim() > 1 or (target.dim() == 1 and target.numel() != b):
            raise ValueError(f"target must be a class id or {b} class ids (one per example), got {target.tolist()}")
        if bool(((target < 0) | (target >= c)).any()):
            raise ValueError(f"target must lie in [0, {c}), got {target.tolist()}")
        index = target.long().expand(b).view(b, 1, 1).expand(b, 1, self.group_scores.shape[-1])
        weights = self.attributions.gather(1, index).squeeze(1)
        return torch.einsum("bm,bmd->bd", weights, self.group_masks.to(weights.dtype))

    def to_tuple(self) -> tuple[torch.Tensor, ...]:
        """``(loss, logits)`` when labels were given, else ``(logits,)``: what training loops index (a
        Hugging Face ``Trainer`` hands ``compute_metrics`` the logits alone); the explanation's tensors
        are attributes and keys (``out["group_masks"]``)."""
        return (cast(torch.Tensor, self.loss), self.logits) if self.labels is not None else (self.logits,)

    def __getitem__(self, key: int | slice | str):
        if isinstance(key, str):
            if key not in KEYS or (key == "loss" and self.labels is None):
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]


KEYS = (
    "loss",
    "logits",
    "group_logits",
    "group_scores",
    "lam",
    "group_masks",
    "group_indices",
    "attention",
    "backbone_logits",
)


def check_finite_group_logits(group_logits: torch.Tensor) -> None:
    """Raise ValueError when the backbone's logits on the groups are not finite (on a GPU a device-side assertion)."""
    check_values(
        torch.isfinite(group_logits).all(),
        "the backbone's logits on the groups are not finite: the inputs lie outside what it can "
        "represent (check their scale and normalisation)",
    )


def concatenate_outputs(parts: list[SOPOutput]) -> SOPOutput:
    """The outputs of consecutive example chunks as one (group indices ``-1``-padded to one width)."""
    width = max(p.group_indices.shape[-1] for p in parts)
    indices = [F.pad(p.group_indices, (0, width - p.group_indices.shape[-1]), value=-1) for p in parts]
    fields = ("logits", "group_logits", "group_scores", "lam", "group_masks", "attention")
    references = [p.backbone_logits for p in parts if p.backbone_logits is not None]
    return SOPOutput(
        **{f: torch.cat([getattr(p, f) for p in parts]) for f in fields},
        group_indices=torch.cat(indices),
        task=parts[0].task,
        backbone_logits=torch.cat(references) if len(references) == len(parts) else None,
    )
