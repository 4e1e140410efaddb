"""Time to accuracy: the same SOP trained with the authors' algorithm, ``exact`` and ``drop`` (issue #16).

The demo task (Fashion-MNIST, or scikit-learn's digits when it is absent): one small ViT backbone is
trained with random patch masking and token dropping, as the demo does, then frozen. The same SOP
(same initial weights, authors' defaults) is trained three times with the same data order, seed and
optimiser (AdamW, constant learning rate): once with ``sopfast.model.reference.reference_forward`` (the
authors' algorithm: all candidate rows, full-resolution masks, masked full forwards with autograd
on), once in ``mode="exact"`` (the same function, computed without the waste) and once in
``mode="drop"`` (only the kept tokens run; an approximation for a ViT).  Each gets the same wall-clock
budget; every ``--eval-every`` steps the clock stops and test accuracy is measured (``exact`` for the
first two, ``drop`` for the third, the mode each is deployed in).  The variants take turns, one
step each, so that a loaded machine slows them alike.

Reported: wall time to reach the authors'-algorithm model's final accuracy, and the accuracy each
reached within the budget; a PNG of accuracy against wall-clock seconds.

    python bench/time_to_accuracy.py --budget 150 --out bench/time_to_accuracy
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

import sopfast
from sopfast.data import builtin as data
from sopfast.demo.backbones import small_vit, train_backbone
from sopfast.model.reference import reference_forward

VARIANTS = ("authors' algorithm", "exact", "drop")


def load_task(n_train: int, n_test: int) -> tuple[data.ImageData, data.ImageData]:
    if data.fashion_mnist_available():
        return data.load_fashion_mnist("train", n_train), data.load_fashion_mnist("test", n_test)
    train, test = data.load_digits_images().split(1500)
    return train, test


def backbone_for(train: data.ImageData, seed: int, epochs: int) -> tuple[torch.nn.Module, tuple[int, int]]:
    size = train.x.shape[-1]
    patch = 4 if size == 28 else 1
    grid = (size // patch, size // patch)
    torch.manual_seed(seed)
    model = small_vit(size, patch, 1, len(train.classes))
    return train_backbone(model, train.x, train.y, epochs=epochs, seed=seed, progress=False), grid


@torch.no_grad()
def accuracy(model: sopfast.SOP, x: torch.Tensor, y: torch.Tensor, mode: str) -> float:
    model.eval()
    correct = sum(
        int((model(x[s : s + 256], mode=mode).logits.argmax(-1) == y[s : s + 256]).sum()) for s in range(0, len(x), 256)
    )
    model.train()
    return correct / len(x)


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    train, test = load_task(args.n_train, args.n_test)
    backbone, _ = backbone_for(train, args.seed, args.backbone_epochs)
    torch.manual_seed(args.seed)
    base = sopfast.SOP(backbone, num_groups=min(20, train.x.shape[-1] ** 2), tau=0.2, recipe="paper")
    models = {name: copy.deepcopy(base).train() for name in VARIANTS}
    forwards = {
        "authors' algorithm": lambda m, x: reference_forward(m, x),
        "exact": lambda m, x: m(x, mode="exact"),
        "drop": lambda m, x: m(x, mode="drop"),
    }
    eval_mode = {"authors' algorithm": "exact", "exact": "exact", "drop": "drop"}
    optimizers = {name: torch.optim.AdamW(m.trainable_parameters(), lr=args.lr) for name, m in models.items()}
    order = torch.randperm(len(train.x), generator=torch.Generator().manual_seed(args.seed))
    clock = dict.fromkeys(VARIANTS, 0.0)
    curves: dict[str, list[tuple[float, int, float]]] = {
        name: [(0.0, 0, accuracy(models[name], test.x, test.y, eval_mode[name]))] for name in VARIANTS
    }
    step = 0
    while min(clock.values()) < args.budget:
        idx = order[(step * args.batch_size) % len(order) :][: args.batch_size]
        x, y = train.x[idx], train.y[idx]
        step += 1
        for name in VARIANTS:
            if clock[name] >= args.budget:
                continue
            model, optimizer = models[name], optimizers[name]
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            forwards[name](model, x).loss(y).backward()
            optimizer.step()
            clock[name] += time.perf_counter() - start
            if step % args.eval_every == 0 or clock[name] >= args.budget:
                curves[name].append((clock[name], step, accuracy(model, test.x, test.y, eval_mode[name])))
    target = curves["authors' algorithm"][-1][2]
    summary = {}
    for name, curve in curves.items():
        reached = next((t for t, step, acc in curve if step > 0 and acc >= target), None)
        summary[name] = {"steps": curve[-1][1], "final_accuracy": curve[-1][2], "seconds_to_target": reached}
    return {
        "dataset": train.name,
        "budget_s": args.budget,
        "target_accuracy": target,
        "summary": summary,
        "curves": curves,
        "settings": vars(args),
    }


def report(result: dict) -> str:
    target, ref = result["target_accuracy"], result["summary"]["authors' algorithm"]["seconds_to_target"]
    lines = [
        f"Target: the authors'-algorithm model's accuracy after {result['budget_s']:.0f} s of training "
        f"({target:.3f}, {result['dataset']}).",
        "",
        "| variant | steps in budget | accuracy at budget | seconds to target | vs authors |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in result["summary"].items():
        t = s["seconds_to_target"]
        ratio = "not reached" if t is None else (f"{t / ref:.2f}×" if ref else "—")
        lines.append(
            f"| {name} | {s['steps']} | {s['final_accuracy']:.3f} | {'—' if t is None else f'{t:.0f}'} | {ratio} |"
        )
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in result["curves"].items():
        ax.plot([t for t, _, _ in curve], [a for _, _, a in curve], marker="o", markersize=3, label=name)
    ax.axhline(result["target_accuracy"], color="grey", linestyle=":", linewidth=1, label="target")
    ax.set_xlabel("training wall-clock seconds (evaluation excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"SOP on {result['dataset']}: time to accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=150.0, help="training seconds per variant")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--n-train", type=int, default=12000)
    parser.add_argument("--n-test", type=int, default=500)
    parser.add_argument("--backbone-epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/time_to_accuracy", help="writes <out>.json, <out>.md, <out>.png")
    args = parser.parse_args()
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    text = report(result)
    out.with_suffix(".md").write_text(text + "\n")
    plot(result, out.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    main()
