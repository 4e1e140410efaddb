"""Why do the demo's groups collapse?  Measurements of a SOP generator on demo data.

On a batch of test inputs (image demo: the cached backbone of ``common.image_backbone``; text
demo: ``common.text_backbone``), untrained or from a checkpoint:

* ``distinct_queries``: how many of the ``m`` query rows have distinct generator embeddings
  (relative L2 distance to every earlier one ≥ 0.01); ``query_min_distance``: the smallest
  relative distance between two of an input's query embeddings; ``queries_on_background``:
  query rows on all-black patches (images);
* ``shared_ranking``: the part of the softmax-relevant logits ``S' = S − rowmean(S)`` that is the
  same for every query row, ``‖1·colmean(S')‖² / ‖S'‖²`` (1: every row ranks the keys alike);
* ``mean_embedding_share``: ``‖μ‖² / mean_j ‖e_j‖²``, ``μ`` the input's mean feature embedding;
  ``top1_direction``: the embeddings' energy on their first singular direction;
* ``logit_std_per_row``, ``attention_max`` (softmax sharpness), ``attention_zero`` (fp32
  underflow), ``lam_mean`` / ``lam_positive`` (λ = 2·Σ_top-τ a − 1 and how often it is > 0);
* the groups: distinct groups, mean pairwise IoU, union coverage.

    python bench/quality/diagnose.py [--task image|text] [--checkpoint DIR] [--gamma 1] [--center] [--queries diverse]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_backbone, image_data, text_backbone, text_data

from sopfast.evaluation import metrics as M
from sopfast.evaluation.baselines import candidate_mask
from sopfast.model.generator import candidate_positions, diverse_positions, masked_mean, query_rows
from sopfast.model.sop import SOP
from sopfast.types import FeatureInputs


def top1_share(x: torch.Tensor) -> torch.Tensor:
    """The fraction of ``‖x‖²`` (``x [d, E]``) on its first singular direction."""
    return torch.linalg.svdvals(x)[0].pow(2) / x.pow(2).sum()


def query_positions(model: SOP, emb: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[N, m]``: the feature each group's query row reads (evaluation, heads stacked)."""
    m = model.num_groups
    if model.generator.queries == "diverse":
        return diverse_positions(emb - masked_mean(emb, valid), valid, m)
    _, cand = query_rows(valid.sum(1), m, model.generator.num_heads, None)
    return candidate_positions(valid).gather(1, cand)


@torch.no_grad()
def measure(model: SOP, inputs: FeatureInputs) -> dict[str, float]:
    """The measurements of the module docstring, averaged over the batch ``inputs``."""
    model.eval()
    emb = model.adapter.embed(model.projection, inputs).float()
    n, _, e = emb.shape
    m = model.num_groups
    valid = candidate_mask(model, inputs)
    qpos = query_positions(model, emb, valid)
    q_emb = emb.gather(1, qpos.unsqueeze(-1).expand(n, m, e))
    dist = torch.cdist(q_emb, q_emb) / q_emb.norm(dim=-1).mean(dim=-1).view(n, 1, 1)
    same_pos = qpos.unsqueeze(2) == qpos.unsqueeze(1)
    earlier = torch.ones(m, m, dtype=torch.bool).tril(-1)
    duplicate = ((dist < 0.01) & earlier).any(dim=-1)
    off = torch.where(same_pos | ~earlier, torch.full_like(dist, float("inf")), dist)
    s = model.generator.logits(emb, valid, m, None)
    s = torch.where(valid.unsqueeze(1), s, torch.zeros_like(s))
    count = valid.sum(-1).view(n, 1, 1).float()
    s_rel = (s - s.sum(-1, keepdim=True) / count) * valid.unsqueeze(1)
    shared = s_rel.mean(dim=1, keepdim=True).expand_as(s_rel) * valid.unsqueeze(1)
    mu = masked_mean(emb, valid).squeeze(1)
    energy = (emb.pow(2).sum(-1) * valid).sum(-1) / valid.sum(-1)
    sv = torch.stack([top1_share(emb[i][valid[i]]) for i in range(n)])
    grid = model.adapter.feature_grid(inputs)
    groups = model.generator.binarise(s, valid, model.tau, grid=grid)
    att = groups.attention
    div = M.group_diversity(groups.mask, valid)
    out = {
        "distinct_queries": float((~duplicate).sum(-1).float().mean()),
        "query_min_distance": float(off.flatten(1).min(-1).values.clamp_max(1e9).mean()),
        "shared_ranking": float((shared.pow(2).sum((1, 2)) / s_rel.pow(2).sum((1, 2))).mean()),
        "mean_embedding_share": float((mu.pow(2).sum(-1) / energy).mean()),
        "top1_direction": float(sv.mean()),
        "logit_std_per_row": float(((s_rel.pow(2).sum(-1) / count.squeeze(-1)).sqrt()).mean()),
        "attention_zero": float(((att == 0) & valid.unsqueeze(1)).sum() / (valid.sum() * m)),
        "attention_max": float(att.max(dim=-1).values.mean()),
        "lam_mean": float(groups.lam.mean()),
        "lam_positive": float((groups.lam > 0).float().mean()),
        **{k: float(div[k].nanmean()) for k in ("distinct_groups", "pairwise_iou", "union_coverage")},
    }
    if inputs.pixels is not None and grid is not None:
        patch = inputs.pixels.shape[-1] // grid[1]
        patches = torch.nn.functional.unfold(inputs.pixels, patch, stride=patch).transpose(1, 2)
        background = (patches <= -0.99).all(dim=-1)
        out["queries_on_background"] = float(background.gather(1, qpos).sum(-1).float().mean())
        out["background_patches"] = float(background.sum(-1).float().mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("image", "text"), default="image")
    parser.add_argument("--checkpoint", default=None, help="a trained SOP (save_pretrained directory)")
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--ties", default="authors")
    parser.add_argument("--center", action="store_true", help="center_embeddings=True")
    parser.add_argument("--queries", default="fixed")
    parser.add_argument("--normalize", action="store_true", help="normalize_logits=True")
    parser.add_argument("--count", type=int, default=200, help="test inputs to measure on")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.task == "image":
        backbone, m = image_backbone(), 20
        x = image_data()[1].x[: args.count]
    else:
        backbone, m = text_backbone(), 8
        x = text_data()[1].encoded
    if args.checkpoint:
        model = SOP.from_pretrained(args.checkpoint, backbone)
    else:
        model = SOP(
            backbone,
            num_groups=m,
            tau=0.2,
            recipe="paper",  # the flags below name every change from the authors' algorithm
            group_gen_scale=args.gamma,
            ties=args.ties,
            center_embeddings=args.center,
            queries=args.queries,
            normalize_logits=args.normalize,
        )
    if args.task == "image":
        inputs = model.prepare(x)
    else:
        inputs = model.prepare(*(x[k][: args.count] for k in ("input_ids", "attention_mask", "token_type_ids")))
    print(json.dumps(measure(model, inputs), indent=2))


if __name__ == "__main__":
    main()
