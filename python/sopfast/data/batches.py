"""One parser for every batch form sopfast accepts (training, evaluation, the CLI, user data).

:func:`parse_batch` turns a loader item into a :class:`Batch`:

* a bare tensor ``x``;
* tuples / lists ``(x,)``, ``(x, y)``, ``(x, y, gt)`` (the ground truth's position can be chosen);
* dicts with the input under ``"pixel_values"``, ``"x"`` or ``"images"`` (images) or
  ``"input_ids"`` + ``"attention_mask"`` (+ ``"token_type_ids"``) (text), labels under
  ``"labels"``, ``"label"`` or ``"y"``, and a ground-truth mask under ``"evidence_mask"``,
  ``"gt_mask"`` or ``"ground_truth"`` (or a key you name).

``x [B, C, H, W]`` images (or ``[B, T]`` token ids); ``y [B]`` class ids or ``[B, C]`` / ``[B]``
regression targets; ``gt`` a ``[B, d]``, ``[B, h, w]`` or ``[B, H, W]`` mask.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

IMAGE_KEYS = ("pixel_values", "x", "images")
LABEL_KEYS = ("labels", "label", "y")
TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")
GROUND_TRUTH_KEYS = ("evidence_mask", "gt_mask", "ground_truth")
FORMATS = (
    "a batch must be a tensor x, a tuple/list (x,), (x, y) or (x, y, gt), or a dict with "
    "'pixel_values' | 'x' | 'images' (images) or 'input_ids' + 'attention_mask' (text), and optional "
    "'labels' | 'label' | 'y' and 'evidence_mask' | 'gt_mask' | 'ground_truth'"
)


@dataclass
class Batch:
    """A parsed batch: the model input (``x`` images, or ``input_ids`` with masks), ``labels``, ``ground_truth``.

    Exactly one of ``x`` and ``input_ids`` is set; the others may be ``None``.
    """

    x: torch.Tensor | None = None
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    token_type_ids: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    ground_truth: torch.Tensor | None = None

    @property
    def is_text(self) -> bool:
        return self.input_ids is not None

    def __len__(self) -> int:
        ref = self.input_ids if self.input_ids is not None else self.x
        if ref is None:
            raise TypeError("the batch has neither x nor input_ids")
        return int(ref.shape[0])

    def model_inputs(self) -> dict[str, torch.Tensor | None]:
        """Keyword arguments for ``SOP.forward`` / ``SOP.prepare`` (``x=`` or ``input_ids=`` + masks)."""
        if self.is_text:
            return {
                "input_ids": self.input_ids,
                "attention_mask": self.attention_mask,
                "token_type_ids": self.token_type_ids,
            }
        return {"x": self.x}

    def adapter_inputs(self) -> dict[str, torch.Tensor | None]:
        """Positional-order keyword arguments for ``BackboneAdapter.prepare`` (``x``, masks)."""
        if self.is_text:
            return {"x": self.input_ids, "attention_mask": self.attention_mask, "token_type_ids": self.token_type_ids}
        return {"x": self.x}

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})


def _tensor(name: str, value: Any) -> torch.Tensor | None:
    if value is None or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, numbers.Number) or (isinstance(value, Sequence) and not isinstance(value, str)):
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"batch entry {name!r} must be a tensor, got {type(value).__name__}") from err
    raise TypeError(f"batch entry {name!r} must be a tensor, got {type(value).__name__}")


def _first(batch: Mapping, keys: Sequence[str]) -> tuple[str | None, Any]:
    return next(((k, batch[k]) for k in keys if k in batch), (None, None))


def check_ground_truth_key(ground_truth_key: Any) -> str | int | None:
    """``ground_truth_key`` if it is a dict key (str), a tuple position (int) or None; TypeError naming it."""
    if isinstance(ground_truth_key, bool) or not isinstance(ground_truth_key, (str, int, type(None))):
        raise TypeError(
            f"ground_truth_key must be a dict key (str), a tuple position (int) or None, got {ground_truth_key!r}"
        )
    return ground_truth_key


def parse_batch(batch: Any, ground_truth_key: str | int | None = None) -> Batch:
    """Parse one loader item (forms: the module docstring).

    ``ground_truth_key``: the dict key (default: the first of ``GROUND_TRUTH_KEYS`` present) or the
    tuple position (default 2) of the ground-truth mask.  Raises ``TypeError`` / ``ValueError``
    naming what was found and what is allowed.
    """
    check_ground_truth_key(ground_truth_key)
    if isinstance(batch, Mapping):
        return _parse_dict(batch, ground_truth_key)
    if isinstance(batch, torch.Tensor):
        batch = (batch,)
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return _parse_sequence(batch, ground_truth_key)
    raise TypeError(f"{FORMATS}; got {type(batch).__name__}")


def _parse_sequence(batch: Sequence, ground_truth_key: str | int | None) -> Batch:
    if isinstance(ground_truth_key, str):
        raise ValueError(f"ground_truth_key={ground_truth_key!r} names a dict key but the batch is a tuple")
    if ground_truth_key is not None and not 1 <= ground_truth_key < len(batch):
        raise ValueError(
            f"ground_truth_key={ground_truth_key} is out of range for a tuple of length {len(batch)} "
            f"(allowed: 1..{len(batch) - 1})"
        )
    if len(batch) > 3:
        raise ValueError(f"{FORMATS}; got a tuple of length {len(batch)}")
    gt_index = 2 if ground_truth_key is None else ground_truth_key
    labels = _tensor("labels", batch[1]) if len(batch) > 1 and gt_index != 1 else None
    gt = _tensor("ground_truth", batch[gt_index]) if gt_index < len(batch) else None
    return Batch(x=batch[0], labels=labels, ground_truth=gt)


def _parse_dict(batch: Mapping, ground_truth_key: str | int | None) -> Batch:
    if isinstance(ground_truth_key, int):
        raise ValueError(f"ground_truth_key={ground_truth_key} is a tuple position but the batch is a dict")
    image_key, x = _first(batch, IMAGE_KEYS)
    if "input_ids" in batch and image_key is not None:
        raise ValueError(f"a batch holds either images or token ids, got both 'input_ids' and {image_key!r}")
    if ground_truth_key is not None and ground_truth_key not in batch:
        raise ValueError(f"ground_truth_key={ground_truth_key!r} is not in the batch (keys: {sorted(map(str, batch))})")
    gt_key, gt = (
        (ground_truth_key, batch[ground_truth_key])
        if ground_truth_key is not None
        else _first(batch, GROUND_TRUTH_KEYS)
    )
    _, labels = _first(batch, LABEL_KEYS)
    common = {"labels": _tensor("labels", labels), "ground_truth": _tensor(gt_key or "ground_truth", gt)}
    if "input_ids" in batch:
        text = {k: _tensor(k, batch.get(k)) for k in TEXT_KEYS}
        return Batch(**text, **common)
    if image_key is None:
        raise ValueError(f"{FORMATS}; got a dict with keys {sorted(map(str, batch))}")
    return Batch(x=_tensor(image_key, x), **common)


__all__ = [
    "FORMATS",
    "GROUND_TRUTH_KEYS",
    "IMAGE_KEYS",
    "LABEL_KEYS",
    "TEXT_KEYS",
    "Batch",
    "check_ground_truth_key",
    "parse_batch",
]


def to_device(batch: Any, device: torch.device) -> Any:
    """Move the tensors of a batch (tensor, tuple/list or dict) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
