"""Small data containers shared by the model, the adapters and the reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FeatureInputs:
    """One batch as the adapters see it.

    ``pixels [B, C, H, W]`` for image backbones; ``input_ids``, ``attention_mask`` and
    ``token_type_ids`` ``[B, T]`` for text backbones.
    """

    pixels: torch.Tensor | None = None
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    token_type_ids: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        ref = self.pixels if self.pixels is not None else self.input_ids
        return int(ref.shape[0])

    @property
    def device(self) -> torch.device:
        ref = self.pixels if self.pixels is not None else self.input_ids
        return ref.device

    def rows(self, index: slice | torch.Tensor) -> FeatureInputs:
        """The examples ``index`` of the batch."""
        return FeatureInputs(**{k: None if v is None else v[index] for k, v in vars(self).items()})


@dataclass
class Groups:
    """Binary groups at feature resolution.

    ``mask [B, m, d]`` bool; ``indices [B, m, k_max]`` ascending feature positions
    (``-1``-padded when examples keep different counts); ``lam [B, m]`` the
    gradient-passing scales; ``attention [B, m, d]`` the generator's softmax rows.
    """

    mask: torch.Tensor
    indices: torch.Tensor
    lam: torch.Tensor
    attention: torch.Tensor


@dataclass
class GroupPredictions:
    """The frozen backbone's outputs per group: logits ``y [B, m, C]`` and selector keys ``z [B, m, H]``."""

    logits: torch.Tensor
    keys: torch.Tensor
