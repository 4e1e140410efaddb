"""``sopfast demo --task cosmology``: the paper's third domain end to end, on simulated weak-lensing maps.

1. **Maps**: :mod:`sopfast.data.weak_lensing`, a lognormal simulation of 66×66 convergence maps over
   (Ω_m, σ_8) — not CosmoGrid.  Held-out maps are those of ``--data weak-lensing``'s test split.
2. **Backbone**: :class:`~sopfast.demo.lensing_cnn.LensingCNN`, trained the ordinary way (whole maps,
   MSE); its MSE and R² per parameter on held-out maps, and the diagnostic (``sopfast.diagnose``, MSE on
   random groups).
3. **SOP** on it: m = 20 groups of τ = 0.2 of the 11×11 patches (``feature_layer="block2"``), the paper's
   scaled MSE (``task="regression"``), trained with each seed; against random groups and the -F baselines
   (one group of the attribution's top features per output): MSE, purity at the paper's thresholds and
   their ablation, MSE over the inference τ (the paper's curves).
4. **The adapted copy**: ``sopfast.adapt_backbone`` fine-tunes a copy of the CNN under random patch
   masking (the opt-in step that makes a backbone predict from groups), and step 3 runs again on it.
5. **RQ7**: per study, the selector weights of the void and cluster groups for Ω_m vs σ_8 (the paper's box
   plots) and the share of each kind that carries a whole prediction; pictures of maps with their voids,
   clusters and groups.

Everything is written under ``<out>``: ``results.json``, the pictures, the backbones and the first seed's
SOP models.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data.weak_lensing import PARAMETERS, LensingMaps, Simulator
from ..evaluation import metrics as M
from ..evaluation.baselines import available_baselines
from ..model.sop import SOP
from ..model.state_files import atomic_save
from .lensing_cnn import FEATURE_LAYER, LensingCNN, predict, r_squared, train_regressor
from .shared import train_sop

#: Maps of each part (seed 0: the backbone's, then SOP's; the test maps are the built-in test split, seed 1).
BACKBONE_MAPS, SOP_MAPS, TEST_MAPS, CHECK_MAPS = 8192, 2048, 400, 256
BACKBONE_EPOCHS, SOP_EPOCHS, ADAPT_STEPS = 8, 3, 600
QUICK = {"backbone": 512, "sop": 96, "test": 16, "check": 32, "backbone_epochs": 2, "sop_epochs": 1, "adapt": 16}
NUM_GROUPS, TAU = 20, 0.2
METRICS = ("mse", "purity", "curves")
CURVE_TAUS, CURVE_COUNTS = (0.05, 0.1, 0.2, 0.4), (1, 5, 20)
#: The baselines beside SOP: random groups through SOP's selector, and every available -F conversion
#: (``--quick``: the two without Captum).
BASELINES = ("random", "gxi-f", "gradcam-f", "ig-f", "occlusion-f", "lime-f", "kernelshap-f", "rise-f")
QUICK_BASELINES = BASELINES[:3]
QUICK_CURVES = ((0.1, 0.2), (1, 20))
#: The paper's purity thresholds (appendix, "Threshold-based Purity").
TAU_V, TAU_C = 0.6, 0.015
#: A group "carries a prediction" when its (merged) selector weight is at least this.
WHOLE = 0.999
PICTURE_MAPS = 4


@dataclass
class CosmologyRun:
    """The maps and settings both SOP studies share."""

    sop_train: LensingMaps
    check: LensingMaps
    test: LensingMaps
    epochs: int
    seeds: list[int]
    out_dir: str
    device: torch.device
    baselines: tuple[str, ...] = BASELINES
    curves: tuple[tuple[float, ...], tuple[int, ...]] = (CURVE_TAUS, CURVE_COUNTS)


def _sizes(quick: bool) -> dict[str, int]:
    if quick:
        return QUICK
    return {
        "backbone": BACKBONE_MAPS,
        "sop": SOP_MAPS,
        "test": TEST_MAPS,
        "check": CHECK_MAPS,
        "backbone_epochs": BACKBONE_EPOCHS,
        "sop_epochs": SOP_EPOCHS,
        "adapt": ADAPT_STEPS,
    }


def backbone_scores(model: nn.Module, maps: LensingMaps) -> dict[str, Any]:
    """A regressor's MSE (scaled targets) and R² per parameter on ``maps``."""
    prediction = predict(model, maps.x)
    r2 = r_squared(prediction.cpu(), maps.targets)
    return {
        "mse": float((prediction.cpu() - maps.targets).pow(2).mean()),
        "r2": {name: float(r2[i]) for i, name in enumerate(PARAMETERS)},
    }


def run_cosmology_demo(out_dir: str, quick: bool, device: torch.device, seed: int, seeds: int = 2) -> dict:
    """The cosmology demo (module docstring); returns the results dict (``run_demo`` writes it)."""
    from ..masking.adapt import PROVENANCE_NAME, adapt_backbone

    sizes = _sizes(quick)
    simulator = Simulator()
    start = time.perf_counter()
    backbone_maps = simulator.simulate(sizes["backbone"], seed=0)
    sop_maps = simulator.simulate(sizes["sop"], seed=0, start=sizes["backbone"])
    test = simulator.simulate(sizes["test"], seed=1)
    results: dict[str, Any] = {
        "task": "cosmology",
        "dataset": "weak-lensing (simulated, sopfast.data.weak_lensing)",
        "simulator": {k: getattr(simulator, k) for k in Simulator.__dataclass_fields__},
        "maps": {"backbone": len(backbone_maps), "sop": len(sop_maps), "test": len(test)},
        "simulation_seconds": time.perf_counter() - start,
        "seeds": list(range(seed, seed + seeds)),
    }
    torch.manual_seed(seed)
    backbone = LensingCNN().to(device)
    start = time.perf_counter()
    train_regressor(
        backbone, backbone_maps.x.to(device), backbone_maps.targets.to(device), sizes["backbone_epochs"], seed=seed
    )
    results["backbone_seconds"] = time.perf_counter() - start
    results["backbone_epochs"] = sizes["backbone_epochs"]
    run = CosmologyRun(
        sop_train=sop_maps,
        check=sop_maps.select(slice(0, sizes["check"])),
        test=test,
        epochs=sizes["sop_epochs"],
        seeds=results["seeds"],
        out_dir=out_dir,
        device=device,
        baselines=QUICK_BASELINES if quick else BASELINES,
        curves=QUICK_CURVES if quick else (CURVE_TAUS, CURVE_COUNTS),
    )
    results["ordinary"] = _sop_study(backbone, run, "")
    start = time.perf_counter()
    adaptation = adapt_backbone(
        backbone,
        sop_maps.dataset(),
        run.check.dataset(),
        steps=sizes["adapt"],
        device=device,
        seed=seed,
        task="regression",
        feature_layer=FEATURE_LAYER,
        output_dir=os.path.join(out_dir, "backbone-adapted"),
        overwrite=os.path.isfile(os.path.join(out_dir, "backbone-adapted", PROVENANCE_NAME)),  # an earlier demo's
        lr=1e-3,
    )
    results["adaptation"] = {
        "seconds": time.perf_counter() - start,
        "settings": adaptation.provenance["settings"],
        "before": adaptation.before.to_dict(),
        "after": adaptation.after.to_dict(),
    }
    results["adapted"] = _sop_study(adaptation.backbone, run, "-adapted")
    atomic_save(backbone, os.path.join(out_dir, "backbone.pt"))
    return results


def _sop_model(backbone: nn.Module, device: torch.device) -> SOP:
    return SOP(backbone, num_groups=NUM_GROUPS, tau=TAU, task="regression", feature_layer=FEATURE_LAYER).to(device)


def _sop_study(backbone: nn.Module, run: CosmologyRun, suffix: str) -> dict:
    """One backbone's study: its scores and diagnostic, SOP trained with every seed and compared with the
    baselines (the -F ones once: they do not depend on SOP), RQ7 per seed, pictures of the first seed."""
    from ..evaluation.evaluate import evaluate
    from ..evaluation.plots import plot_curves
    from ..evaluation.seeds import combine_seeds
    from ..masking.diagnose import diagnose
    from ..model.checkpoint import save_pretrained

    device, out_dir = run.device, run.out_dir
    study: dict[str, Any] = {"backbone": backbone_scores(backbone, run.test)}
    loader = torch.utils.data.DataLoader(run.test.dataset(), batch_size=50)
    runs, rq7 = [], []
    for i, run_seed in enumerate(run.seeds):
        torch.manual_seed(run_seed)
        model = _sop_model(backbone, device)
        if i == 0:
            study.update(recipe=model.config["recipe"], mode=model.mode)
            study["diagnosis"] = diagnose(model, run.check.dataset(), device=device, examples=len(run.check)).to_dict()
        seconds = train_sop(
            model,
            run.sop_train.dataset(),
            os.path.join(out_dir, f"sop{suffix}-run-seed{run_seed}"),
            device,
            run_seed,
            run.epochs,
        )
        study.setdefault("sop_train_seconds", []).append(seconds)
        start = time.perf_counter()
        baselines = [b for b in run.baselines if b in available_baselines()] if i == 0 else ["random"]
        runs.append(
            evaluate(
                model,
                loader,
                metrics=METRICS,
                baselines=baselines,
                device=device,
                progress=True,
                curve_taus=run.curves[0],
                curve_counts=run.curves[1],
                tau_v=TAU_V,
                tau_c=TAU_C,
                backbone_row=i == 0,
            )
        )
        study.setdefault("evaluation_seconds", []).append(time.perf_counter() - start)
        rq7.append(structures(model, run.test.x.to(device)))
        if i == 0:
            study["sop_scores"] = sop_scores(model, run.test, device)
            save_pretrained(model, os.path.join(out_dir, f"sop{suffix}"))
            study["pictures"] = [
                plot_maps(model, run.test.x[:PICTURE_MAPS].to(device), os.path.join(out_dir, f"maps{suffix}.png")),
            ]
    study["per_seed"] = runs
    study["comparison"], study["spread"] = combine_seeds(runs)
    study["rq7_per_seed"] = [r["summary"] for r in rq7]
    study["rq7"] = rq7[0]["summary"]
    study["pictures"].append(plot_weights(rq7[0]["weights"], os.path.join(out_dir, f"weights{suffix}.png")))
    study["curves_png"] = plot_curves(study["comparison"], os.path.join(out_dir, f"curves{suffix}.png"), metric="mse")
    return study


@torch.no_grad()
def sop_scores(model: SOP, maps: LensingMaps, device: torch.device, batch_size: int = 50) -> dict[str, Any]:
    """SOP's MSE and R² per parameter on ``maps`` (its own prediction, exact mode)."""
    model.eval()
    out = torch.cat(
        [model(maps.x[i : i + batch_size].to(device)).logits.float().cpu() for i in range(0, len(maps), batch_size)]
    )
    r2 = r_squared(out, maps.targets)
    return {"mse": float((out - maps.targets).pow(2).mean()), "r2": {n: float(r2[i]) for i, n in enumerate(PARAMETERS)}}


@dataclass
class Structures:
    """SOP's groups on maps ``[B, 1, H, W]`` as the paper's purity reads them: ``pixels [B, m, H, W]`` the
    groups at pixel resolution, their void and cluster alignment ``[B, m]``
    (:func:`sopfast.metrics.cosmogrid_alignment`) and ``weights [B, C, m]``, the selector weights merged over
    identical groups (:func:`sopfast.metrics.merged_group_weights`)."""

    pixels: torch.Tensor
    void: torch.Tensor
    cluster: torch.Tensor
    weights: torch.Tensor


@torch.no_grad()
def group_structures(model: SOP, x: torch.Tensor) -> Structures:
    """:class:`Structures` of ``model``'s prediction on maps ``x`` (eval mode)."""
    from ..adapters.images import upsample_mask
    from ..model.pictures import image_grid

    model.eval()
    out = model(x)
    b, m, _ = out.group_masks.shape
    h, w = int(x.shape[-2]), int(x.shape[-1])
    pixels = upsample_mask(out.group_masks.reshape(b * m, *image_grid(model, x)), (h, w)).reshape(b, m, h, w)
    void, cluster = M.cosmogrid_alignment(pixels.flatten(2), x.float().mean(dim=1).flatten(1))
    return Structures(pixels, void, cluster, M.merged_group_weights(out.group_masks, out.group_scores))


def structures(model: SOP, x: torch.Tensor, batch_size: int = 50) -> dict[str, Any]:
    """RQ7 on maps ``x``: every used group's merged selector weight per parameter, kept for voids and for
    clusters (:func:`sopfast.metrics.structure_weights`), and their summary (:func:`summarize_weights`)."""
    weights: dict[str, list[list[torch.Tensor]]] = {
        "void": [[] for _ in PARAMETERS],
        "cluster": [[] for _ in PARAMETERS],
    }
    used = [0 for _ in PARAMETERS]
    for i in range(0, len(x), batch_size):
        found = group_structures(model, x[i : i + batch_size])
        kinds = M.structure_weights(found.void, found.cluster, found.weights, TAU_V, TAU_C)
        for kind, per_output in kinds.items():
            for c, w in enumerate(per_output):
                weights[kind][c].append(w.cpu())
        for c in range(len(PARAMETERS)):
            used[c] += int((found.weights[:, c] > 0).sum())
    joined = {kind: [torch.cat(parts) for parts in per_output] for kind, per_output in weights.items()}
    return {"weights": joined, "summary": summarize_weights(joined, used)}


def summarize_weights(weights: dict[str, list[torch.Tensor]], used: list[int]) -> dict[str, Any]:
    """Per kind and parameter: how many used groups are of the kind (and their share of all used groups),
    their mean and quartile weights, and the share that carries the whole prediction (weight ≥ :data:`WHOLE`)."""
    out: dict[str, Any] = {}
    for kind, per_output in weights.items():
        for c, w in enumerate(per_output):
            key = f"{kind}/{PARAMETERS[c]}"
            if len(w) == 0:
                out[key] = {"groups": 0, "share_of_used": 0.0}
                continue
            q = torch.quantile(w.float(), torch.tensor([0.25, 0.5, 0.75]))
            out[key] = {
                "groups": len(w),
                "share_of_used": len(w) / max(1, used[c]),
                "mean": float(w.mean()),
                "quartiles": [float(v) for v in q],
                "whole": float((w >= WHOLE).float().mean()),
            }
    return out


def plot_maps(model: SOP, x: torch.Tensor, path: str) -> str:
    """A PNG: per map, the map with the outline of κ = 0 (void pixels lie below it) and its cluster pixels
    (> 3σ, dots), and for Ω_m and for σ_8 the group with the largest weight, labelled void / cluster by the
    paper's thresholds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = group_structures(model, x)
    maps = x.float().mean(dim=1)
    b = len(x)
    fig, axes = plt.subplots(b, 3, figsize=(9, 3 * b), squeeze=False)
    for i in range(b):
        kappa = maps[i].cpu().numpy()
        sigma = float(maps[i].std())
        ax = axes[i][0]
        ax.imshow(kappa, cmap="magma")
        ax.contour(kappa, levels=[0.0], colors="white", linewidths=0.6)
        ys, xs = (maps[i] > 3 * sigma).nonzero(as_tuple=True)
        ax.scatter(xs.cpu(), ys.cpu(), s=4, c="cyan")
        ax.set_title(f"map {i}: κ = 0 outlined (voids below), clusters (>3σ) dots", fontsize=7)
        for c, name in enumerate(PARAMETERS):
            g = int(found.weights[i, c].argmax())
            void, cluster = float(found.void[i, g]), float(found.cluster[i, g])
            kind = [k for k, v in (("void", void > TAU_V), ("cluster", cluster > TAU_C)) if v]
            ax = axes[i][c + 1]
            ax.imshow(kappa, cmap="gray")
            ax.imshow(found.pixels[i, g].cpu().numpy(), cmap="Blues", alpha=0.45)
            ax.set_title(
                f"{name}: weight {float(found.weights[i, c, g]):.2f}, {' + '.join(kind) or 'neither'}\n"
                f"(void {void:.2f}, cluster {cluster:.3f})",
                fontsize=7,
            )
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_weights(weights: dict[str, list[torch.Tensor]], path: str) -> str:
    """The paper's RQ7 figure: (a) box plots of the void and cluster groups' weights for each parameter,
    (b) the distribution of the weights of void vs cluster groups (both parameters)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    boxes, labels = [], []
    for kind in ("void", "cluster"):
        for c, name in enumerate(PARAMETERS):
            boxes.append(weights[kind][c].numpy())
            labels.append(f"{kind}\n{name}")
    left.boxplot([b if len(b) else [float("nan")] for b in boxes], tick_labels=labels)
    left.set_ylabel("selector weight of the group")
    left.set_title("(a) weights of void and cluster groups", fontsize=9)
    bins = torch.linspace(0, 1, 21).numpy()
    for kind, colour in (("void", "#1f77b4"), ("cluster", "#d62728")):
        values = torch.cat(weights[kind]).numpy()
        if len(values):
            right.hist(values, bins=bins, density=True, alpha=0.5, color=colour, label=f"{kind} ({len(values)})")
    right.set_xlabel("selector weight (1: the group carries the prediction)")
    right.set_title("(b) voids vs clusters", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
