"""A user's first ``sopfast train`` (issue #20): an image folder of a few hundred Fashion-MNIST PNGs
(``data/train/<class>/``, ``data/test/<class>/``), the demo's backbone (its config names the classes),
default flags but ``--epochs`` — then ``sopfast evaluate`` on the 1,000 PNGs of the test split.

    OMP_NUM_THREADS=1 python bench/quality/first_user.py --out /tmp/first-user    # about 5 minutes

Writes ``bench/quality/first_user.json`` and prints a Markdown table: the backbone's accuracy, the
untrained SOP's (the default recipe, before any step; chance is 0.1), the trained SOP's, its
distinct groups of 20 and the training wall time.  Everything runs through the CLI, as a user would.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time

import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_backbone, image_data

import sopfast

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


def untrained_accuracy(backbone_dir: str, data_dir: str, out: str) -> float:
    """The default SOP before training, through ``sopfast evaluate`` on an untrained checkpoint."""
    from transformers import ViTForImageClassification

    backbone = ViTForImageClassification.from_pretrained(backbone_dir).eval()
    torch.manual_seed(0)
    sopfast.SOP(backbone, num_groups=20, tau=0.2).save_pretrained(os.path.join(out, "untrained"))
    model = ["--backbone", backbone_dir, "--checkpoint", os.path.join(out, "untrained")]
    return evaluate(model, data_dir, ["accuracy"], os.path.join(out, "untrained.json"))["SOP"]["accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="/tmp/first-user")
    parser.add_argument("--train-images", type=int, default=400)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    train, test = image_data()
    backbone_dir, data_dir = os.path.join(args.out, "backbone"), os.path.join(args.out, "data")
    train_dir, test_dir = os.path.join(data_dir, "train"), os.path.join(data_dir, "test")
    backbone = image_backbone()
    backbone.config.id2label = dict(enumerate(class_names(train.classes)))
    backbone.config.label2id = {name: i for i, name in backbone.config.id2label.items()}
    backbone.save_pretrained(backbone_dir)
    write_folder(train.x[: args.train_images], train.y[: args.train_images], train.classes, train_dir)
    write_folder(test.x[: args.test_images], test.y[: args.test_images], test.classes, test_dir)
    run_dir = os.path.join(args.out, "run")
    start = time.perf_counter()
    cli(
        "train",
        "--backbone",
        backbone_dir,
        "--data",
        data_dir,
        "--epochs",
        str(args.epochs),
        "--output-dir",
        run_dir,
        "--no-progress",
    )
    seconds = time.perf_counter() - start
    trained = evaluate(
        ["--checkpoint", run_dir], data_dir, ["accuracy", "diversity"], os.path.join(args.out, "trained.json")
    )
    result = {
        "train_images": args.train_images,
        "epochs": args.epochs,
        "test_images": args.test_images,
        "backbone_accuracy": trained["Backbone"]["accuracy"],
        "untrained_accuracy": untrained_accuracy(backbone_dir, data_dir, args.out),
        "sop_accuracy": trained["SOP"]["accuracy"],
        "distinct_groups": trained["SOP"]["distinct_groups"],
        "train_seconds": seconds,
        "steps": sum(row["event"] == "train" for row in csv.DictReader(open(os.path.join(run_dir, "metrics.csv")))),
    }
    with open(os.path.join(HERE, "first_user.json"), "w") as f:
        json.dump(result, f, indent=2)
    print("| quantity | value |\n|---|---|")
    for key, value in result.items():
        print(f"| {key} | {value:.3f} |" if isinstance(value, float) else f"| {key} | {value} |")


if __name__ == "__main__":
    main()
