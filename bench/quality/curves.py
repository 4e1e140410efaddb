"""The quality targets of issue #11 measured on one trained SOP: SOP vs random groups over τ × m.

For every inference sparsity τ and group count m (``model.make_groups(inputs, tau, m)``, the same
attention logits re-binarised), SOP's accuracy and the accuracy of m random groups of the same
size combined by the same trained selector (λ = 1, :class:`sopfast.evaluation.baselines.RandomGroups`).
Also: distinct groups of m, the share of group patches on the object (Fashion-MNIST: a patch is
"object" when at least a quarter of its pixels are brighter than 0.1 on the raw [0, 1] scale),
for all groups and for the groups the prediction uses, the mean λ at each τ, the untrained
λ and each single group's own accuracy.

The -F baselines and FRESH do not depend on the SOP model (they use the frozen backbone only):
:func:`baseline_table` computes them once per task and caches them in ``.cache/``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

from sopfast.evaluation import metrics as M
from sopfast.evaluation.evaluate import evaluate
from sopfast.evaluation.methods import SOPMethod, candidate_mask, combine_groups, run_masks, top_tau_masks
from sopfast.model.generator import masked_mean
from sopfast.ops import aggregate

TAUS = (0.05, 0.1, 0.2, 0.4)
GROUP_COUNTS = (1, 5, 20)
OBJECT_THRESHOLD = 0.1  # raw pixel intensity in [0, 1]
OBJECT_FRACTION = 0.25  # of a patch's pixels


def object_patches(x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``[B, d]`` bool: patches of Fashion-MNIST images ``x`` ([-1, 1]) that lie on the garment."""
    raw = (x.float().mean(dim=1, keepdim=True) + 1) / 2
    frac = F.adaptive_avg_pool2d((raw > OBJECT_THRESHOLD).float(), grid)
    return (frac >= OBJECT_FRACTION).flatten(1)


@torch.no_grad()
def curves(
    model,
    inputs_list,
    labels: torch.Tensor,
    taus=TAUS,
    group_counts=GROUP_COUNTS,
    mode: str = "drop",
    seed: int = 0,
    pixels: torch.Tensor | None = None,
    m_ref: int = 20,
    tau_ref: float = 0.2,
) -> dict:
    """SOP vs random groups over ``taus × group_counts`` on prepared batches ``inputs_list``."""
    model.eval()
    method = SOPMethod()
    gen = torch.Generator().manual_seed(seed)
    sop = {(t, m): [] for t in taus for m in group_counts}
    lam1 = {(t, m): [] for t in taus for m in group_counts}
    rnd = {(t, m): [] for t in taus for m in group_counts}
    lam = {t: [] for t in taus}
    extra: dict[str, list] = {
        k: [] for k in ("distinct", "iou", "obj_all", "obj_used", "obj_rand", "group_acc", "used")
    }
    key_f = {t: [] for t in taus}
    start = 0
    for inputs in inputs_list:
        b = inputs.batch_size
        y = labels[start : start + b]
        valid = candidate_mask(model, inputs)
        d = valid.shape[1]
        state = method.prepare(model, inputs, mode)
        obj = None
        if pixels is not None:
            obj = object_patches(pixels[start : start + b], model.adapter.feature_grid(inputs))
        if getattr(model.generator, "key_score", None) is not None:
            # the generator's query-independent key score alone, top-τ as one group (λ = 1)
            emb = state.emb.float()
            if model.generator.center:
                emb = emb - masked_mean(emb, valid)
            key = (emb @ model.generator.key_score.float()).unsqueeze(1)
            for t in taus:
                masks = top_tau_masks(key, valid, t, True)
                kp = combine_groups(model, run_masks(model, inputs, masks, mode), masks, "mean")
                key_f[t].append((kp.logits.argmax(-1) == y).float())
        for m in group_counts:
            scores = torch.rand(b, m, d, generator=gen)
            for t in taus:
                groups = method.groups(model, state, t, True, m)
                out = model.predict_groups(inputs, groups, mode)
                sop[(t, m)].append((out.logits.argmax(-1) == y).float())
                one = aggregate(out.group_scores, torch.ones_like(out.lam), out.group_logits)
                lam1[(t, m)].append((one.argmax(-1) == y).float())
                masks = top_tau_masks(scores, valid, t, True)
                rp = combine_groups(model, run_masks(model, inputs, masks, mode), masks, "selector")
                rnd[(t, m)].append((rp.logits.argmax(-1) == y).float())
                if m == m_ref:
                    lam[t].append(groups.lam.mean(-1))
                if m == m_ref and t == tau_ref:
                    top = out.logits.argmax(-1)
                    used = out.group_scores[torch.arange(b), top] > 0
                    div = M.group_diversity(out.group_masks, valid, used)
                    extra["distinct"].append(div["distinct_groups"])
                    extra["iou"].append(div["pairwise_iou"])
                    extra["used"].append(used.float().sum(-1))
                    extra["group_acc"].append((out.group_logits.argmax(-1) == y[:, None]).float().mean(-1))
                    if obj is not None:
                        gm = out.group_masks.float()
                        on = (gm * obj[:, None].float()).sum(-1) / gm.sum(-1).clamp_min(1)  # [B, m]
                        extra["obj_all"].append(on.mean(-1))
                        u = used.float()
                        extra["obj_used"].append((on * u).sum(-1) / u.sum(-1).clamp_min(1))
                        rm = masks.float()
                        extra["obj_rand"].append(((rm * obj[:, None].float()).sum(-1) / rm.sum(-1)).mean(-1))
        start += b

    def mean(v):
        return round(float(torch.cat(v).mean()), 4) if v else None

    res = {
        "sop": {f"{t}/{m}": mean(v) for (t, m), v in sop.items()},
        "random": {f"{t}/{m}": mean(v) for (t, m), v in rnd.items()},
        "sop_lam1": {f"{t}/{m}": mean(v) for (t, m), v in lam1.items()},
        "lam": {str(t): mean(v) for t, v in lam.items()},
        "key_f": {str(t): mean(v) for t, v in key_f.items()},
        "distinct_groups": mean(extra["distinct"]),
        "pairwise_iou": mean(extra["iou"]),
        "groups_used": mean(extra["used"]),
        "group_acc": mean(extra["group_acc"]),
        "object_share": mean(extra["obj_all"]),
        "object_share_used": mean(extra["obj_used"]),
        "object_share_random": mean(extra["obj_rand"]),
        "n_test": int(labels[:start].numel()),
    }
    res["margin"] = {k: round(res["sop"][k] - res["random"][k], 4) for k in res["sop"]}
    return res


def format_curves(res: dict, taus=TAUS, group_counts=GROUP_COUNTS) -> str:
    """Compact text: SOP/random per (τ, m)."""
    lines = []
    for m in group_counts:
        cells = [
            f"τ={t}: {res['sop'][f'{t}/{m}']:.3f}/{res['random'][f'{t}/{m}']:.3f}({res['sop_lam1'][f'{t}/{m}']:.3f})"
            for t in taus
        ]
        lines.append(f"m={m:>2}  " + "  ".join(cells))
    lines.append(
        f"distinct {res['distinct_groups']}, obj {res['object_share']} (used {res['object_share_used']}, "
        f"random {res['object_share_random']}), group_acc {res['group_acc']}, lam {res['lam']}, key-F {res['key_f']}"
    )
    return "\n".join(lines)


def baseline_table(model, loader, task: str, cache_dir: str, taus=TAUS, names=None) -> dict:
    """Accuracy of the backbone-only baselines at each τ (one group each), cached per task."""
    path = os.path.join(cache_dir, f"baselines_{task}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    names = names or ["ig-f", "occlusion-f", "lime-f", "kernelshap-f", "gxi-f", "gradcam-f", "fresh"]
    res = evaluate(
        model,
        loader,
        metrics=["accuracy", "sparsity"],
        taus=list(taus),
        mode="drop",
        baselines=names,
        progress=False,
        backbone_row=False,
    )
    table = {name: {str(t): v for t, v in r["sparsity"].items()} for name, r in res.items() if name != "SOP"}
    os.makedirs(cache_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=2)
    return table
