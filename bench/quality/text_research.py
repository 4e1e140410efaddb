"""Issue #34: why SOP's text groups lose to the post-hoc rankings, and which text recipe wins.

On the text demo's cached backbone (``common.text_backbone``: MiniLM + a head trained on tweets of every
length) and its test tweets.  Commands (results appended to ``text_research.jsonl`` beside this file):

    python bench/quality/text_research.py teachers --test 300       # one-group accuracy of the rankings
    python bench/quality/text_research.py train ROW [ROW ...] --seed 0 --test 300
    python bench/quality/text_research.py train ROW --roberta /tmp/second_text_model/backbone  # the second model
    python bench/quality/text_research.py table                     # the rows as markdown

``teachers``: the backbone diagnostic (``sopfast.diagnose``: random groups, an informed group) and the
accuracy of one group made of the top-τ features of each ranking — the post-hoc ones (IG-F, Occlusion-F,
LIME-F) and the saliency teachers SOP can distil in training (``mean_saliency`` at the recipe's levels).

``train``: trains one row of :data:`ROWS` (the default recipe plus the options it names) and scores it:
SOP vs random groups through the same selector over τ × m (``curves.py``), distinct groups, and what the
groups hold: the share of tweets whose most important word (the one whose removal lowers the predicted
class most, occlusion) is in some group / in the group the selector weighs most, the number of groups
holding it, and the accuracy of the most-weighted group alone and of the best group (an oracle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CACHE, text_backbone, text_data, text_inputs
from curves import curves

from sopfast.evaluation.baselines import AttributionBaseline, make_baseline
from sopfast.evaluation.methods import candidate_mask, run_masks, top_tau_masks
from sopfast.masking.diagnose import diagnose
from sopfast.masking.forward import run_mask_sets
from sopfast.model.losses import mean_saliency
from sopfast.model.sop import SOP
from sopfast.training.trainer import train

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "text_research.jsonl")
TAUS = (0.05, 0.1, 0.2, 0.4)
COUNTS = (1, 3, 8)

# The text demo's SOP training before #34: 3,000 tweets, one epoch, batch 16 (188 steps), the recipe's lr.
BASE_TRAIN = {"n_train": 3000, "epochs": 1, "batch_size": 16}
# The recipe's text options before #34 and the ones #34 chose (``RECIPES["sopfast"].model_by_modality``).
BEFORE = {"saliency_levels": (0.2, 0.6), "diversity_weight": 8.0}
TEXT = {"saliency_levels": (0.1, 0.3, 0.5, 0.7, 0.9), "diversity_weight": 2.0}
# name: (what it tests, SOP options over the default recipe, training options)
ROWS: dict[str, tuple[str, dict, dict]] = {
    "before": ("the default recipe before #34: 2-level teacher, overlap penalty 8 (lr 5e-4, 188 steps)", BEFORE, {}),
    "frozen": (
        "before #34, frozen projection (the generator's copy of MiniLM not trained)",
        {**BEFORE, "freeze_projection": True},
        {},
    ),
    "div2": ("before #34, overlap penalty 2", {**BEFORE, "diversity_weight": 2.0}, {}),
    "sal5": ("before #34, 5-level saliency teacher", {**BEFORE, "saliency_levels": TEXT["saliency_levels"]}, {}),
    "lr1e-4": ("before #34, lr 1e-4", BEFORE, {"lr": 1e-4}),
    "long": ("before #34, 3 epochs (564 steps)", BEFORE, {"epochs": 3}),
    "sal5-div2": ("the text recipe of #34: 5-level saliency teacher, overlap penalty 2", TEXT, {}),
    "sal5-div2-lr1e-3": ("the text recipe of #34 at lr 1e-3", TEXT, {"lr": 1e-3}),
    "sal5-div2-frozen": ("the text recipe of #34, frozen projection", {**TEXT, "freeze_projection": True}, {}),
    "sal5-div2-2ep": ("the text recipe of #34, 2 epochs (376 steps)", TEXT, {"epochs": 2}),
    "sal5-div8-2ep": (
        "the text recipe of #34 with the image recipe's overlap penalty 8, 2 epochs (376 steps)",
        {**TEXT, "diversity_weight": 8.0},
        {"epochs": 2},
    ),
}


def _batches(model: SOP, data, n: int, size: int = 50):
    return [text_inputs(model, data, slice(s, min(n, s + size))) for s in range(0, n, size)]


def _append(row: dict) -> None:
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


@torch.no_grad()
def one_group_accuracy(model: SOP, batches, labels: torch.Tensor, scores_fn, taus=TAUS) -> dict[str, float]:
    """Accuracy of one group of the top-τ features of ``scores_fn(inputs) -> [B, d]`` at each τ."""
    correct = {t: 0 for t in taus}
    start = 0
    for inputs in batches:
        b = inputs.batch_size
        y = labels[start : start + b]
        valid = candidate_mask(model, inputs)
        scores = scores_fn(inputs).float().masked_fill(~valid, float("-inf"))
        for t in taus:
            masks = top_tau_masks(scores.unsqueeze(1), valid, t, True)
            logits = run_masks(model, inputs, masks, model.mode).logits[:, 0].float()
            correct[t] += int((logits.argmax(-1) == y).sum())
        start += b
    return {str(t): correct[t] / start for t in taus}


def occlusion_scores(model: SOP, inputs) -> torch.Tensor:
    """``[B, d]``: how much removing each candidate feature alone lowers the probability of the
    backbone's full-input prediction (drop mode)."""
    adapter = model.adapter
    valid = adapter.candidate_mask(inputs)
    b, d = valid.shape
    with torch.no_grad():
        target = adapter.full_forward(inputs)[0].argmax(-1)
        full = adapter.full_forward(inputs)[0].float().softmax(-1).gather(1, target[:, None])
        without = valid.unsqueeze(1) & ~torch.eye(d, dtype=torch.bool, device=valid.device)
        probs = run_mask_sets(adapter, inputs, without, "drop", allow_empty=True).logits.float().softmax(-1)
    kept = probs.gather(2, target.view(b, 1, 1).expand(b, d, 1)).squeeze(2)
    return (full - kept).masked_fill(~valid, float("-inf"))


def teachers(n_test: int) -> dict:
    backbone, test = text_backbone(), text_data()[1]
    model = SOP(backbone, num_groups=8, tau=0.2, mode="drop")
    out: dict = {"kind": "teachers", "n_test": n_test}
    for tau in (0.05, 0.1, 0.2):
        report = diagnose(model, test, tau=tau, examples=n_test, informed_examples=min(n_test, 100), progress=False)
        out[f"diagnose_{tau}"] = report.to_dict()
        print("\n".join(report.lines()), flush=True)
    batches = _batches(model, test, n_test)
    labels = test.labels[:n_test]
    rankings = {
        "saliency z=0.2,0.6 (the recipe's teacher)": lambda i: mean_saliency(model, i, (0.2, 0.6)),
        "saliency z=0.1..0.9 (5 levels)": lambda i: mean_saliency(model, i, (0.1, 0.3, 0.5, 0.7, 0.9)),
        "occlusion (leave one out)": lambda i: occlusion_scores(model, i),
    }
    for name in ("ig-f", "occlusion-f", "lime-f"):
        baseline = make_baseline(name)
        assert isinstance(baseline, AttributionBaseline)
        rankings[baseline.name] = lambda i, b=baseline: b.scores(model, i, "drop")[:, 0]
    for name, fn in rankings.items():
        start = time.perf_counter()
        out[name] = one_group_accuracy(model, batches, labels, fn)
        print(f"{name}: {out[name]} ({time.perf_counter() - start:.0f} s)", flush=True)
    _append(out)
    return out


@torch.no_grad()
def group_contents(model: SOP, batches, labels: torch.Tensor) -> dict[str, float]:
    """What SOP's groups (τ = model.tau, m = model.num_groups) hold, against the occlusion top word."""
    sums = dict.fromkeys(("top_in_any", "top_in_best_weighted", "groups_with_top", "best_weighted_acc", "oracle"), 0.0)
    n = 0
    start = 0
    for inputs in batches:
        b = inputs.batch_size
        y = labels[start : start + b]
        groups = model.make_groups(inputs)
        out = model.predict_groups(inputs, groups)
        top = occlusion_scores(model, inputs).argmax(-1)  # [B]
        has_top = groups.mask.gather(2, top.view(b, 1, 1).expand(b, groups.mask.shape[1], 1)).squeeze(2)  # [B, m]
        pred = out.logits.argmax(-1)
        weights = out.group_scores[torch.arange(b), pred]  # [B, m]
        best = weights.argmax(-1)
        group_pred = out.group_logits.argmax(-1)  # [B, m]
        sums["top_in_any"] += float(has_top.any(-1).sum())
        sums["top_in_best_weighted"] += float(has_top[torch.arange(b), best].sum())
        sums["groups_with_top"] += float(has_top.sum())
        sums["best_weighted_acc"] += float((group_pred[torch.arange(b), best] == y).sum())
        sums["oracle"] += float((group_pred == y[:, None]).any(-1).sum())
        n += b
        start += b
    return {k: round(v / n, 4) for k, v in sums.items()}


def load_backbone(roberta: str | None):
    """The text demo's MiniLM + head, or the second text model saved at ``roberta``
    (``second_text_model.py``'s ``<out>/backbone``)."""
    if roberta is None:
        return text_backbone()
    from transformers import RobertaForSequenceClassification

    return RobertaForSequenceClassification.from_pretrained(roberta).requires_grad_(False).eval()


def train_row(name: str, seed: int, n_test: int, roberta: str | None = None) -> dict:
    what, sop_options, train_options = ROWS[name]
    backbone, (train_set, test) = load_backbone(roberta), text_data()
    torch.manual_seed(seed)
    model = SOP(backbone, **{"num_groups": 8, "tau": 0.2, "mode": "drop", **sop_options})
    cfg = {**BASE_TRAIN, **train_options}
    n = cfg.pop("n_train")
    start = time.perf_counter()
    train(
        model,
        train_set.subset(torch.arange(n)),
        None,
        resume=False,
        progress=False,
        diagnose=False,
        seed=seed,
        **cfg,
    )
    seconds = time.perf_counter() - start
    model.eval()
    batches = _batches(model, test, n_test)
    labels = test.labels[:n_test]
    res = curves(model, batches, labels, group_counts=COUNTS, m_ref=8, seed=seed)
    contents = group_contents(model, batches, labels)
    row = {
        "kind": "train",
        "row": name if roberta is None else f"{name}@roberta",
        "what": what,
        "seed": seed,
        "n_test": n_test,
        "train_seconds": round(seconds, 1),
        "sop": res["sop"],
        "random": res["random"],
        "distinct_groups": res["distinct_groups"],
        "groups_used": res["groups_used"],
        "group_acc": res["group_acc"],
        **contents,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in sop_options.items()},
        "train": {"n_train": n, **cfg},
    }
    print(json.dumps(row), flush=True)
    _append(row)
    model.save_pretrained(os.path.join(CACHE, "text-research", f"{row['row']}-s{seed}"))
    return row


def table(rows: list[dict]) -> str:
    """The train rows (mean over seeds, latest run of each): SOP / random at m = 8, the group contents."""
    latest = {(r["row"], r["seed"]): r for r in rows if r.get("kind") == "train"}
    names = list(dict.fromkeys(n for n, _ in latest))
    head = (
        "| row | seeds | " + " | ".join(f"τ={t} m=8" for t in TAUS) + " | τ=0.2 m=1 | distinct | top word in a group"
        " | in the most-weighted | groups with it | mean group acc | most-weighted acc | oracle | train s |"
    )
    lines = [head, "|" + "---|" * 15]
    for name in names:
        runs = [r for (n, _), r in latest.items() if n == name]

        def avg(key, sub=None, runs=runs):
            vals = [r[key][sub] if sub else r[key] for r in runs]
            return sum(vals) / len(vals)

        cells = [f"{avg('sop', f'{t}/8'):.3f} / {avg('random', f'{t}/8'):.3f}" for t in TAUS]
        cells.append(f"{avg('sop', '0.2/1'):.3f} / {avg('random', '0.2/1'):.3f}")
        cells += [f"{avg(k):.2f}" for k in ("distinct_groups", "top_in_any", "top_in_best_weighted", "groups_with_top")]
        cells += [f"{avg(k):.3f}" for k in ("group_acc", "best_weighted_acc", "oracle")]
        cells.append(f"{avg('train_seconds'):.0f}")
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("teachers", "train", "table"))
    parser.add_argument("rows", nargs="*", help=f"rows to train: {list(ROWS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test", type=int, default=300, help="test tweets")
    parser.add_argument(
        "--roberta",
        default=None,
        help="train on the second text model saved here (second_text_model.py's <out>/backbone)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.command == "teachers":
        teachers(args.test)
    elif args.command == "train":
        for name in args.rows:
            train_row(name, args.seed, args.test, args.roberta)
    elif os.path.exists(RESULTS):
        with open(RESULTS, encoding="utf-8") as f:
            print(table([json.loads(line) for line in f]))


if __name__ == "__main__":
    main()
