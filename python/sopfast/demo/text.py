"""The text demo: a frozen MiniLM classifier (:func:`_text_backbone`) on tweets of every length
(:func:`text_splits`) and :func:`text_study` on it: SOP trained with several seeds and compared with every
baseline, on all compared texts and on the long ones."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data import builtin as data
from ..data.datasets import TextDataset
from ..explain import write_explanations
from ..model.sop import SOP
from .phases import Phases
from .shared import (
    CURVE_METRICS,
    batch_labels,
    parsed_batches,
    record_accuracy,
    save_demo_backbone,
    sop_accuracy,
    train_sop,
)

# Test texts the comparison covers (every baseline runs on each; the text baselines are slow per input).
COMPARE_TEXTS = 500
#: The text comparison also reports the texts of at least this many tokens ([CLS] and [SEP] included).
LONG_TEXT = 12
#: Text metrics on every compared text (fidelity, insertion and deletion on the first CURVE_TEXTS).
TEXT_METRICS = ("accuracy", "agreement", "bounds", "diversity", "curves")
CURVE_TEXTS = 200
#: The paper's curves on text: group counts m at each inference τ.
TEXT_CURVE_COUNTS = (1, 3, 8)
#: SOP's training tweets and epochs in the full text demo (batch 16).
TEXT_SOP_TEXTS = 3000
TEXT_EPOCHS = 2


@dataclass(frozen=True)
class TextScale:
    """How much of the text study one run does: the test texts compared (fidelity, insertion and deletion
    on the first ``curve``), SOP's training texts and epochs, the baselines and the default number of seeds."""

    compare: int
    curve: int
    sop_texts: int
    epochs: int
    baselines: str | tuple[str, ...]
    seeds: int


TEXT_SCALES = {
    # ``sopfast demo --task text``: one seed, one epoch, random groups and two -F baselines
    # (2,400 training tweets and 40 curve texts: ≤ 15 min on 2 CPU cores, bench/quality/demo_cost.md)
    "default": TextScale(200, 40, 2400, 1, ("random", "ig-f", "occlusion-f"), 1),
    # ``--full``: the committed study (bench/quality/demo_text.md), every baseline
    "full": TextScale(COMPARE_TEXTS, CURVE_TEXTS, TEXT_SOP_TEXTS, TEXT_EPOCHS, "all", 2),
    # ``--quick``: the full study's every path on small data (CI)
    "quick": TextScale(24, 8, 96, 1, "all", 2),
}


def _text_backbone(texts: TextDataset, device: torch.device, quick: bool, seed: int):
    """MiniLM (frozen) with a pooler + classifier head trained on its features."""
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    # An HF BERT classifier, read by attribute name (``bert.pooler``, ``classifier``).
    model: Any = BertForSequenceClassification.from_pretrained(data.minilm_path(), num_labels=2, local_files_only=True)
    model.to(device).eval()
    head = list(model.bert.pooler.parameters()) + list(model.classifier.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    for p in head:
        p.requires_grad_(True)
    with torch.no_grad():
        enc = texts.encoded
        hidden = torch.cat(
            [
                model.bert(**{k: v[s : s + 256].to(device) for k, v in enc.items()}).last_hidden_state
                for s in range(0, len(texts), 256)
            ]
        )
    opt = torch.optim.AdamW(head, lr=3e-3)
    labels = texts.require_labels().to(device)
    for _ in range(60 if quick else 200):
        logits = model.classifier(model.bert.pooler(hidden))
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def _backbone_text_accuracy(model: Any, dataset: TextDataset, device: torch.device) -> float:
    """Accuracy of the plain HF classifier ``model`` (read by attribute name) on ``dataset``."""
    correct = 0
    with torch.no_grad():
        for batch in parsed_batches(dataset, device):
            text = {k: v for k, v in batch.model_inputs().items() if v is not None}
            logits = model(**text).logits
            correct += int((logits.argmax(-1) == batch_labels(batch)).sum())
    return correct / max(1, len(dataset))


def text_splits(quick: bool, seed: int) -> tuple[TextDataset, TextDataset]:
    """The text demo's tweets of every length (at least one word), ``(train, test)``: 12,000 drawn with
    ``seed`` (quick: 2,500), the last 1,000 (quick: 300) for testing."""
    texts, labels = data.load_tweets(limit=2500 if quick else 12000, seed=seed)
    full = data.tokenize_tweets(texts, labels, min_candidates=3)
    n_test = min(300 if quick else 1000, len(full) // 4)
    idx = torch.arange(len(full))
    return full.subset(idx[:-n_test]), full.subset(idx[-n_test:])


def _text_loaders(dataset: TextDataset, n_curve: int) -> tuple:
    """``(all of dataset, its first n_curve)`` as loaders of 50 texts."""
    return (
        torch.utils.data.DataLoader(dataset, batch_size=50),
        torch.utils.data.DataLoader(dataset.subset(torch.arange(min(n_curve, len(dataset)))), batch_size=50),
    )


def text_parts(compared: TextDataset, n_curve: int) -> dict[str, tuple]:
    """``compared`` split into its texts of at least ``LONG_TEXT`` tokens (``"long"``) and the rest
    (``"short"``), each ``(loader, curve loader)`` (:func:`_text_loaders`); the ``n_curve`` curve texts
    are shared in proportion, at least one per part.  Parts without texts are left out."""
    long = compared.encoded["attention_mask"].sum(dim=1) >= LONG_TEXT
    parts = {}
    for name, members in (("long", long), ("short", ~long)):
        if bool(members.any()):
            share = float(members.float().mean())
            parts[name] = _text_loaders(compared.subset(members), max(1, round(n_curve * share)))
    return parts


def _evaluate_text_seed(
    model: SOP, parts: dict[str, tuple], device: torch.device, first: bool, baselines: str | tuple
) -> dict:
    """SOP and random groups (each seed), the other ``baselines`` (the first seed only) on each part of the
    test texts (``{name: (loader, curve loader)}``): accuracy, curves and groups on the loader, fidelity,
    insertion and deletion on the curve loader; ``{part: results}`` plus ``"all"``, the parts combined."""
    from ..evaluation.evaluate import evaluate
    from ..evaluation.parts import combine_parts

    baselines = baselines if first else ("random",)
    options: dict[str, Any] = {
        "baselines": baselines,
        "device": device,
        "progress": True,
        "curve_counts": TEXT_CURVE_COUNTS,
    }
    found: dict[str, list[dict]] = {"main": [], "curve": []}
    by_part = {}
    for name, (loader, curve_loader) in parts.items():
        main = evaluate(model, loader, metrics=TEXT_METRICS, backbone_row=first, **options)
        curves = evaluate(model, curve_loader, metrics=CURVE_METRICS, backbone_row=False, **options)
        found["main"].append(main)
        found["curve"].append(curves)
        by_part[name] = _joined(main, curves)
    by_part["all"] = _joined(combine_parts(found["main"]), combine_parts(found["curve"]))
    return by_part


def _joined(main: dict, curves: dict) -> dict:
    """``main``'s rows with ``curves``' metrics added (``curve_examples``: how many texts they cover)."""
    for name, row in curves.items():
        main[name].update({k: v for k, v in row.items() if k != "examples"}, curve_examples=row["examples"])
    return main


def run_text_demo(out_dir: str, scale: str, device: torch.device, seed: int, seeds: int | None = None) -> dict:
    """The text demo at ``scale`` (a key of :data:`TEXT_SCALES`); returns the results dict (also written to
    ``<out>/results.json``): the frozen MiniLM classifier (:func:`_text_backbone`) and :func:`text_study` on it."""
    quick, size = scale == "quick", TEXT_SCALES[scale]
    runs = list(range(seed, seed + (seeds or size.seeds)))
    phases = Phases(1 + 2 * len(runs), f"text-{scale}")
    with phases.phase("the backbone: MiniLM (frozen) with a classifier head trained on tweets", "backbone"):
        train_set, test_set = text_splits(quick, seed)
        backbone = _text_backbone(train_set, device, quick, seed)
    results = text_study(backbone, train_set, test_set, out_dir, size, device, runs, phases)
    save_demo_backbone(out_dir, backbone, train_set.tokenizer)
    return results


def text_study(
    backbone: nn.Module,
    train_set: TextDataset,
    test_set: TextDataset,
    out_dir: str,
    scale: TextScale,
    device: torch.device,
    seeds: list[int],
    phases: Phases | None = None,
) -> dict:
    """SOP (the default recipe, 8 groups, τ = 0.2, drop) trained on a text classifier with each of ``seeds``
    and compared with ``scale``'s baselines on its first ``scale.compare`` texts of ``test_set``, all lengths
    (``"comparison"``) and those of at least ``LONG_TEXT`` tokens (``"long"``), each the mean ± spread
    over the seeds; the first seed's model in ``<out>/sop`` and its pages in ``<out>/explanations``.
    ``phases``: where the training and evaluation of each seed are said (default: numbered from 1)."""
    from ..evaluation.plots import plot_curves
    from ..evaluation.seeds import combine_seeds
    from ..masking.diagnose import diagnose
    from ..model.checkpoint import save_pretrained

    phases = phases or Phases(2 * len(seeds), "")
    compared = test_set.subset(torch.arange(min(len(test_set), scale.compare)))
    parts = text_parts(compared, scale.curve)
    share = float(compared.require_labels().float().mean())
    results: dict = {
        "dataset": "tweets",
        "backbone_accuracy": _backbone_text_accuracy(backbone, test_set, device),
        "chance": 0.5,
        "majority": max(share, 1 - share),
        "seeds": seeds,
        "long_text": LONG_TEXT,
    }
    test_batches = parsed_batches(test_set, device)
    sop_train = train_set.subset(torch.arange(min(scale.sop_texts, len(train_set))))
    runs, models = [], []
    for i, run_seed in enumerate(seeds):
        torch.manual_seed(run_seed)
        model = SOP(backbone, num_groups=8, tau=0.2, mode="drop").to(device)
        if i == 0:
            results.update(recipe=model.config["recipe"], mode=model.mode)
            results["diagnosis"] = diagnose(model, train_set, device=device, own_groups=False).to_dict()
            results["untrained_accuracy"] = sop_accuracy(model, test_batches, "drop")[0]
        run_dir = os.path.join(out_dir, f"sop-run-seed{run_seed}")
        with phases.phase(f"training SOP (seed {run_seed}: {scale.epochs} epoch(s) of {len(sop_train)} tweets)", "sop"):
            seconds = train_sop(model, sop_train, run_dir, device, run_seed, scale.epochs, batch_size=16)
        results.setdefault("sop_train_seconds", []).append(seconds)
        start = time.perf_counter()
        with phases.phase(f"evaluating SOP against {scale.baselines} (seed {run_seed})", "evaluate"):
            runs.append(_evaluate_text_seed(model, parts, device, i == 0, scale.baselines))
        results.setdefault("evaluation_seconds", []).append(time.perf_counter() - start)
        models.append(model)
    model = models[0]
    record_accuracy(results, model, test_batches)
    results["per_seed"] = runs
    results["comparison"], results["spread"] = combine_seeds([r["all"] for r in runs])
    if "long" in parts:
        comparison, spread = combine_seeds([r["long"] for r in runs])
        results["long"] = {"comparison": comparison, "spread": spread}
    results["curves_png"] = plot_curves(results["comparison"], os.path.join(out_dir, "curves.png"))
    results["metrics"] = results["comparison"]["SOP"]
    save_pretrained(model, os.path.join(out_dir, "sop"))
    results["pictures"] = write_explanations(model, test_set, os.path.join(out_dir, "explanations"), 6, device)
    return results
