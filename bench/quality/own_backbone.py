"""SOP on a backbone trained the ordinary way (issue #28): what the diagnostic says, how the masking
adaptation's settings trade whole-input accuracy for group accuracy, and how long SOP must train.

Three parts, each printed and written to ``bench/quality/own_backbone.json`` / ``own_backbone.md``:

* ``diagnose``: the demo's small ViT trained normally on 12,000 and on 48,000 Fashion-MNIST images
  (the issue's backbone and the demo's), ``sopfast.diagnose`` on 500 test images at τ 0.1 and 0.2.
* ``adapt``: ``sopfast.adapt_backbone`` of the 48,000-image backbone on SOP's 12,000 training images with
  several learning rates, step counts and teacher weights: whole-input accuracy on 1,000 test images and
  one random group's accuracy in ``drop`` (on 256 held-out training images).
* ``length``: a first user's 600 images (540 train, 60 validation) and the 12,000-image backbone: SOP
  with the default recipe for 1,000 steps, evaluated every 33 steps; the test accuracy of the last and
  of the best model against random groups through the same selector.

    python bench/quality/own_backbone.py [--parts diagnose adapt length]   # about 40 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CACHE, image_data

import sopfast
from sopfast.demo.backbones import accuracy, small_vit, train_backbone
from sopfast.evaluation.evaluate import evaluate

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPT_SETTINGS = (  # (lr, steps, teacher_weight, label_weight)
    (2e-4, 200, 1.0, 1.0),
    (2e-4, 600, 1.0, 1.0),
    (5e-4, 400, 1.0, 1.0),
    (5e-4, 400, 1.0, 0.0),
    (5e-4, 400, 3.0, 1.0),
    (1e-3, 400, 1.0, 1.0),
)


def ordinary_backbone(n: int):
    """The demo's small ViT trained normally (4 epochs, no masking) on the first ``n`` training images,
    cached in ``.cache/fmnist-vit-plain-<n>``."""
    from transformers import ViTForImageClassification

    path = os.path.join(CACHE, f"fmnist-vit-plain-{n}")
    if not os.path.exists(os.path.join(path, "config.json")):
        train, _ = image_data()
        torch.manual_seed(0)
        model = small_vit(28, 4, 1, 10)
        train_backbone(model, train.x[:n], train.y[:n], epochs=4, seed=0, progress=False)
        model.save_pretrained(path)
    return ViTForImageClassification.from_pretrained(path).eval()


def part_diagnose() -> list[dict]:
    _, test = image_data()
    data = torch.utils.data.TensorDataset(test.x[:500], test.y[:500])
    rows = []
    for n in (12000, 48000):
        backbone = ordinary_backbone(n)
        for tau in (0.1, 0.2):
            report = sopfast.diagnose(backbone, data, tau=tau, examples=500, informed_examples=200, progress=False)
            rows.append({"backbone_images": n, "tau": tau, **report.to_dict()})
            print(f"\n{n} images, tau {tau}:\n{report}", flush=True)
    return rows


def part_adapt() -> list[dict]:
    train, test = image_data()
    data = torch.utils.data.TensorDataset(train.x[-12000:], train.y[-12000:])
    check = torch.utils.data.TensorDataset(train.x[-12000:][:256], train.y[-12000:][:256])
    backbone = ordinary_backbone(48000)
    rows = [{"setting": "original", "whole_accuracy": accuracy(backbone, test.x, test.y)}]
    for lr, steps, teacher, labels in ADAPT_SETTINGS:
        start = time.perf_counter()
        result = sopfast.adapt_backbone(
            backbone, data, check, steps=steps, lr=lr, teacher_weight=teacher, label_weight=labels, progress=False
        )
        rows.append(
            {
                "setting": f"lr {lr:g}, {steps} steps, teacher {teacher:g}, labels {labels:g}",
                "whole_accuracy": accuracy(result.backbone, test.x, test.y),
                "one_group_drop_before": result.before.random_groups["drop"].one_group,
                "one_group_drop_after": result.after.random_groups["drop"].one_group,
                "one_group_exact_after": result.after.random_groups["exact"].one_group,
                "seconds": time.perf_counter() - start,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def part_length(steps: int = 1000) -> dict:
    train, test = image_data()
    picked = torch.randperm(len(train.x), generator=torch.Generator().manual_seed(1))[:600]
    x, y = train.x[picked], train.y[picked]
    fit = torch.utils.data.TensorDataset(x[60:], y[60:])
    val = torch.utils.data.TensorDataset(x[:60], y[:60])
    backbone = ordinary_backbone(12000)
    torch.manual_seed(0)
    model = sopfast.SOP(backbone, num_groups=20, tau=0.2, mode="drop")
    out = os.path.join(CACHE, "own-backbone-length")
    start = time.perf_counter()
    epochs = -(-steps // -(-len(fit) // 32))
    sopfast.train(
        model, fit, val, epochs=epochs, batch_size=32, eval_every=33, output_dir=out, resume=False, progress=False
    )
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    curve = [(r["step"], r["val_accuracy"]) for r in records if r["event"] == "eval"]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(test.x, test.y), batch_size=100)
    result: dict = {"steps": steps, "seconds": seconds, "validation_curve": curve}
    best = sopfast.SOP.from_pretrained(os.path.join(out, "best"), backbone)
    for name, trained in (("last", model), ("best", best)):
        scores = evaluate(trained, loader, metrics=["accuracy", "diversity"], baselines=["random"], progress=False)
        result[name] = {k: v["accuracy"] for k, v in scores.items()}
    print(json.dumps(result), flush=True)
    return result


def write(results: dict) -> None:
    with open(os.path.join(HERE, "own_backbone.json"), "w") as f:
        json.dump(results, f, indent=2)
    lines = [
        "# SOP on a backbone trained the ordinary way",
        "",
        f"`{' '.join(['python bench/quality/own_backbone.py', *sys.argv[1:]])}` — "
        f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; {time.strftime('%Y-%m-%d')}.",
    ]
    if "diagnose" in results:
        lines += [
            "",
            "## The diagnostic (500 test images; informed group on 200)",
            "",
            "| backbone | τ | whole | one group exact | one group drop | 20 averaged drop | informed drop |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in results["diagnose"]:
            g = r["random_groups"]
            lines.append(
                f"| trained on {r['backbone_images']:,} | {r['tau']} | {r['full_accuracy']:.3f} | "
                f"{g['exact']['one_group']:.3f} | {g['drop']['one_group']:.3f} | {g['drop']['mean_of_groups']:.3f} | "
                f"{r['informed_group']:.3f} |"
            )
    if "adapt" in results:
        lines += [
            "",
            "## Adaptation settings (the 48,000-image backbone; SOP's 12,000 images, batch 64)",
            "",
            "| setting | whole (1,000 test) | one group drop, after (before) | one group exact, after | seconds |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in results["adapt"]:
            if r["setting"] == "original":
                lines.append(f"| original | {r['whole_accuracy']:.3f} | | | |")
                continue
            lines.append(
                f"| {r['setting']} | {r['whole_accuracy']:.3f} | {r['one_group_drop_after']:.3f} "
                f"({r['one_group_drop_before']:.3f}) | {r['one_group_exact_after']:.3f} | {r['seconds']:.0f} |"
            )
    if "length" in results:
        r = results["length"]
        curve = ", ".join(f"{s}: {a:.2f}" for s, a in r["validation_curve"])
        lines += [
            "",
            "## Training length on a first user's 600 images (12,000-image backbone)",
            "",
            f"Validation accuracy (60 images) by step: {curve}.",
            "",
            f"Test accuracy (1,000 images): last SOP {r['last']['SOP']:.3f}, random groups {r['last']['Random']:.3f}; "
            f"best-on-validation SOP {r['best']['SOP']:.3f}, random groups {r['best']['Random']:.3f}; "
            f"{r['steps']} steps in {r['seconds']:.0f} s.",
        ]
    with open(os.path.join(HERE, "own_backbone.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", nargs="+", choices=("diagnose", "adapt", "length"), default=["diagnose", "adapt", "length"]
    )
    args = parser.parse_args()
    parts = {"diagnose": part_diagnose, "adapt": part_adapt, "length": part_length}
    results = {name: parts[name]() for name in args.parts}
    write(results)


if __name__ == "__main__":
    main()
