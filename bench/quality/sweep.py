"""The quality sweep of issue #11: which recipe gives the image demo an SOP worth explaining with.

Every row trains SOP on the cached demo backbone (``common.image_backbone``) with one recipe
and scores it on the first ``--test`` Fashion-MNIST test images: SOP accuracy (exact and drop),
Random groups through the same selector, and the group diversity (distinct groups of 20,
mean pairwise IoU, union coverage, groups used); with ``--curves`` instead SOP against random
groups over τ × m (``curves.py``, the targets of issue #11).  Every row starts from
``recipe="paper"`` (the authors' algorithm) and names each option it changes, as when the rows were
run (before the default recipe existed).  Results are appended to ``bench/quality/results.jsonl``;
``--table`` and ``--curve-table`` print them as markdown.

    python bench/quality/sweep.py --rows demo-0.1 paper ...             # run rows (see ROWS)
    python bench/quality/sweep.py --curves --rows c-ig2-div8-unit-blank-long --seeds 0 1  # τ × m
    python bench/quality/sweep.py --table                                # the table of all results
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CACHE, TEXT_KEYS, image_backbone, image_data, text_backbone, text_data

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

RECIPE = {**FIX, **NORM, "diversity_weight": 1.0}
WIN = {
    **RECIPE,
    "key_score": True,
    "saliency_weight": 1.0,
    "saliency_loss": "kl",
    "saliency_levels": (0.2, 0.6),
    "diversity_weight": 6.0,
    "unit_lambda": True,
}
# The winner: the default recipe, RECIPES["sopfast"] in sopfast/model/recipes.py (which adds
# keep_special_tokens for text backbones with special tokens).
FINAL = {**WIN, "diversity_weight": 8.0, "demote_blank": True}
USER = {**DEMO_TRAIN, "epochs": 4, "n_train": 512, "track_every": 16}
KL = {**RECIPE, "key_score": True, "saliency_weight": 1.0, "saliency_loss": "kl"}

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
    # -- issue #11 research rows (score with --curves) --
    # Not here: the rows of options that were not ported from branch quality-research (c-aux1,
    # c-st1, c-st01, c-st1a, c-taus, c-teach1, c-teach03, c-ks-teach03, c-ks-aux1, c-ks-salkey1,
    # c-ks-salkey3, c-final-mlp-long, c-final-plr01-long, c-final-hlr3-long: group_loss_weight,
    # straight_through_*, train_taus, saliency_loss="key", key_score="mlp", projection_lr_scale).
    # Their results stay in results.jsonl; their code is on that branch.
    "c-init": ("untrained, the demo recipe", RECIPE, {"epochs": 0}),
    "c-base": ("the demo recipe (normalize γ 2 + center + diverse + diversity 1), 188 steps", RECIPE, SHORT),
    "c-blank": ("recipe + demote_blank (background patches ranked last)", {**RECIPE, "demote_blank": True}, SHORT),
    "c-unit": ("recipe + unit_lambda (λ = 1 forward, λ's gradient backward)", {**RECIPE, "unit_lambda": True}, SHORT),
    "c-sal1": ("recipe + saliency teacher 1", {**RECIPE, "saliency_weight": 1.0}, SHORT),
    "c-sal03": ("recipe + saliency teacher 0.3", {**RECIPE, "saliency_weight": 0.3}, SHORT),
    "c-sal3": ("recipe + saliency teacher 3", {**RECIPE, "saliency_weight": 3.0}, SHORT),
    "c-ks": ("recipe + key_score (query-independent v·e_j in every row)", {**RECIPE, "key_score": True}, SHORT),
    "c-ks-sal1": ("recipe + key_score + saliency 1", {**RECIPE, "key_score": True, "saliency_weight": 1.0}, SHORT),
    "c-ks-salkl1": (
        "recipe + key_score + saliency KL (every row) 1",
        {**RECIPE, "key_score": True, "saliency_weight": 1.0, "saliency_loss": "kl"},
        SHORT,
    ),
    "c-kl1-div2": ("key_score + saliency KL 1, diversity 2", {**KL, "diversity_weight": 2.0}, SHORT),
    "c-kl03": ("key_score + saliency KL 0.3", {**KL, "saliency_weight": 0.3}, SHORT),
    "c-kl1-unit": ("key_score + saliency KL 1 + unit_lambda", {**KL, "unit_lambda": True}, SHORT),
    "c-kl03-unit": (
        "key_score + saliency KL 0.3 + unit_lambda",
        {**KL, "saliency_weight": 0.3, "unit_lambda": True},
        SHORT,
    ),
    "c-kl1-nokey": ("saliency KL 1 without key_score", {**KL, "key_score": False}, SHORT),
    "c-kl1-div2-g4": (
        "key_score + saliency KL 1, diversity 2, γ 4",
        {**KL, "diversity_weight": 2.0, "group_gen_scale": 4.0},
        SHORT,
    ),
    "c-kl1-div2-unit": (
        "key_score + saliency KL 1, diversity 2, unit_lambda",
        {**KL, "diversity_weight": 2.0, "unit_lambda": True},
        SHORT,
    ),
    "c-kl1-div3-unit": (
        "key_score + saliency KL 1, diversity 3, unit_lambda",
        {**KL, "diversity_weight": 3.0, "unit_lambda": True},
        SHORT,
    ),
    "c-kl1-div2-long": (
        "key_score + saliency KL 1, diversity 2, 1,125 steps",
        {**KL, "diversity_weight": 2.0},
        DEMO_TRAIN,
    ),
    "text-c-base": ("text, the demo recipe (curves)", RECIPE, {}),
    "text-c-keep": (
        "text, recipe + keep_special_tokens ([CLS]/[SEP] always kept, not candidates)",
        {**RECIPE, "keep_special_tokens": True},
        {},
    ),
    "text-c-kl-keep": (
        "text, key_score + saliency KL 1 + diversity 2 + keep_special_tokens",
        {**KL, "diversity_weight": 2.0, "keep_special_tokens": True},
        {},
    ),
    "text-c-win-keep": (
        "text, key_score + saliency KL 1 + diversity 3 + unit_lambda + keep_special_tokens",
        {**KL, "diversity_weight": 3.0, "unit_lambda": True, "keep_special_tokens": True},
        {},
    ),
    "text-c-win": (
        "text, key_score + saliency KL 1 + diversity 3 + unit_lambda",
        {**KL, "diversity_weight": 3.0, "unit_lambda": True},
        {},
    ),
    "text-c-kl": ("text, key_score + saliency KL 1 + diversity 2", {**KL, "diversity_weight": 2.0}, {}),
    "c-kl1-div3-unit-long": (
        "key_score + saliency KL 1, diversity 3, unit_lambda, 1,125 steps",
        {**KL, "diversity_weight": 3.0, "unit_lambda": True},
        DEMO_TRAIN,
    ),
    "c-kl1-div3-long": (
        "key_score + saliency KL 1, diversity 3, 1,125 steps",
        {**KL, "diversity_weight": 3.0},
        DEMO_TRAIN,
    ),
    "c-ig2-div3-unit-long": (
        "key_score + KL to 2-level saliency (z 0.2, 0.6) 1, diversity 3, unit_lambda, 1,125 steps",
        {**KL, "saliency_levels": (0.2, 0.6), "diversity_weight": 3.0, "unit_lambda": True},
        DEMO_TRAIN,
    ),
    "c-ig2-div6-unit-long": (
        "key_score + KL to 2-level saliency 1, diversity 6, unit_lambda, 1,125 steps",
        {**KL, "saliency_levels": (0.2, 0.6), "diversity_weight": 6.0, "unit_lambda": True},
        DEMO_TRAIN,
    ),
    "c-ig2-div6-unit": (
        "key_score + KL to 2-level saliency 1, diversity 6, unit_lambda, 188 steps",
        {**KL, "saliency_levels": (0.2, 0.6), "diversity_weight": 6.0, "unit_lambda": True},
        SHORT,
    ),
    "c-ig2-div10-unit": (
        "key_score + KL to 2-level saliency 1, diversity 10, unit_lambda, 188 steps",
        {**KL, "saliency_levels": (0.2, 0.6), "diversity_weight": 10.0, "unit_lambda": True},
        SHORT,
    ),
    "c-user-recipe": ("first user run: 512 images × 4 epochs (64 steps), the demo recipe", RECIPE, USER),
    "c-user-win": (
        "first user run: 512 images × 4 epochs (64 steps), key_score + KL 2-level saliency + div 3 + unit_lambda",
        {**KL, "saliency_levels": (0.2, 0.6), "diversity_weight": 3.0, "unit_lambda": True},
        USER,
    ),
    "c-ig2-div8-unit-blank-long": (
        "key_score + KL 2-level saliency 1, diversity 8, unit_lambda, demote_blank, 1,125 steps",
        {**WIN, "diversity_weight": 8.0, "demote_blank": True},
        DEMO_TRAIN,
    ),
    "c-ig2-div6-unit-blank-kl3-long": (
        "key_score + KL 2-level saliency 3, diversity 6, unit_lambda, demote_blank, 1,125 steps",
        {**WIN, "saliency_weight": 3.0, "demote_blank": True},
        DEMO_TRAIN,
    ),
    "c-final-init": ("the final image recipe, untrained", FINAL, {"epochs": 0}),
    "c-final-user": ("the final image recipe, first user run: 512 images × 4 epochs (64 steps)", FINAL, USER),
    "c-final-user100": ("the final image recipe, 800 images × 4 epochs (100 steps)", FINAL, {**USER, "n_train": 800}),
    "c-final-short": ("the final image recipe, 188 steps", FINAL, SHORT),
    "c-final-nounit-long": (
        "the final image recipe without unit_lambda, 1,125 steps",
        {**FINAL, "unit_lambda": False},
        DEMO_TRAIN,
    ),
    "text-c-final-keep": (
        "text, the final image recipe (demote_blank = [CLS]/[SEP] ranked last) + keep_special_tokens",
        {**FINAL, "keep_special_tokens": True},
        {},
    ),
    "text-c-final-keep-2ep": (
        "text, the final image recipe + keep_special_tokens, 2 epochs (376 steps)",
        {**FINAL, "keep_special_tokens": True},
        {"epochs": 2},
    ),
    "text-c-final5-keep": (
        "text, the final recipe, 5-level saliency teacher (z 0.1 … 0.9: IG-quality on text), keep_special_tokens",
        {**FINAL, "saliency_levels": (0.1, 0.3, 0.5, 0.7, 0.9), "keep_special_tokens": True},
        {},
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


def _train_model(name: str, sop_options: dict, train_options: dict, task: str, seed: int):
    """Build and train one SOP recipe on the cached backbone.

    Returns ``(model, test data, options, train cfg, seconds, trace)``."""
    if task == "image":
        backbone, (train_set, test), m, defaults = image_backbone(), image_data(), 20, DEMO_TRAIN
    else:
        backbone, (train_set, test), m, defaults = text_backbone(), text_data(), 8, TEXT_DEMO_TRAIN
    options = {"num_groups": m, "tau": 0.2, "mode": "drop", "recipe": "paper", **sop_options}
    torch.manual_seed(seed)
    model = SOP(backbone, **options)
    cfg = {**defaults, **train_options}
    n, epochs = cfg.pop("n_train"), cfg.pop("epochs")
    offset = cfg.pop("offset", 0)
    track = cfg.pop("track_every", 50)
    trace: list[dict] = []
    start = time.perf_counter()
    if epochs > 0:
        if task == "image":
            data = torch.utils.data.TensorDataset(
                train_set.x[-n - offset : len(train_set.x) - offset],
                train_set.y[-n - offset : len(train_set.y) - offset],
            )
        else:
            data = torch.utils.data.Subset(train_set, range(offset, offset + n))
        callbacks = []
        if track:
            probe = (*model_args(task, test, slice(0, 200)), labels_of(task, test)[:200])
            callbacks.append(tracker(model, probe, trace, every=track))
        if cfg.pop("heads", None) == "authors":
            callbacks.append(authors_heads(model, epochs * -(-n // cfg["batch_size"])))
        train(model, data, None, epochs=epochs, resume=False, progress=False, seed=seed, callbacks=callbacks, **cfg)
    seconds = time.perf_counter() - start
    return model, test, options, {"epochs": epochs, "n_train": n, "offset": offset, **cfg}, seconds, trace


def run_curve_row(
    name: str, sop_options: dict, train_options: dict, n_test: int, task: str = "image", seed: int = 0
) -> dict:
    """Train one recipe and score it on the targets of issue #11 (:mod:`curves`): SOP vs random
    groups over τ ∈ {0.05, 0.1, 0.2, 0.4} × m ∈ {1, 5, m_train}, distinct groups, on-object share,
    λ per τ, single-group accuracy; appended to ``results.jsonl`` with ``"kind": "curves"``."""
    from curves import GROUP_COUNTS, curves, format_curves

    model, test, options, cfg, seconds, trace = _train_model(name, sop_options, train_options, task, seed)
    n_test = min(n_test, len(labels_of(task, test)))
    ms = GROUP_COUNTS if task == "image" else (1, 4, 8)
    start = time.perf_counter()
    batches, pixels = [], None
    for s in range(0, n_test, 100):
        batches.append(model.prepare(*model_args(task, test, slice(s, min(n_test, s + 100)))))
    if task == "image":
        pixels = test.x[:n_test]
    res = curves(
        model, batches, labels_of(task, test)[:n_test], group_counts=ms, pixels=pixels, m_ref=ms[-1], seed=seed
    )
    eval_seconds = time.perf_counter() - start
    print(name, f"seed {seed}", "\n" + format_curves(res, group_counts=ms), flush=True)
    row = {
        "row": name,
        "kind": "curves",
        "task": task,
        "seed": seed,
        **res,
        "train_seconds": round(seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "options": {k: v for k, v in options.items() if k not in ("num_groups", "tau")},
        "train": cfg,
        "trace": trace,
    }
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    model.save_pretrained(os.path.join(CACHE, "sweep", f"{name}-s{seed}"))
    return row


def run_row(name: str, sop_options: dict, train_options: dict, n_test: int, task: str = "image", seed: int = 0) -> dict:
    """Train one SOP recipe on the cached backbone and score it (see the module docstring)."""
    if task == "image":
        backbone, (train_set, test), m, defaults = image_backbone(), image_data(), 20, DEMO_TRAIN
    else:
        backbone, (train_set, test), m, defaults = text_backbone(), text_data(), 8, TEXT_DEMO_TRAIN
    n_test = min(n_test, len(labels_of(task, test)))
    options = {"num_groups": m, "tau": 0.2, "mode": "drop", "recipe": "paper", **sop_options}
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
    latest = {r["row"]: r for r in rows if r.get("kind") != "curves"}
    latest = dict(sorted(latest.items(), key=lambda kv: kv[1].get("task", "image") == "text"))
    lines = ["| " + " | ".join(c[1] for c in COLUMNS) + " | what |", "|" + "---|" * (len(COLUMNS) + 1)]
    for name, r in latest.items():
        what = ROWS[name][0] if name in ROWS else ""
        lines.append("| " + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + f" | {what} |")
    return "\n".join(lines)


def curve_table(rows: list[dict]) -> str:
    """Markdown table of the curve rows: per row name, the mean over its seeds (latest run of each seed)."""
    latest: dict[tuple[str, int], dict] = {}
    for r in rows:
        if r.get("kind") == "curves":
            latest[(r["row"], r["seed"])] = r
    names = list(dict.fromkeys(name for name, _ in latest))
    keys = [f"{t}/{m}" for m in (1, 5, 20) for t in (0.05, 0.1, 0.2, 0.4)]
    tkeys = [f"{t}/{m}" for m in (1, 4, 8) for t in (0.05, 0.1, 0.2, 0.4)]
    head = "| row | seeds | " + " | ".join(f"τ{k}" for k in keys) + " | distinct | obj | obj used | grp acc | train s |"
    lines = [head, "|" + "---|" * (len(keys) + 7)]
    for name in names:
        runs = [r for (n, _), r in latest.items() if n == name]
        ks = tkeys if runs[0]["task"] == "text" else keys

        def avg(get, runs=runs):
            vals = [get(r) for r in runs]
            vals = [v for v in vals if v is not None]
            return sum(vals) / len(vals) if vals else float("nan")

        cells = [f"{avg(lambda r, k=k: r['sop'][k]):.3f}/{avg(lambda r, k=k: r['random'][k]):.3f}" for k in ks]
        lines.append(
            f"| {name} | {len(runs)} | "
            + " | ".join(cells)
            + f" | {avg(lambda r: r['distinct_groups']):.1f} | {avg(lambda r: r['object_share']):.2f}"
            + f" | {avg(lambda r: r['object_share_used']):.2f} | {avg(lambda r: r['group_acc']):.3f}"
            + f" | {avg(lambda r: r['train_seconds']):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="*", default=[], help=f"rows to run: {list(ROWS)}")
    parser.add_argument("--test", type=int, default=1000, help="test images to score on")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--table", action="store_true", help="print the table of bench/quality/results.jsonl")
    parser.add_argument("--curves", action="store_true", help="score rows on the τ × m targets (curves.py) instead")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0], help="training seeds (with --curves)")
    parser.add_argument("--curve-table", action="store_true", help="print the table of the curve rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.rows:
        _, sop_options, train_options = ROWS[name]
        task = "text" if name.startswith("text-") else "image"
        if args.curves:
            for seed in args.seeds:
                run_curve_row(name, sop_options, train_options, args.test, task, seed)
        else:
            print(json.dumps(run_row(name, sop_options, train_options, args.test, task)), flush=True)
    if args.curve_table and os.path.exists(RESULTS):
        with open(RESULTS, encoding="utf-8") as f:
            print(curve_table([json.loads(line) for line in f]))
    if args.table and os.path.exists(RESULTS):
        with open(RESULTS, encoding="utf-8") as f:
            print(table([json.loads(line) for line in f]))


if __name__ == "__main__":
    main()
