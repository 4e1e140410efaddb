"""The quality sweep of issue #11: which recipe gives the image demo an SOP worth explaining with.

Every row trains SOP on the cached demo backbone (``common.image_backbone``) with one recipe
and scores it on the first ``--test`` Fashion-MNIST test images: SOP accuracy (exact and drop),
Random groups through the same selector, and the group diversity (distinct groups of 20,
mean pairwise IoU, union coverage, groups used).  Results are appended to
``bench/quality/results.jsonl``; ``--table`` prints them as markdown.

    python bench/quality/sweep.py --rows demo-0.1 paper ...      # run rows (see ROWS)
    python bench/quality/sweep.py --table                         # the table of all results
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CACHE, image_backbone, image_data, text_backbone, text_data

from sopfast.evaluation import metrics as M
from sopfast.evaluation.baselines import candidate_mask
from sopfast.evaluation.evaluate import evaluate
from sopfast.model.sop import SOP
from sopfast.ops import aggregate
from sopfast.training.trainer import train

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results.jsonl")

# The 0.1 demo trained 3 epochs of 12k images (1,125 steps); sweep rows train 1 epoch of 6k
# (188 steps, where the collapse has already happened) unless they say otherwise.
DEMO_TRAIN = {"lr": 1e-3, "epochs": 3, "n_train": 12000, "batch_size": 32, "warmup_ratio": 0.05}
SHORT = {**DEMO_TRAIN, "epochs": 1, "n_train": 6000}
PAPER = {"group_gen_scale": 0.06, "group_sel_scale": 0.01, "blur_kernel_size": 3, "num_heads": 2}
PAPER_TRAIN = {**SHORT, "heads": "authors"}
FIX = {"center_embeddings": True, "queries": "diverse"}
NORM = {"normalize_logits": True, "group_gen_scale": 2.0}

# The 0.1 text demo: 3,000 tweets, one epoch, batch 16, lr 5e-4 (188 steps).
TEXT_DEMO_TRAIN = {"lr": 5e-4, "epochs": 1, "n_train": 3000, "batch_size": 16, "warmup_ratio": 0.05}

# name: (what it tests, SOP options, training options)
ROWS: dict[str, tuple[str, dict, dict]] = {
    "init": ("untrained SOP (0.1 demo options)", {}, {"epochs": 0}),
    "demo-0.1": ("0.1 demo: γ=1, β=1, no blur, 1 head, lr 1e-3, 1,125 steps, drop", {}, DEMO_TRAIN),
    "short": ("0.1 demo options, 188 steps", {}, SHORT),
    "lr-1e-4": ("lr 1e-4", {}, {**SHORT, "lr": 1e-4}),
    "lr-1e-5": ("lr 1e-5", {}, {**SHORT, "lr": 1e-5}),
    "lr-5e-6": ("the paper's lr 5e-6", {}, {**SHORT, "lr": 5e-6}),
    "gamma-0.06": ("γ = 0.06 (authors' ImageNet)", {"group_gen_scale": 0.06}, SHORT),
    "gamma-4": ("γ = 4 (sharper attention at init)", {"group_gen_scale": 4.0}, SHORT),
    "beta-0.01": ("β = 0.01 (authors' ImageNet)", {"group_sel_scale": 0.01}, SHORT),
    "blur-3": ("blur kernel 3", {"blur_kernel_size": 3}, SHORT),
    "heads-2": ("2 heads, authors' step-based head switch", {"num_heads": 2}, {**SHORT, "heads": "authors"}),
    "paper": (
        "authors' ImageNet: γ .06, β .01, blur 3, 2 heads, lr 5e-6",
        PAPER,
        {**SHORT, "lr": 5e-6, "heads": "authors"},
    ),
    "paper-lr1e-3": ("authors' ImageNet options, lr 1e-3", PAPER, PAPER_TRAIN),
    "ties-logits": ("ties='logits'", {"ties": "logits"}, SHORT),
    "exact": ("trained in exact mode", {"mode": "exact"}, SHORT),
    "freeze-proj": ("frozen projection copy (authors' freeze_projection)", {"freeze_projection": True}, SHORT),
    "center": ("+ center_embeddings", {"center_embeddings": True}, SHORT),
    "diverse": ("+ queries='diverse'", {"queries": "diverse"}, SHORT),
    "center-diverse": ("+ center_embeddings + queries='diverse'", FIX, SHORT),
    "center-diverse-g4": ("+ center + diverse, γ = 4", {**FIX, "group_gen_scale": 4.0}, SHORT),
    "center-diverse-frozen": ("+ center + diverse, frozen projection", {**FIX, "freeze_projection": True}, SHORT),
    "div-0.5": ("+ diversity_weight 0.5", {"diversity_weight": 0.5}, SHORT),
    "div-2": ("+ diversity_weight 2", {"diversity_weight": 2.0}, SHORT),
    "center-diverse-div-1": ("+ center + diverse + diversity_weight 1", {**FIX, "diversity_weight": 1.0}, SHORT),
    "norm-g1": ("normalize_logits, γ = 1", {"normalize_logits": True, "group_gen_scale": 1.0}, SHORT),
    "norm-g2": ("normalize_logits, γ = 2", {"normalize_logits": True, "group_gen_scale": 2.0}, SHORT),
    "norm-g2-cd": (
        "normalize_logits γ 2 + center + diverse",
        {**FIX, "normalize_logits": True, "group_gen_scale": 2.0},
        SHORT,
    ),
    "norm-g2-cd-div1": (
        "normalize_logits γ 2 + center + diverse + diversity_weight 1",
        {**FIX, "normalize_logits": True, "group_gen_scale": 2.0, "diversity_weight": 1.0},
        SHORT,
    ),
    "text-demo-0.1": ("0.1 text demo: γ=1, β=1, 1 head, lr 5e-4, 188 steps of 16 tweets, drop", {}, {}),
    "text-cd": ("text + center + diverse", FIX, {}),
    "text-norm-cd": ("text + normalize_logits γ 2 + center + diverse", {**FIX, **NORM}, {}),
    "text-norm-cd-div1": (
        "text + normalize γ 2 + center + diverse + diversity 1",
        {**FIX, **NORM, "diversity_weight": 1.0},
        {},
    ),
    "text-freeze": ("text, frozen projection", {"freeze_projection": True}, {}),
    "norm-g2-div1": (
        "normalize γ 2 + diversity 1 (fixed queries, no centring)",
        {**NORM, "diversity_weight": 1.0},
        SHORT,
    ),
    "norm-g2-d-div1": (
        "normalize γ 2 + diverse + diversity 1 (no centring)",
        {**NORM, "queries": "diverse", "diversity_weight": 1.0},
        SHORT,
    ),
    "norm-g3-cd-div1": (
        "normalize γ 3 + center + diverse + diversity 1",
        {**FIX, **NORM, "group_gen_scale": 3.0, "diversity_weight": 1.0},
        SHORT,
    ),
    "norm-g2-cd-div1-b0.3": (
        "normalize γ 2 + center + diverse + diversity 1, β 0.3",
        {**FIX, **NORM, "diversity_weight": 1.0, "group_sel_scale": 0.3},
        SHORT,
    ),
    "norm-g2-cd-div1-long": (
        "normalize γ 2 + center + diverse + diversity 1, 1,125 steps",
        {**FIX, **NORM, "diversity_weight": 1.0},
        DEMO_TRAIN,
    ),
    "long-div0.5": (
        "normalize γ 2 + center + diverse + diversity 0.5, 1,125 steps",
        {**FIX, **NORM, "diversity_weight": 0.5},
        DEMO_TRAIN,
    ),
    "long-b2": (
        "normalize γ 2 + center + diverse + diversity 1, β 2, 1,125 steps",
        {**FIX, **NORM, "diversity_weight": 1.0, "group_sel_scale": 2.0},
        DEMO_TRAIN,
    ),
    "long-g3": (
        "normalize γ 3 + center + diverse + diversity 1, 1,125 steps",
        {**FIX, **NORM, "group_gen_scale": 3.0, "diversity_weight": 1.0},
        DEMO_TRAIN,
    ),
    "long-cd-div1": (
        "center + diverse + diversity 1 (no normalisation, γ 1), 1,125 steps",
        {**FIX, "diversity_weight": 1.0},
        DEMO_TRAIN,
    ),
    "sal1": (
        "normalize γ 2 + center + diverse + diversity 1 + saliency 1",
        {**FIX, **NORM, "diversity_weight": 1.0, "saliency_weight": 1.0},
        SHORT,
    ),
    "long-sal1": (
        "normalize γ 2 + center + diverse + diversity 1 + saliency 1, 1,125 steps",
        {**FIX, **NORM, "diversity_weight": 1.0, "saliency_weight": 1.0},
        DEMO_TRAIN,
    ),
    "gamma-16": ("γ = 16 (saturated attention: λ ≈ 1, groups barely train)", {"group_gen_scale": 16.0}, SHORT),
}


def authors_heads(model: SOP, total_steps: int):
    """A training callback: head ``step // (total_steps / H)`` as the authors' training script
    (``sopfast.train`` uses ``epoch mod H``, which never leaves head 0 in a one-epoch run)."""

    def callback(trainer, event: str, record: dict) -> None:
        if event == "step":
            model.epoch = min(model.generator.num_heads - 1, record["step"] * model.generator.num_heads // total_steps)

    return callback


TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def model_args(task: str, data, sel: slice) -> tuple[torch.Tensor, ...]:
    """The model's positional inputs for ``data[sel]`` (images ``x`` or the three token tensors)."""
    if task == "image":
        return (data.x[sel],)
    return tuple(data.encoded[k][sel] for k in TEXT_KEYS)


def labels_of(task: str, data) -> torch.Tensor:
    return data.y if task == "image" else data.labels


def tracker(model: SOP, probe: tuple[torch.Tensor, ...], trace: list[dict], every: int):
    """A training callback: every ``every`` steps, SOP's accuracy and the diversity of its groups on
    ``probe`` (the model's inputs, then the labels)."""

    def callback(trainer, event: str, record: dict) -> None:
        if event != "step" or record["step"] % every:
            return
        was_training = model.training
        model.eval()
        with torch.no_grad():
            out = model(*probe[:-1])
            inputs = model.prepare(*probe[:-1])
        model.train(was_training)
        div = M.group_diversity(out.group_masks, candidate_mask(model, inputs))
        acc = float(M.accuracy(out.logits, probe[-1]))
        trace.append({"step": record["step"], "acc": acc, **{k: round(float(div[k].nanmean()), 3) for k in TRACED}})
        print(json.dumps(trace[-1]), flush=True)

    return callback


TRACED = ("distinct_groups", "pairwise_iou", "union_coverage")


@torch.no_grad()
def group_stats(model: SOP, task: str, data, n: int) -> dict[str, float]:
    """What the groups are worth (drop mode) on ``data[:n]``: each group's own accuracy, λ of the
    used groups, and the accuracy with every λ set to 1 (the selector's weights alone)."""
    model.eval()
    rows = []
    y = labels_of(task, data)
    for s in range(0, n, 100):
        sel = slice(s, min(n, s + 100))
        out = model(*model_args(task, data, sel), mode="drop")
        labels = y[sel]
        pred = out.logits.argmax(-1)
        used = out.group_scores[torch.arange(len(pred)), pred] > 0
        group_correct = (out.group_logits.argmax(-1) == labels[:, None]).float()
        unit = aggregate(out.group_scores, torch.ones_like(out.lam), out.group_logits)
        count = used.sum(-1).clamp_min(1)
        rows.append(
            torch.stack(
                [
                    group_correct.mean(-1),
                    (group_correct * used).sum(-1) / count,
                    (out.lam * used).sum(-1) / count,
                    ((out.lam < 0) & used).sum(-1) / count,
                    out.lam.mean(-1),
                    (unit.argmax(-1) == labels).float(),
                ],
                dim=1,
            )
        )
    means = torch.cat(rows).mean(0).tolist()
    keys = ("group_acc", "used_group_acc", "used_lam", "used_lam_negative", "lam_mean", "acc_lam_1")
    return dict(zip(keys, means))


def run_row(name: str, sop_options: dict, train_options: dict, n_test: int, task: str = "image", seed: int = 0) -> dict:
    """Train one SOP recipe on the cached backbone and score it (see the module docstring)."""
    if task == "image":
        backbone, (train_set, test), m, defaults = image_backbone(), image_data(), 20, DEMO_TRAIN
    else:
        backbone, (train_set, test), m, defaults = text_backbone(), text_data(), 8, TEXT_DEMO_TRAIN
    n_test = min(n_test, len(labels_of(task, test)))
    options = {"num_groups": m, "tau": 0.2, "mode": "drop", **sop_options}
    torch.manual_seed(seed)
    model = SOP(backbone, **options)
    cfg = {**defaults, **train_options}
    n, epochs = cfg.pop("n_train"), cfg.pop("epochs")
    trace: list[dict] = []
    start = time.perf_counter()
    if epochs > 0:
        if task == "image":
            data = torch.utils.data.TensorDataset(train_set.x[-n:], train_set.y[-n:])
        else:
            data = torch.utils.data.Subset(train_set, range(n))
        probe = (*model_args(task, test, slice(0, 200)), labels_of(task, test)[:200])
        callbacks = [tracker(model, probe, trace, every=cfg.pop("track_every", 50))]
        if cfg.pop("heads", None) == "authors":
            callbacks.append(authors_heads(model, epochs * -(-n // cfg["batch_size"])))
        train(model, data, None, epochs=epochs, resume=False, progress=False, seed=seed, callbacks=callbacks, **cfg)
    seconds = time.perf_counter() - start
    model.save_pretrained(os.path.join(CACHE, "sweep", name))
    if task == "image":
        test_set = torch.utils.data.TensorDataset(test.x[:n_test], test.y[:n_test])
    else:
        test_set = torch.utils.data.Subset(test, range(n_test))
    loader = torch.utils.data.DataLoader(test_set, batch_size=100)
    res = evaluate(model, loader, metrics=["accuracy", "diversity"], mode="drop", baselines=["random"], progress=False)
    exact = evaluate(model, loader, metrics=["accuracy"], mode="exact", progress=False)["SOP"]["accuracy"]
    sop = res["SOP"]
    row = {
        "row": name,
        "task": task,
        "sop_drop": sop["accuracy"],
        "sop_exact": exact,
        "random_drop": res["Random"]["accuracy"],
        **{k: sop[k] for k in ("distinct_groups", "pairwise_iou", "union_coverage", "groups_used")},
        **group_stats(model, task, test, n_test),
        "train_seconds": round(seconds, 1),
        "n_test": n_test,
        "options": {k: v for k, v in options.items() if k not in ("num_groups", "tau")},
        "train": {"epochs": epochs, "n_train": n, **cfg},
        "trace": trace,
    }
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    return row


COLUMNS = (
    ("row", "row", "{}"),
    ("sop_drop", "SOP acc (drop)", "{:.3f}"),
    ("sop_exact", "SOP acc (exact)", "{:.3f}"),
    ("random_drop", "Random acc", "{:.3f}"),
    ("distinct_groups", "distinct of 20", "{:.1f}"),
    ("pairwise_iou", "pair IoU", "{:.2f}"),
    ("union_coverage", "coverage", "{:.2f}"),
    ("groups_used", "used", "{:.1f}"),
    ("train_seconds", "train s", "{:.0f}"),
)


def table(rows: list[dict]) -> str:
    """Markdown table of sweep results (one line per row, the last run of each name, images then text)."""
    latest = {r["row"]: r for r in rows}
    latest = dict(sorted(latest.items(), key=lambda kv: kv[1].get("task", "image") == "text"))
    lines = ["| " + " | ".join(c[1] for c in COLUMNS) + " | what |", "|" + "---|" * (len(COLUMNS) + 1)]
    for name, r in latest.items():
        what = ROWS[name][0] if name in ROWS else ""
        lines.append("| " + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + f" | {what} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="*", default=[], help=f"rows to run: {list(ROWS)}")
    parser.add_argument("--test", type=int, default=1000, help="test images to score on")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--table", action="store_true", help="print the table of bench/quality/results.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.rows:
        _, sop_options, train_options = ROWS[name]
        task = "text" if name.startswith("text-") else "image"
        print(json.dumps(run_row(name, sop_options, train_options, args.test, task)), flush=True)
    if args.table and os.path.exists(RESULTS):
        with open(RESULTS, encoding="utf-8") as f:
            print(table([json.loads(line) for line in f]))


if __name__ == "__main__":
    main()
