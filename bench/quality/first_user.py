"""A user's first ``sopfast train`` on their own backbone (issues #20, #28, #41): an image folder of 600
Fashion-MNIST PNGs (``data/train/<class>/``, ``data/test/<class>/``), the demo's small ViT trained the
ordinary way (no masking; its config names the classes), **default flags** — then ``sopfast evaluate``
on the 1,000 PNGs of the test split, against random groups through the same selector.  With
``--adapt`` the same user first runs ``sopfast adapt`` on the same folder and trains on the copy.

    python bench/quality/first_user.py --out /tmp/first-user [--adapt]

Writes ``bench/quality/first_user.json`` (``first_user_adapted.json`` with ``--adapt``; ``_seed<N>`` added
with ``--seed N``, the training seed, and ``_threads1`` with one torch thread) and prints a
Markdown table: the backbone's accuracy, the diagnostic the run printed (one random group, the bar of
groups that are not learned), the trained SOP's accuracy and distinct groups of 20 (and, from a second
``sopfast evaluate --no-demote-blank``, its accuracy and agreement with blank patches ranked like any other
at inference), random groups',
the steps, why training stopped and the wall time.  Everything runs through the CLI, as a user would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_backbone, image_data

HERE = os.path.dirname(os.path.abspath(__file__))


def class_names(classes: list[str]) -> list[str]:
    """Folder-safe class names ("T-shirt/top" → "T-shirt or top")."""
    return [name.replace("/", " or ") for name in classes]


def write_folder(x: torch.Tensor, y: torch.Tensor, classes: list[str], root: str) -> None:
    """Images ``[N, 1, 28, 28]`` in [-1, 1] as 8-bit grayscale PNGs under ``root/<class>/``."""
    for i, (image, label) in enumerate(zip(x, y)):
        folder = os.path.join(root, class_names(classes)[int(label)])
        os.makedirs(folder, exist_ok=True)
        pixels = ((image[0] + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
        Image.fromarray(pixels, mode="L").save(os.path.join(folder, f"{i:05d}.png"))


def cli(*args: str) -> None:
    command = [sys.executable, "-m", "sopfast.cli", *args]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)


def evaluate(model: list[str], data_dir: str, metrics: list[str], output: str) -> dict:
    """``sopfast evaluate`` of ``model`` (its flags) on the test split; the results it writes."""
    cli(
        "evaluate",
        *model,
        "--data",
        data_dir,
        "--split",
        "test",
        "--metrics",
        *metrics,
        "--no-progress",
        "--output",
        output,
    )
    with open(output) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="/tmp/first-user")
    parser.add_argument("--train-images", type=int, default=600)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--adapt", action="store_true", help="run sopfast adapt on the folder first")
    parser.add_argument("--seed", type=int, default=0, help="sopfast train --seed (0, the default, is not passed)")
    args = parser.parse_args()
    train, test = image_data()
    backbone_dir, data_dir = os.path.join(args.out, "backbone"), os.path.join(args.out, "data")
    train_dir, test_dir = os.path.join(data_dir, "train"), os.path.join(data_dir, "test")
    backbone = image_backbone()
    backbone.config.id2label = dict(enumerate(class_names(train.classes)))
    backbone.config.label2id = {name: i for i, name in backbone.config.id2label.items()}
    backbone.save_pretrained(backbone_dir)
    picked = torch.randperm(len(train.x), generator=torch.Generator().manual_seed(0))[: args.train_images]
    write_folder(train.x[picked], train.y[picked], train.classes, train_dir)
    write_folder(test.x[: args.test_images], test.y[: args.test_images], test.classes, test_dir)
    start = time.perf_counter()
    if args.adapt:
        adapted_dir = os.path.join(args.out, "backbone-adapted")
        cli("adapt", "--backbone", backbone_dir, "--data", data_dir, "--output-dir", adapted_dir, "--no-progress")
        backbone_dir = adapted_dir
    adapt_seconds = time.perf_counter() - start
    run_dir = os.path.join(args.out, "run-adapted" if args.adapt else "run")
    seed = ["--seed", str(args.seed)] if args.seed else []
    cli("train", "--backbone", backbone_dir, "--data", data_dir, "--output-dir", run_dir, "--no-progress", *seed)
    seconds = time.perf_counter() - start
    trained = evaluate(
        ["--checkpoint", run_dir, "--baselines", "random"],
        data_dir,
        ["accuracy", "agreement", "bounds", "diversity"],
        os.path.join(args.out, "trained.json"),
    )
    unranked = evaluate(
        ["--checkpoint", run_dir, "--no-demote-blank"],
        data_dir,
        ["accuracy", "agreement"],
        os.path.join(args.out, "trained_no_demote_blank.json"),
    )
    with open(os.path.join(run_dir, "diagnosis.json")) as f:
        diagnosis = json.load(f)
    records = [json.loads(line) for line in open(os.path.join(run_dir, "log.jsonl"))]
    result = {
        "train_images": args.train_images,
        "test_images": args.test_images,
        "adapted": args.adapt,
        "backbone_accuracy": trained["Backbone"]["accuracy"],
        "diagnosis_one_random_group": diagnosis["random_groups"][diagnosis["mode"]]["one_group"],
        "diagnosis_to_beat": diagnosis["to_beat"],
        "diagnosis_verdict": diagnosis["verdict"],
        "sop_accuracy": trained["SOP"]["accuracy"],
        "sop_agreement": trained["SOP"]["agreement"],
        "sop_generator_bound": trained["SOP"]["generator_bound"],
        "sop_selector_bound": trained["SOP"]["selector_bound"],
        "sop_selector_misses": trained["SOP"]["selector_misses"],
        "sop_no_demote_blank_accuracy": unranked["SOP"]["accuracy"],
        "sop_no_demote_blank_agreement": unranked["SOP"]["agreement"],
        "random_groups_accuracy": trained["Random"]["accuracy"],
        "random_groups_agreement": trained["Random"]["agreement"],
        "distinct_groups": trained["SOP"]["distinct_groups"],
        "steps": records[-1]["step"],
        "stopped": records[-1]["stopped"],
        "adapt_seconds": adapt_seconds,
        "train_seconds": seconds - adapt_seconds,
        "threads": torch.get_num_threads(),
        "seed": args.seed,
    }
    name = "first_user" + ("_adapted" if args.adapt else "") + (f"_seed{args.seed}" if args.seed else "")
    name += ("_threads1" if torch.get_num_threads() == 1 else "") + ".json"
    with open(os.path.join(HERE, name), "w") as f:
        json.dump(result, f, indent=2)
    print("| quantity | value |\n|---|---|")
    for key, value in result.items():
        print(f"| {key} | {value:.3f} |" if isinstance(value, float) else f"| {key} | {value} |")


if __name__ == "__main__":
    main()
