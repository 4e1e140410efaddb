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

    # Typed accessors: an adapter knows which fields its batches hold; these return the tensor
    # (not ``Optional``) or raise a TypeError naming the missing field.
    def require_pixels(self) -> torch.Tensor:
        """``pixels``, which image adapters always set."""
        return _required("pixels", self.pixels)

    def require_input_ids(self) -> torch.Tensor:
        """``input_ids``, which text adapters always set."""
        return _required("input_ids", self.input_ids)

    def require_attention_mask(self) -> torch.Tensor:
        """``attention_mask``, which text adapters always set."""
        return _required("attention_mask", self.attention_mask)

    def require_token_type_ids(self) -> torch.Tensor:
        """``token_type_ids``, which text adapters always set."""
        return _required("token_type_ids", self.token_type_ids)

    def _reference(self) -> torch.Tensor:
        """The tensor whose leading axis is the batch: ``pixels`` or else ``input_ids``."""
        if self.pixels is not None:
            return self.pixels
        return _required("pixels or input_ids", self.input_ids)

    @property
    def batch_size(self) -> int:
        return int(self._reference().shape[0])

    @property
    def device(self) -> torch.device:
        return self._reference().device

    def rows(self, index: slice | torch.Tensor) -> FeatureInputs:
        """The examples ``index`` of the batch."""
        return FeatureInputs(**{k: None if v is None else v[index] for k, v in vars(self).items()})


def _required(name: str, value: torch.Tensor | None) -> torch.Tensor:
    if value is None:
        raise TypeError(f"FeatureInputs.{name} is None, but this backbone's batches need it")
    return value


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
    #: What bounds the width of each example's ``drop`` passes (the adapter's ``drop_widths``), on its way to
    #: the host since before the projection pass; set by ``SOP.make_groups`` for adapters whose ``drop``
    #: widths depend on the data (BERT); ``None``: the adapter counts them after the groups are made.
    drop_widths: HostValues | None = None

    @classmethod
    def from_masks(cls, masks: torch.Tensor) -> Groups:
        """Groups of given bool ``masks [B, P, d]`` (ascending ``-1``-padded indices, ``λ = 1``)."""
        b, p, d = masks.shape
        k_max = max(1, int(masks.sum(dim=-1).max())) if masks.numel() else 1
        pos = torch.arange(d, device=masks.device).expand_as(masks)
        idx = torch.sort(torch.where(masks, pos, pos + d), dim=-1).values[..., :k_max]
        idx = torch.where(idx < d, idx, torch.full_like(idx, -1))
        return cls(mask=masks, indices=idx, lam=masks.new_ones(b, p, dtype=torch.float32), attention=masks.float())


class HostValues:
    """The integers of a tensor, copied to host memory without waiting for the work queued before
    the copy.  On a GPU the copy goes to pinned memory with its own event, so :meth:`values` waits for that
    copy alone — queued early (before the projection pass), it is done by the time the values are needed,
    and the GPU never idles for it (no stream sync).  On the CPU the values are the tensor's own."""

    def __init__(self, values: torch.Tensor):
        self._event: torch.cuda.Event | None = None
        if values.device.type == "cuda":
            self._host = values.to("cpu", non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = values.to("cpu")

    def values(self) -> list:
        """The values (``tolist``), once the copy is done."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


@dataclass
class GroupPredictions:
    """The frozen backbone's outputs per group: logits ``y [B, m, C]`` and selector keys ``z [B, m, H]``."""

    logits: torch.Tensor
    keys: torch.Tensor
