"""What the image and the text demo share (:mod:`sopfast.demo.run`, :mod:`sopfast.demo.text`): their batches,
SOP's training and accuracy as the demos measure them, and where the trained backbone is saved."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from ..data.batches import Batch, parse_batch
from ..model.sop import SOP
from ..model.state_files import write_model_folder

#: Metrics the demos score on their smaller sets of examples (ten forwards per example and method).
CURVE_METRICS = ("fidelity", "insertion", "deletion")


def parsed_batches(dataset: torch.utils.data.Dataset, device: torch.device, batch_size: int = 64) -> list[Batch]:
    """Every batch of ``dataset`` (in order) as :func:`sopfast.data.batches.parse_batch` reads it, on ``device``."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    return [parse_batch(raw).to(device) for raw in loader]


def batch_labels(batch: Batch) -> torch.Tensor:
    """The batch's labels (ValueError without them: the demos score against labels)."""
    if batch.labels is None:
        raise ValueError("the demo's evaluation batches need labels")
    return batch.labels


def sop_accuracy(model: SOP, batches: list[Batch], mode: str) -> tuple[float, float]:
    """Accuracy and the mean number of groups used for the predicted class."""
    model.eval()
    correct = total = active = 0
    with torch.no_grad():
        for batch in batches:
            labels = batch_labels(batch)
            right, used = _correct_and_used(model(**batch.model_inputs(), mode=mode), labels)
            correct, active, total = correct + right, active + used, total + len(labels)
    return correct / max(1, total), active / max(1, total)


def _correct_and_used(out: Any, labels: torch.Tensor) -> tuple[int, int]:
    """How many of ``out``'s predictions equal ``labels [B]``, and the groups used for them, summed."""
    pred = out.logits.argmax(-1)
    return int((pred == labels).sum()), int(out.active_groups.gather(1, pred[:, None]).sum())


def train_sop(
    model: SOP, dataset, run_dir: str, device: torch.device, seed: int, epochs: int, batch_size: int = 32
) -> float:
    """Train the demo's SOP with its recipe's lr and warm-up (no resume, run files in ``run_dir``);
    returns wall seconds."""
    from ..training.trainer import train

    start = time.perf_counter()
    train(
        model,
        dataset,
        None,
        epochs=epochs,
        batch_size=batch_size,
        output_dir=run_dir,
        resume=False,
        device=device,
        seed=seed,
        diagnose=False,  # the study runs the diagnostic once, on held-out images
    )
    return time.perf_counter() - start


def save_demo_backbone(out_dir: str, *parts: Any) -> None:
    """The demo's trained backbone (``parts``: the model, its tokenizer, each with ``save_pretrained``) in
    ``<out_dir>/backbone``, all-or-nothing; an earlier demo's (``results.json`` beside it) is replaced."""
    earlier = os.path.isfile(os.path.join(out_dir, "results.json"))
    write_model_folder(
        os.path.join(out_dir, "backbone"), lambda folder: [p.save_pretrained(folder) for p in parts], overwrite=earlier
    )


def record_accuracy(results: dict, model: SOP, batches: list[Batch]) -> None:
    """SOP's accuracy and groups used in ``exact`` and ``drop`` on ``batches``, and how often the two modes
    predict the same class (and each group the same class), from one forward per mode and batch."""
    model.eval()
    counts = dict.fromkeys(("exact", "drop", "active_exact", "active_drop", "final", "group", "total"), 0.0)
    with torch.no_grad():
        for batch in batches:
            labels = batch_labels(batch)
            outs = {mode: model(**batch.model_inputs(), mode=mode) for mode in ("exact", "drop")}
            for mode, out in outs.items():
                right, used = _correct_and_used(out, labels)
                counts[mode] += right
                counts[f"active_{mode}"] += used
            same = outs["exact"].logits.argmax(-1) == outs["drop"].logits.argmax(-1)
            same_groups = outs["exact"].group_logits.argmax(-1) == outs["drop"].group_logits.argmax(-1)
            counts["final"] += int(same.sum())
            counts["group"] += float(same_groups.float().mean(dim=1).sum())
            counts["total"] += len(labels)
    total = max(1.0, counts["total"])
    for mode in ("exact", "drop"):
        results[f"sop_{mode}_accuracy"] = counts[mode] / total
        results[f"active_groups_{mode}"] = counts[f"active_{mode}"] / total
    results["exact_drop_agreement"] = counts["final"] / total
    results["exact_drop_group_agreement"] = counts["group"] / total
