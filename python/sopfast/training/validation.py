"""One batch through the model in training, and the validation pass of :func:`sopfast.train`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from ..data.batches import FORMATS, parse_batch, to_device
from ..model.group_counts import distinct_rows
from ..model.output import SOPOutput
from .distributed import DistInfo, all_reduce_sum
from .state import capture_rng, restore_rng


def forward_batch(model: torch.nn.Module, batch: Any) -> tuple[SOPOutput, torch.Tensor]:
    """Run ``model`` on one batch of any form :func:`sopfast.data.batches.parse_batch` accepts; it must hold labels."""
    parsed = parse_batch(batch)
    if parsed.labels is None:
        raise ValueError(f"training batches need labels ('labels' | 'label' | 'y', or (x, y) tuples); {FORMATS}")
    return model(**parsed.model_inputs()), parsed.labels


def _agreeing(model: Any, out: SOPOutput, batch: Any) -> torch.Tensor:
    """How many predictions of one batch equal the frozen backbone's on the whole input."""
    reference = out.backbone_logits
    if reference is None:
        reference = model.reference_logits(model.prepare(**parse_batch(batch).model_inputs()))
    return (out.logits.argmax(dim=-1) == reference.argmax(dim=-1)).sum().double()


def has_unused_parameters(
    model: Any, batch: Any, device: torch.device, autocast: Callable[[], AbstractContextManager]
) -> bool:
    """Whether a backward pass on ``batch`` leaves a trainable parameter of ``model`` (an SOP) without a
    gradient (what DDP's ``find_unused_parameters`` must know).  Runs in eval mode (no dropout, no
    running-statistics updates), clears the gradients and restores the RNG states."""
    rng = capture_rng()
    model.eval()
    with autocast():
        out, labels = forward_batch(model, to_device(batch, device))
        loss = out.compute_loss(labels)
    loss.backward()
    unused = any(p.grad is None for p in model.trainable_parameters())
    for p in model.trainable_parameters():
        p.grad = None
    restore_rng(rng)
    return unused


def _score(task: str, out: SOPOutput, labels: torch.Tensor) -> torch.Tensor:
    """Correct predictions (classification) or summed per-example MSE (regression) of one batch."""
    if task == "classification":
        return (out.logits.argmax(dim=-1) == labels).sum().double()
    err = out.logits.double() - labels.double().reshape(out.logits.shape)
    return err.pow(2).mean(dim=1).sum()


@torch.no_grad()
def validate(
    model: Any,
    loader: Iterable,
    device: torch.device,
    info: DistInfo,
    autocast: Callable[[], AbstractContextManager],
) -> dict[str, float]:
    """``val_loss`` and ``val_accuracy`` with ``val_agreement`` (the share of predictions equal to the frozen
    backbone's on the whole input; classification) or ``val_mse`` (regression), and ``val_distinct_groups``
    (the mean number of different groups per example), of ``model`` (a :class:`sopfast.SOP`) over ``loader``,
    summed over all ranks; the RNG states are left as they were."""
    was_training = model.training
    model.eval()
    classification = model.task == "classification"
    sums = torch.zeros(5, dtype=torch.float64, device=device)
    cuda = [device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, device_type=device.type):
        for batch in loader:
            batch = to_device(batch, device)
            with autocast():
                out, labels = forward_batch(model, batch)
                agreeing = _agreeing(model, out, batch) if classification else torch.zeros((), device=device)
            sums += torch.stack(
                [
                    out.compute_loss(labels).double() * labels.shape[0],
                    _score(model.task, out, labels),
                    torch.tensor(labels.shape[0], device=device, dtype=torch.float64),
                    agreeing.double(),
                    distinct_rows(out.group_masks).sum().double(),
                ]
            )
    model.train(was_training)
    loss, score, count, agreeing, distinct = all_reduce_sum(sums, info).tolist()
    if count == 0:
        raise ValueError("val_data is empty")
    groups = {"val_distinct_groups": distinct / count}
    if not classification:
        return {"val_loss": loss / count, "val_mse": score / count, **groups}
    return {"val_loss": loss / count, "val_accuracy": score / count, "val_agreement": agreeing / count, **groups}
