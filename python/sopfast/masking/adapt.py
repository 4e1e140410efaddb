"""Adapt a copy of a backbone to the inputs SOP gives it: groups of a few of its features.

SOP runs the frozen backbone on groups of about τ of the input's features.  A backbone trained only on
whole inputs may predict little from them (:func:`sopfast.diagnose` measures it), and then SOP learns
little.  :func:`adapt_backbone` fine-tunes a *copy* under random feature masking (in each mode the
backbone supports: masked features removed as ``exact`` removes them, and only the kept tokens run as in
``drop``), with the original's full-input prediction as a teacher beside the labels, so that the copy
still predicts as the original does on whole inputs (a regression backbone, ``task="regression"``: the
MSE to the targets and to the original's outputs).  It reports both backbones' accuracy, on whole
inputs and on random groups, and saves the copy as a separate backbone that records where it came from.
It changes the model SOP explains: the explanations are of the adapted copy, never of the original.

The copy is written all-or-nothing into a new folder (:func:`sopfast.model.state_files.write_model_folder`):
a folder that holds a model — another one, or an earlier adaptation — only with ``overwrite=True``, and
the original's own folder never.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import shutil
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..adapters import BackboneAdapter, get_adapter
from ..adapters.sources import Backbone, source_folders
from ..checks import check_bool, check_choice, check_int, check_number, check_path
from ..data.batches import parse_batch
from ..devices import adamw, module_device, resolve_device
from ..integrity import listed, non_finite
from ..model.checkpoint import hash_backbone
from ..model.sop import TASKS
from ..model.state_files import MODEL_PREFIXES, check_model_folder, write_model_folder
from ..schedules import lr_factor
from ..types import FeatureInputs, Groups
from ..version import __version__
from .diagnose import Diagnosis, diagnose
from .random_groups import random_groups
from .regression_diagnosis import RegressionDiagnosis

PROVENANCE_NAME = "sopfast_adaptation.json"
#: The share of the features a masked training input keeps is drawn uniformly from this range.
KEEP_RANGE = (0.1, 1.0)
#: The default number of steps is one pass over the training data, but at least this many.
MIN_STEPS = 400


@dataclass
class AdaptResult:
    """What :func:`adapt_backbone` returns: the adapted copy (``backbone``, in eval mode, frozen), the
    two backbones' diagnostics on the validation data (``before`` / ``after``: whole-input accuracy and
    random groups) and the provenance saved beside it (``output_dir``, when one was given)."""

    backbone: nn.Module
    before: Diagnosis | RegressionDiagnosis
    after: Diagnosis | RegressionDiagnosis
    provenance: dict[str, Any] = field(default_factory=dict)
    output_dir: str | None = None

    def lines(self) -> list[str]:
        mode, tau = self.after.mode, self.after.tau
        b, a = self.before, self.after
        if isinstance(b, RegressionDiagnosis) and isinstance(a, RegressionDiagnosis):
            what, full, digits = " (MSE)", (b.full_mse, a.full_mse), 4
        elif isinstance(b, Diagnosis) and isinstance(a, Diagnosis):
            what, full, digits = "", (b.full_accuracy, a.full_accuracy), 3
        else:
            raise TypeError("before and after must be diagnoses of the same task")
        return [
            f"whole inputs{what}: original {full[0]:.{digits}f}, adapted {full[1]:.{digits}f}",
            f"one random group of tau={tau:g} ({mode}): original {b.random_groups[mode].one_group:.{digits}f}, "
            f"adapted {a.random_groups[mode].one_group:.{digits}f}",
            f"verdict on the adapted backbone: {a.verdict}",
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def adapt_backbone(
    backbone: nn.Module | Backbone,
    train_data: Dataset | DataLoader,
    val_data: Dataset | DataLoader | None = None,
    *,
    steps: int | None = None,
    batch_size: int = 64,
    lr: float = 5e-4,
    teacher_weight: float = 3.0,
    label_weight: float = 1.0,
    tau: float = 0.2,
    num_groups: int = 20,
    seed: int = 0,
    device: str | torch.device | None = None,
    output_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    progress: bool = True,
    task: str = "classification",
    **adapter_kwargs: Any,
) -> AdaptResult:
    """Fine-tune a copy of ``backbone`` to predict from random groups of its features.

    Each batch is cut in parts, one per mode the backbone supports plus one whole: a part's examples
    keep a random ``U(0.1, 1)`` share of their features (``exact``: the others removed as SOP removes
    them; ``drop``: only the kept tokens run).  The loss is ``label_weight`` times the
    cross-entropy with the labels plus ``teacher_weight`` times the KL divergence from the original
    backbone's whole-input prediction.

    Args:
        backbone: a backbone sopfast has an adapter for (or a :func:`sopfast.adapters.load_backbone`
            record); it is copied, never changed.
        train_data: labelled training examples (Dataset or DataLoader, as :func:`sopfast.train`).
        val_data: labelled examples to report on (default: ``train_data``).
        steps: optimizer steps (default: one pass over ``train_data``, at least :data:`MIN_STEPS`).
        batch_size: examples per step (Datasets only).
        lr: AdamW learning rate (linear warm-up over 5 % of the steps, then cosine decay).  The defaults
            (5e-4, ``teacher_weight`` 3, at least 400 steps) were chosen on the demo's small ViT trained from
            scratch (``bench/quality/adaptation.md``); for a large pretrained backbone use the learning
            rate it was fine-tuned with (such as 2e-5 for a ViT-B/16).
        teacher_weight: weight of the original's whole-input prediction as a teacher (0: labels only).
        label_weight: weight of the labels (0: the teacher only; needs no labels).
        tau: the group size (fraction of the features) of the before/after diagnostics.
        num_groups: the number of random groups of the before/after diagnostics.
        seed: the data order and the masks.
        device: where to train (default: where the backbone is).
        output_dir: save the adapted copy there (:func:`save_adapted`) with ``sopfast_adaptation.json``: a
            new folder (checked before training), never the backbone's own.
        overwrite: replace the model ``output_dir`` holds (another one, or an earlier adaptation).
        progress: progress bars.
        task: ``"classification"`` or ``"regression"`` (the backbone's outputs are regressed values).
        **adapter_kwargs: the adapter's options (``feature_layer`` for CNNs).
    """
    source = backbone.describe() if isinstance(backbone, Backbone) else None
    original = backbone.model if isinstance(backbone, Backbone) else backbone
    if not isinstance(original, nn.Module):
        raise TypeError(f"backbone must be a torch.nn.Module, got {type(original).__name__}")
    check_int("steps", steps, 1, optional=True)
    check_int("batch_size", batch_size, 1)
    check_number("lr", lr, 0.0, above=True)
    check_number("teacher_weight", teacher_weight, 0.0)
    check_number("label_weight", label_weight, 0.0)
    if teacher_weight == 0 and label_weight == 0:
        raise ValueError("adapt_backbone: teacher_weight and label_weight are both 0, so nothing would be learned")
    check_int("seed", seed, 0)
    check_bool("progress", progress)
    check_choice("task", task, TASKS)
    check_bool("overwrite", overwrite)
    if output_dir is not None:
        check_path("output_dir", output_dir, directory=True)
        check_model_folder(output_dir, overwrite=overwrite, inputs=source_folders(source, original))
    _check_finite_parameters(original)
    run_device = resolve_device(device) if device is not None else module_device(original)
    original = original.to(run_device).eval()
    teacher = get_adapter(original, **adapter_kwargs)
    adapted = copy.deepcopy(original).requires_grad_(True)
    student = get_adapter(adapted, **adapter_kwargs)
    val_data = train_data if val_data is None else val_data
    diagnostics: dict[str, Any] = {
        "tau": tau,
        "num_groups": num_groups,
        "seed": seed,
        "device": run_device,
        "progress": progress,
        "task": task,
    }
    before = diagnose(teacher, val_data, **diagnostics)
    loader = _batches(train_data, batch_size, seed)
    if steps is None and not isinstance(loader, Sized):
        raise ValueError("train_data has no length: give steps=")
    total = steps if steps is not None else max(MIN_STEPS, len(cast(Sized, loader)))
    generator, weights = torch.Generator().manual_seed(seed), (label_weight, teacher_weight)
    _fine_tune(student, teacher, _cycle(loader), total, lr, weights, generator, task, progress)
    adapted.eval().requires_grad_(False)
    after = diagnose(student, val_data, **diagnostics)
    settings = {
        "steps": total,
        "batch_size": batch_size,
        "lr": lr,
        "teacher_weight": teacher_weight,
        "label_weight": label_weight,
        "seed": seed,
        "task": task,
    }
    provenance = {
        "adapted_from": source or {"spec": getattr(original, "name_or_path", None) or type(original).__name__},
        "original_sha256": hash_backbone(original),
        "adapted_sha256": hash_backbone(adapted),
        "method": "sopfast.adapt_backbone: fine-tuned under random feature masking (every supported mode) with "
        "the original's whole-input prediction as a teacher",
        "settings": settings,
        "before": before.to_dict(),
        "after": after.to_dict(),
        "sopfast_version": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    result = AdaptResult(adapted, before, after, provenance)
    if output_dir is not None:
        result.output_dir = save_adapted(adapted, provenance, output_dir, source, overwrite=overwrite)
    return result


def _fine_tune(
    student: BackboneAdapter,
    teacher: BackboneAdapter,
    batches: Iterator[Any],
    total: int,
    lr: float,
    weights: tuple[float, float],
    generator: torch.Generator,
    task: str,
    progress: bool,
) -> None:
    """``total`` optimizer steps of the ``student``'s backbone (the copy) on ``batches``, under random feature
    masking, towards the labels and the ``teacher``'s whole-input prediction (``weights``: theirs), with the
    fused AdamW and the schedule of :mod:`sopfast.schedules` (5 % warm-up, then cosine)."""
    adapted, device = student.backbone, module_device(teacher.backbone)
    optimizer = adamw([p for p in adapted.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor("cosine", max(1, total // 20), total))
    adapted.train()
    bar = tqdm(total=total, desc="sopfast adapt", disable=not progress)
    for step, raw in zip(range(total), batches):
        batch = parse_batch(raw).to(device)
        if weights[0] > 0 and (batch.labels is None or (batch.labels.dim() == 1) != (task == "classification")):
            what = "class labels" if task == "classification" else "regression targets [B, C]"
            raise ValueError(
                f"adapt_backbone needs {what} in every batch ((x, y) pairs or 'labels'), or label_weight=0"
            )
        inputs = teacher.prepare(**cast(dict[str, Any], batch.adapter_inputs()))
        loss = _loss(student, teacher, inputs, batch.labels, weights, generator, task)
        value = float(loss.detach())
        if not math.isfinite(value):
            raise ValueError(_non_finite_loss(value, step + 1, lr, adapted, teacher, inputs))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(adapted.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        bar.update(1)
        bar.set_postfix(loss=f"{value:.3f}")
    bar.close()


def _check_finite_parameters(model: nn.Module) -> None:
    """A ValueError naming the backbone's NaN or infinite parameters and buffers, if it has any."""
    bad = non_finite(dict(model.state_dict()))
    if bad:
        raise ValueError(
            f"backbone holds NaN or infinite values in {listed(bad)}: its outputs are not finite, so it cannot be "
            "adapted (nor explained); load the weights again"
        )


def _non_finite_loss(
    value: float, step: int, lr: float, adapted: nn.Module, teacher: BackboneAdapter, inputs: FeatureInputs
) -> str:
    """Why the loss of ``step`` is ``value``: the original's output on the batch, the copy's parameters, or
    (both finite) the learning rate."""
    with torch.no_grad():
        logits = teacher.full_forward(inputs)[0]
    if not bool(torch.isfinite(logits).all()):
        data = non_finite({"pixels": inputs.pixels})
        where = f"the batch holds NaN or infinite values in {listed(data)}" if data else "its parameters are finite"
        return (
            f"adapt_backbone: the original backbone's output on the batch of step {step} is not finite (NaN or "
            f"Inf; {where}); check the data and the backbone, the learning rate is not the cause"
        )
    bad = non_finite(dict(adapted.named_parameters()))
    if bad:
        return (
            f"adapt_backbone: the copy's parameters became NaN or infinite by step {step} (first: {bad[0]}; lr "
            f"{lr:g}); lower lr"
        )
    return f"adapt_backbone: the loss became {value} at step {step} (lr {lr:g}); lower lr"


def _loss(
    student: BackboneAdapter,
    teacher: BackboneAdapter,
    inputs: FeatureInputs,
    labels: torch.Tensor | None,
    weights: tuple[float, float],
    generator: torch.Generator,
    task: str = "classification",
) -> torch.Tensor:
    """Cross-entropy with ``labels`` and KL to the teacher (``weights``; regression: the MSE to both) over
    the batch cut in parts: one per supported mode with random groups, one whole."""
    modes = list(student.supported_modes)
    parts = torch.arange(inputs.batch_size).tensor_split(len(modes) + 1)
    device = inputs.device
    logits = [student.full_forward(inputs.rows(parts[-1].to(device)))[0]]
    for mode, rows in zip(modes, parts):
        if len(rows) == 0:
            continue
        part = inputs.rows(rows.to(device))
        masks = _training_masks(student, part, mode, generator).to(device)
        logits.insert(len(logits) - 1, student.run_groups(part, Groups.from_masks(masks), mode, len(rows)).logits[:, 0])
    order = torch.cat([rows for rows in parts[:-1] if len(rows)] + [parts[-1]]).to(device)
    predicted = torch.cat(logits).float()
    label_weight, teacher_weight = weights
    loss = predicted.new_zeros(())
    if task == "regression":
        if label_weight > 0 and labels is not None:
            loss = loss + label_weight * F.mse_loss(predicted, labels.float()[order])
        if teacher_weight > 0:
            with torch.no_grad():
                target = teacher.full_forward(inputs)[0].float()[order]
            loss = loss + teacher_weight * F.mse_loss(predicted, target)
        return loss
    if label_weight > 0 and labels is not None:
        loss = loss + label_weight * F.cross_entropy(predicted, labels.long()[order])
    if teacher_weight > 0:
        with torch.no_grad():
            target = teacher.full_forward(inputs)[0].float().log_softmax(-1)[order]
        kl = F.kl_div(predicted.log_softmax(-1), target, log_target=True, reduction="batchmean")
        loss = loss + teacher_weight * kl
    return loss


def _training_masks(
    adapter: BackboneAdapter, inputs: FeatureInputs, mode: str, generator: torch.Generator
) -> torch.Tensor:
    """``[B, 1, d]`` random groups, each keeping a ``U(KEEP_RANGE)`` share (at least one) of its example's
    candidates; one share for the whole part where ``mode`` needs groups of one size (a ViT's ``drop``)."""
    low, high = KEEP_RANGE
    candidates = adapter.candidate_mask(inputs).cpu()
    size = 1 if mode in adapter.equal_size_modes else candidates.shape[0]
    keep = torch.rand(size, generator=generator) * (high - low) + low
    k = (keep * candidates.sum(dim=1)).floor().clamp_min(1).long()
    return random_groups(candidates, k, 1, generator)


def save_adapted(
    model: nn.Module,
    provenance: dict[str, Any],
    output_dir: str | os.PathLike,
    source: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
) -> str:
    """Save an adapted backbone where sopfast loads backbones from, with ``sopfast_adaptation.json``,
    all-or-nothing (:func:`~sopfast.model.state_files.write_model_folder`): a folder that holds a model only
    with ``overwrite=True``, the original's own folder (``source``, ``model.name_or_path``) never.

    A Hugging Face model: ``save_pretrained`` plus the original directory's preprocessing and tokenizer
    files (``--backbone OUTPUT_DIR``); a timm / torchvision model: ``model.safetensors`` (``--backbone
    <the same timm:/torchvision: name> --backbone-weights OUTPUT_DIR/model.safetensors``); another module:
    ``backbone.pt``, a pickled module (``--backbone OUTPUT_DIR/backbone.pt --trust-pickle``).
    """
    if not isinstance(provenance, dict):
        raise TypeError(f"provenance must be a dict, got {provenance!r} ({type(provenance).__name__})")
    check_path("output_dir", output_dir, directory=True)
    check_bool("overwrite", overwrite)
    out = os.path.abspath(output_dir)
    kind = (source or {}).get("kind") or ("hf" if hasattr(model, "save_pretrained") else "module")
    record = dict(provenance)
    if kind == "hf":
        record["load"] = {"backbone": out}
    elif kind in ("timm", "torchvision"):
        record["load"] = {
            "backbone": (source or {}).get("spec"),
            "backbone_weights": os.path.join(out, "model.safetensors"),
            "options": (source or {}).get("options") or {},
        }
    else:
        record["load"] = {"backbone": os.path.join(out, "backbone.pt"), "trust_pickle": True}

    def write(folder: Path) -> None:
        if kind == "hf":
            cast(Any, model).save_pretrained(folder)
            _copy_preprocessing((source or {}).get("spec") or getattr(model, "name_or_path", None), folder)
        elif kind in ("timm", "torchvision"):
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
        else:
            torch.save(model, folder / "backbone.pt")
        (folder / PROVENANCE_NAME).write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")

    write_model_folder(output_dir, write, overwrite=overwrite, inputs=source_folders(source, model))
    return os.fspath(output_dir)


def _copy_preprocessing(origin: Any, out: Path) -> None:
    """The processor and tokenizer files of a Hugging Face directory ``origin``, copied to ``out``."""
    if not isinstance(origin, str) or not os.path.isdir(origin):
        return
    for name in os.listdir(origin):
        if name == "preprocessor_config.json" or name.startswith(MODEL_PREFIXES):
            shutil.copy2(os.path.join(origin, name), out / name)


def _batches(data: Any, batch_size: int, seed: int) -> Iterable[Any]:
    """A Dataset in shuffled batches (seeded), a DataLoader or another iterable of batches as it is."""
    if isinstance(data, Dataset) and not isinstance(data, DataLoader):
        generator = torch.Generator().manual_seed(seed)
        drop_last = len(cast(Sized, data)) > batch_size
        return DataLoader(data, batch_size=batch_size, shuffle=True, generator=generator, drop_last=drop_last)
    if not isinstance(data, Iterable):
        raise TypeError(
            f"train_data must be a Dataset, a DataLoader or an iterable of batches, got {type(data).__name__}"
        )
    return data


def _cycle(loader: Iterable[Any]) -> Iterator[Any]:
    while True:
        yield from loader


__all__ = ["AdaptResult", "adapt_backbone", "save_adapted"]
