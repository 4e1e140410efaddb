"""Issue #41: which selector and objective make SOP agree with the backbone it explains.

Every row trains SOP as ``sopfast demo --full`` does (the 0.5.3 default recipe, ``drop``, 20 groups, 12,000
Fashion-MNIST training images, 3 epochs, batch 32) on a backbone trained the ordinary way, changing only
the options it names, then scores it on the first 1,000 test images at τ = 0.2 and 0.1 against random
groups through the same trained selector: accuracy, **agreement** with the backbone's full-input
prediction (and the KL of SOP's class distribution from the backbone's), the generator bound (some group
alone agrees), the selector bound (the label-free "first agreeing group" rule on the method's own groups),
the share of single groups that agree, distinct groups of 20 and the share of group patches on the
garment.  Rows are appended to ``bench/quality/agreement_research.jsonl``; ``--table`` writes them to
``agreement_research.md``; ``--curves`` scores trained rows at m = 1, 5 and 20 (``agreement_curves.jsonl``);
``--misses`` scores SOP alone against the label-free rule, with the selector's misses (a group agrees, SOP
does not: ``agreement_misses.jsonl``); ``--blank`` scores trained image rows at τ = 0.05 … 0.4 with blank
patches ranked last and like any other (``agreement_blank.jsonl``); ``--outline`` scores them at τ = 0.2 and
0.4 also with only the blank patches away from the garment ranked last, and splits the groups' patches into
those on the garment, other lit ones, blank ones bordering a lit one and other blank ones
(``agreement_outline.jsonl``). A row may set the training τ (default 0.2).
The 0.6 default recipe for image classifiers is the row ``prior3-suff4-sal0``; 0.6.1's is
``prior3-suff4-sal0-explore0.5``. On text 0.6.1's default is ``prior3-suff4-sal0`` (text rows keep its overlap
penalty of 2 unless they set one) and 0.6.4's ``prior3-suff4-sal0-div4``.

    python bench/quality/agreement_research.py --rows recipe prior3 --seeds 0 1 [--backbone plain]
    python bench/quality/agreement_research.py --table

Backbones (``--backbone``, each trained once and cached under ``.cache/``): ``plain`` (the demo's 4-layer
ViT, ``common.image_backbone``), ``adapted`` (its ``sopfast adapt`` copy), ``deit`` (a 6-layer DeiT of
width 96, patch 4, trained the same ordinary way), ``cnn`` (a small ResNet-style CNN, ``exact`` mode) and
``minilm`` (the text demo's MiniLM classifier on tweets: 8 groups, 3,000 training tweets, 2 epochs, 500 test
tweets, IG-F and FRESH beside random groups at τ = 0.2) and ``roberta`` (``second_text_model.py``'s RoBERTa,
scored as ``minilm``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    CACHE,
    adapted_image_backbone,
    image_backbone,
    image_data,
    other_image_backbone,
    roberta_backbone,
    text_backbone,
    text_data,
)

from sopfast.adapters.base import FeatureInputs
from sopfast.evaluation.evaluate import evaluate
from sopfast.evaluation.registry import feature_ground_truth
from sopfast.model.sop import SOP
from sopfast.training.trainer import train

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "agreement_research.jsonl")
CURVES = os.path.join(HERE, "agreement_curves.jsonl")
MISSES = os.path.join(HERE, "agreement_misses.jsonl")
BLANK = os.path.join(HERE, "agreement_blank.jsonl")
#: ``--blank``: the τ at which a trained row is scored with blank patches ranked last and like any other.
BLANK_TAUS = (0.05, 0.1, 0.2, 0.4)
OUTLINE = os.path.join(HERE, "agreement_outline.jsonl")
#: ``--outline``: the τ at which a trained row is scored with each :data:`OUTLINE_SETTINGS` ranking.
OUTLINE_TAUS = (0.2, 0.4)
#: ``--outline``: (record key, table words) of the blank patches each setting ranks last.
OUTLINE_SETTINGS = (("demote", "all"), ("far", "those not bordering a lit patch"), ("keep", "none"))
#: ``--outline``: (record key, table words) of the four places a group's patch can lie.
PLACES = (
    ("garment", "on the garment"),
    ("lit_off_garment", "lit, off the garment"),
    ("blank_bordering", "blank, bordering a lit patch"),
    ("blank_far", "blank, farther"),
)
#: ``--curves``: accuracy of SOP and random groups at these group counts (m = 1: one group, no selection).
CURVE_COUNTS = (1, 5, 20)
TAUS = (0.2, 0.1)
TEST_IMAGES = 1000
TRAIN_IMAGES = 12000
METRICS = ["accuracy", "agreement", "bounds", "diversity", "grounding"]

#: The 0.5.3 default recipe's options that 0.6 changed: every row is written over them, so that a row means
#: the same with either version's default.
RECIPE_053 = {"saliency_weight": 1.0, "agreement_prior": 0.0, "sufficiency_weight": 0.0, "explore": 0.0}
#: The text recipe's option that 0.6.4 changed (the overlap penalty, 2 → 4): text rows are written over it too.
TEXT_RECIPE_063 = {"diversity_weight": 2.0}
#: The options of the 0.6 image default (the row ``prior3-suff4-sal0``), which many rows build on.
DEFAULT_06 = {"agreement_prior": 3.0, "sufficiency_weight": 4.0, "saliency_weight": 0.0}
# name: (what it tests, SOP options over the 0.5.3 recipe, options set only for the evaluation)
ROWS: dict[str, tuple[str, dict, dict]] = {
    "recipe": ("the default recipe of 0.5.3", {}, {}),
    "recipe+prior3-eval": (
        "the 0.5.3 recipe's model, agreement prior 3 added at inference only",
        {},
        {"agreement_prior": 3.0},
    ),
    "prior3": ("agreement prior 3 (training and inference)", {"agreement_prior": 3.0}, {}),
    "prior3-suff1": ("agreement prior 3 + sufficiency 1", {"agreement_prior": 3.0, "sufficiency_weight": 1.0}, {}),
    "prior3-distill1": ("agreement prior 3 + distillation 1", {"agreement_prior": 3.0, "distill_weight": 1.0}, {}),
    "suff1": ("sufficiency 1 (no prior)", {"sufficiency_weight": 1.0}, {}),
    "distill1": ("distillation 1 (no prior)", {"distill_weight": 1.0}, {}),
    "prior3-suff1-div16": (
        "agreement prior 3 + sufficiency 1, overlap penalty 16 (the recipe's 8 doubled)",
        {"agreement_prior": 3.0, "sufficiency_weight": 1.0, "diversity_weight": 16.0},
        {},
    ),
    "prior3-suff1-sal0": (
        "agreement prior 3 + sufficiency 1, no saliency teacher (one teacher for every row pulls the groups together)",
        {"agreement_prior": 3.0, "sufficiency_weight": 1.0, "saliency_weight": 0.0},
        {},
    ),
    "prior3-suff1-sal0.25": (
        "agreement prior 3 + sufficiency 1, saliency teacher at a quarter of its weight",
        {"agreement_prior": 3.0, "sufficiency_weight": 1.0, "saliency_weight": 0.25},
        {},
    ),
    "prior3-suff4": (
        "agreement prior 3 + sufficiency 4, the 0.5.3 saliency teacher kept",
        {"agreement_prior": 3.0, "sufficiency_weight": 4.0},
        {},
    ),
    "prior3-suff2-sal0": (
        "agreement prior 3 + sufficiency 2, no saliency teacher",
        {"agreement_prior": 3.0, "sufficiency_weight": 2.0, "saliency_weight": 0.0},
        {},
    ),
    "prior3-suff4-sal0": (
        "agreement prior 3 + sufficiency 4, no saliency teacher",
        DEFAULT_06,
        {},
    ),
    "prior3-suff4-sal0+prior10-eval": (
        "the 0.6 image default's (0.6.1 text default's) model, its agreement prior raised from 3 to 10 at "
        "inference only",
        DEFAULT_06,
        {"agreement_prior": 10.0},
    ),
    "prior10-suff4-sal0": (
        "agreement prior 10 (training and inference) + sufficiency 4, no saliency teacher",
        {"agreement_prior": 10.0, "sufficiency_weight": 4.0, "saliency_weight": 0.0},
        {},
    ),
    "prior3-suff8-sal0": (
        "agreement prior 3 + sufficiency 8, no saliency teacher",
        {"agreement_prior": 3.0, "sufficiency_weight": 8.0, "saliency_weight": 0.0},
        {},
    ),
    "prior3-suff4-sal0-explore0.5": (
        "the 0.6 default + exploration 0.5 (Gumbel noise on the generator's logits when training picks the groups)",
        {**DEFAULT_06, "explore": 0.5},
        {},
    ),
    "prior3-suff4-sal0-explore0.5+prior10-eval": (
        "the 0.6.1 default's model, its agreement prior raised from 3 to 10 at inference only (a selector that "
        "leans harder on the groups that agree)",
        {**DEFAULT_06, "explore": 0.5},
        {"agreement_prior": 10.0},
    ),
    "prior3-suff4-sal0-explore0.5-keepblank": (
        "the 0.6.1 default with blank patches ranked like any other (demote_blank off), as random groups "
        "keep them: can the groups show the backbone the garment's outline",
        {
            **DEFAULT_06,
            "explore": 0.5,
            "demote_blank": False,
        },
        {},
    ),
    "prior3-suff4-sal0-explore0.5-tau0.4": (
        "the 0.6.1 default trained at τ = 0.4, as the diagnostic advises for a fragile backbone",
        {**DEFAULT_06, "explore": 0.5, "tau": 0.4},
        {},
    ),
    "prior3-suff4-sal0-explore0.5-keepblank-tau0.4": (
        "the 0.6.1 default trained at τ = 0.4 with blank patches ranked like any other (--no-demote-blank)",
        {
            **DEFAULT_06,
            "explore": 0.5,
            "demote_blank": False,
            "tau": 0.4,
        },
        {},
    ),
    "prior3-suff4-sal0-explore1": (
        "the 0.6 default + exploration 1 (at 1 each group is a Plackett–Luce draw from the attention)",
        {**DEFAULT_06, "explore": 1.0},
        {},
    ),
    "prior3-suff8-sal0-explore0.5": (
        "agreement prior 3 + sufficiency 8, no teacher, Gumbel exploration 0.5",
        {"agreement_prior": 3.0, "sufficiency_weight": 8.0, "saliency_weight": 0.0, "explore": 0.5},
        {},
    ),
    "prior3-suff4-sal0-div2-explore0.5": (
        "agreement prior 3 + sufficiency 4, no teacher, overlap penalty 2, Gumbel exploration 0.5",
        {
            **DEFAULT_06,
            "diversity_weight": 2.0,
            "explore": 0.5,
        },
        {},
    ),
    "prior3-suff4-sal0-div4": (
        "the 0.6.1 text default (prior 3, sufficiency 4, no teacher) with an overlap penalty of 4, text's 2 doubled",
        {**DEFAULT_06, "diversity_weight": 4.0},
        {},
    ),
    "prior3-suff4-sal0-div4+prior10-eval": (
        "the 0.6.4 text default's model, its agreement prior raised from 3 to 10 at inference only",
        {**DEFAULT_06, "diversity_weight": 4.0},
        {"agreement_prior": 10.0},
    ),
    "prior3-suff4-sal0-div8": (
        "the 0.6.1 text default with an overlap penalty of 8, the image recipe's",
        {**DEFAULT_06, "diversity_weight": 8.0},
        {},
    ),
    "prior3-suff1-div32": (
        "agreement prior 3 + sufficiency 1, overlap penalty 32",
        {"agreement_prior": 3.0, "sufficiency_weight": 1.0, "diversity_weight": 32.0},
        {},
    ),
}
#: The text demo's setting (``sopfast demo --task text``): 8 groups, 3,000 training tweets, 2 epochs of 16,
#: 500 test tweets, and the baselines its targets name besides random groups.
TEXT = {
    "groups": 8,
    "train": 3000,
    "epochs": 2,
    "batch_size": 16,
    "test": 500,
    "baselines": ["random", "ig-f", "fresh"],
}
#: The backbones scored on :data:`TEXT`'s tweets.
TEXT_BACKBONES = ("minilm", "roberta")
BACKBONES = {
    "minilm": text_backbone,
    "roberta": roberta_backbone,
    "plain": image_backbone,
    "adapted": adapted_image_backbone,
    "deit": lambda: other_image_backbone("deit"),
    "cnn": lambda: other_image_backbone("cnn"),
}


def trained_model(backbone_name: str, row: str, seed: int) -> tuple[SOP, float]:
    """SOP on the named backbone with ``row``'s options, trained as the demo trains it (cached by run folder)."""
    options = ROWS[row][1]
    train_row = next(name for name, (_, o, _) in ROWS.items() if o == options)  # rows that differ only at eval
    backbone = BACKBONES[backbone_name]()
    text = backbone_name in TEXT_BACKBONES
    torch.manual_seed(seed)
    earlier = {**RECIPE_053, **(TEXT_RECIPE_063 if text else {})}
    model = SOP(backbone, num_groups=TEXT["groups"] if text else 20, **{"tau": 0.2, **earlier, **options})
    run = os.path.join(CACHE, "agreement", f"{backbone_name}-{train_row}-s{seed}")
    weights = os.path.join(run, "final.pt")
    seconds = 0.0
    if os.path.exists(weights):
        model.load_state_dict(torch.load(weights))
    else:
        if text:
            train_set, _ = text_data()
            data = train_set.subset(torch.arange(TEXT["train"]))
            epochs, batch_size = TEXT["epochs"], TEXT["batch_size"]
        else:
            train_data, _ = image_data()
            data = torch.utils.data.TensorDataset(train_data.x[-TRAIN_IMAGES:], train_data.y[-TRAIN_IMAGES:])
            epochs, batch_size = 3, 32
        start = time.perf_counter()
        train(
            model,
            data,
            None,
            epochs=epochs,
            batch_size=batch_size,
            output_dir=run,
            resume=False,
            seed=seed,
            diagnose=False,
        )
        seconds = time.perf_counter() - start
        torch.save(model.state_dict(), weights)
    return model, seconds


def scored_model(backbone_name: str, row: str, seed: int) -> tuple[SOP, float]:
    """:func:`trained_model` with ``row``'s options set only for the evaluation applied."""
    model, seconds = trained_model(backbone_name, row, seed)
    for name, value in ROWS[row][2].items():
        setattr(model, name, value)
    return model, seconds


def scored_loader(backbone_name: str, object_masks: bool = False) -> torch.utils.data.DataLoader:
    """The scored test split: the first :data:`TEXT` ``["test"]`` tweets for the text backbones, else the first
    :data:`TEST_IMAGES` images (with their object masks as a third element when ``object_masks``)."""
    if backbone_name in TEXT_BACKBONES:
        _, texts = text_data()
        return torch.utils.data.DataLoader(texts.subset(torch.arange(TEXT["test"])), batch_size=50)
    _, test = image_data()
    x, y = test.x[:TEST_IMAGES], test.y[:TEST_IMAGES]
    if object_masks:
        from sopfast.data.object_masks import ObjectMasks

        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, y, ObjectMasks().from_pixels(x)), batch_size=100
        )
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=100)


def run_row(backbone_name: str, row: str, seed: int) -> dict:
    """Train (or load) and score one row; the record appended to :data:`RESULTS`."""
    model, seconds = scored_model(backbone_name, row, seed)
    record = {"backbone": backbone_name, "row": row, "seed": seed, "train_seconds": seconds, "mode": model.mode}
    if backbone_name in TEXT_BACKBONES:
        loader = scored_loader(backbone_name)
        for tau in TAUS:
            model.tau = tau
            baselines = TEXT["baselines"] if tau == 0.2 else ["random"]
            record[f"tau={tau:g}"] = evaluate(model, loader, METRICS[:-1], baselines=baselines, progress=False)
    else:
        loader = scored_loader(backbone_name, object_masks=True)
        for tau in TAUS:
            model.tau = tau
            results = evaluate(model, loader, METRICS, ground_truth_key=2, baselines=["random"], progress=False)
            record[f"tau={tau:g}"] = results
    record["threads"] = torch.get_num_threads()
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return record


def run_curves(backbone_name: str, row: str, seed: int) -> dict:
    """Accuracy of a trained row (and random groups through its selector) at τ ∈ :data:`TAUS` and
    m ∈ :data:`CURVE_COUNTS`: with one group there is nothing to select, so the groups alone compare."""
    model, _ = scored_model(backbone_name, row, seed)
    loader = scored_loader(backbone_name)
    results = evaluate(
        model, loader, ["curves"], baselines=["random"], progress=False, curve_taus=TAUS, curve_counts=CURVE_COUNTS
    )
    record = {
        "backbone": backbone_name,
        "row": row,
        "seed": seed,
        **{m: results[m]["curves"] for m in ("SOP", "Random")},
    }
    with open(CURVES, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return record


def run_misses(backbone_name: str, row: str, seed: int) -> dict:
    """SOP of a trained row alone at τ ∈ :data:`TAUS`: accuracy, agreement and the ``bounds`` metric, whose
    ``selector_misses`` are the inputs where one of its groups agrees with the backbone and SOP does not."""
    model, _ = scored_model(backbone_name, row, seed)
    loader = scored_loader(backbone_name)
    record: dict = {"backbone": backbone_name, "row": row, "seed": seed}
    for tau in TAUS:
        model.tau = tau
        record[f"tau={tau:g}"] = evaluate(model, loader, ["accuracy", "agreement", "bounds"], progress=False)["SOP"]
    with open(MISSES, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return record


def run_blank(backbone_name: str, row: str, seed: int) -> dict:
    """SOP of a trained image row at τ ∈ :data:`BLANK_TAUS`, once with blank patches ranked last
    (``demote_blank``, the recipe's) and once ranked like any other, whatever the row trained with: accuracy,
    agreement, the generator bound and the share of the groups' patches on the garment."""
    model, _ = scored_model(backbone_name, row, seed)
    loader = scored_loader(backbone_name, object_masks=True)
    record: dict = {"backbone": backbone_name, "row": row, "seed": seed}
    metrics = ["accuracy", "agreement", "bounds", "grounding"]
    for demote in (True, False):
        model.demote_blank = demote
        for tau in BLANK_TAUS:
            model.tau = tau
            results = evaluate(model, loader, metrics, ground_truth_key=2, progress=False)["SOP"]
            record[f"{'demote' if demote else 'keep'} tau={tau:g}"] = results
    with open(BLANK, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return record


def bordering_lit(blank: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``[B, d]`` bool: the features with a non-``blank`` one among their 8 grid neighbours (``blank [B, d]``,
    ``d = h·w`` for ``grid = (h, w)``)."""
    lit = (~blank).float().view(-1, 1, *grid)
    return F.max_pool2d(lit, 3, stride=1, padding=1).flatten(1) > 0


def far_blank(model: SOP, inputs: FeatureInputs) -> torch.Tensor:
    """``[B, d]`` bool: the adapter's blank features that do not border a lit one (``--outline``'s ``far``)."""
    blank = model.adapter.blank_features(inputs)
    return blank & ~bordering_lit(blank, model.adapter.feature_grid(inputs))


@torch.no_grad()
def patch_places(model: SOP, loader: torch.utils.data.DataLoader) -> dict[str, float]:
    """Mean over the examples (and their groups) of the share of a group's patches in each of :data:`PLACES`;
    ``loader`` yields ``(images, labels, object masks)``."""
    totals = torch.zeros(len(PLACES))
    for x, _, masks in loader:
        inputs = model.prepare(x)
        groups = model.make_groups(inputs).mask.float()
        on = feature_ground_truth(model, inputs, masks)
        blank = model.adapter.blank_features(inputs)
        near = bordering_lit(blank, model.adapter.feature_grid(inputs))
        size = groups.sum(-1).clamp_min(1)
        for i, where in enumerate((on, ~on & ~blank, blank & near, blank & ~near)):
            totals[i] += ((groups * where.unsqueeze(1)).sum(-1) / size).mean(1).sum()
    return {key: float(v) / len(loader.dataset) for (key, _), v in zip(PLACES, totals)}


def run_outline(backbone_name: str, row: str, seed: int) -> dict:
    """SOP of a trained image row at τ ∈ :data:`OUTLINE_TAUS` with each :data:`OUTLINE_SETTINGS` ranking of
    blank patches: accuracy, agreement, the share on the garment and :func:`patch_places`."""
    model, _ = scored_model(backbone_name, row, seed)
    model.eval()
    loader = scored_loader(backbone_name, object_masks=True)
    record: dict = {"backbone": backbone_name, "row": row, "seed": seed}
    metrics = ["accuracy", "agreement", "grounding"]
    for setting, _ in OUTLINE_SETTINGS:
        model.demote_blank = setting != "keep"
        if setting == "far":
            model.demoted = lambda inputs: far_blank(model, inputs)
        for tau in OUTLINE_TAUS:
            model.tau = tau
            results = evaluate(model, loader, metrics, ground_truth_key=2, progress=False)
            record[f"{setting} tau={tau:g}"] = {**results["SOP"], **patch_places(model, loader)}
        if setting == "far":
            del model.demoted
    with open(OUTLINE, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return record


OUTLINE_COLUMNS = (("accuracy", "acc."), ("agreement", "agrees"), *PLACES)


def outline_table(path: str = OUTLINE) -> str:
    """``--outline`` records: mean and range over the seeds of each (backbone, row), setting and τ."""
    title = (
        "Where the groups' patches lie (`--outline`; blank patches ranked last: all, the recipe's; those not "
        "bordering a lit patch; none)"
    )
    return _settings_table(path, title, "blank patches ranked last", OUTLINE_SETTINGS, OUTLINE_TAUS, OUTLINE_COLUMNS)


BLANK_COLUMNS = (("accuracy", "acc."), ("agreement", "agrees"), ("on_object", "on object"))


def blank_table(path: str = BLANK) -> str:
    """Trained rows scored with and without blank patches ranked last (``--blank`` records): mean and range
    over the seeds of each (backbone, row), at each τ."""
    title = "Blank patches at inference (`--blank`; `ranked last`: `demote_blank`, the recipe's; `like any other`: off)"
    settings = (("demote", "ranked last"), ("keep", "like any other"))
    return _settings_table(path, title, "blank patches", settings, BLANK_TAUS, BLANK_COLUMNS)


def _settings_table(
    path: str,
    title: str,
    setting_head: str,
    settings: tuple[tuple[str, str], ...],
    taus: tuple[float, ...],
    columns: tuple[tuple[str, str], ...],
) -> str:
    """A row per (backbone, row) of ``path``'s records and per (record key, words) of ``settings``: each
    column's mean and range over the seeds at each τ (the records' ``"<key> tau=<τ>"`` entries)."""
    out = [
        f"\n{title}, at τ = " + ", ".join(f"{t:g}" for t in taus) + "\n",
        f"| backbone | row | seeds | {setting_head} | "
        + " | ".join(f"{label}, τ = {t:g}" for t in taus for _, label in columns)
        + " |",
        "|" + "---|" * (4 + len(taus) * len(columns)),
    ]
    for (backbone, row), records in sorted(_by_row(path).items()):
        for setting, words in settings:
            cells = _metric_cells(records, [f"{setting} tau={t:g}" for t in taus], columns)
            out.append(f"| {backbone} | {row} | {_seeds(records)} | {words} | {' | '.join(cells)} |")
    return "\n".join(out)


MISSES_COLUMNS = (
    ("accuracy", "SOP acc."),
    ("selector_bound", "label-free rule"),
    ("agreement", "agrees"),
    ("generator_bound", "gen. bound"),
    ("selector_misses", "selector misses"),
)


def misses_table(path: str = MISSES) -> str:
    """SOP against the label-free rule and the selector's misses (``--misses`` records): mean and range over
    the seeds of each (backbone, row), at each τ."""
    rows = _by_row(path)
    keys = [f"tau={tau:g}" for tau in TAUS]
    head = " | ".join(f"{label}, τ = {k[4:]}" for k in keys for _, label in MISSES_COLUMNS)
    out = [
        "\nSOP against the label-free rule on its own groups (`--misses`; selector misses: a group agrees with "
        "the backbone, SOP does not)\n",
        f"| backbone | row | seeds | {head} |",
        "|" + "---|" * (3 + len(keys) * len(MISSES_COLUMNS)),
    ]
    for (backbone, row), records in sorted(rows.items()):
        cells = _metric_cells(records, keys, MISSES_COLUMNS)
        out.append(f"| {backbone} | {row} | {_seeds(records)} | {' | '.join(cells)} |")
    return "\n".join(out)


HEADER = (
    "Written by `python bench/quality/agreement_research.py --table` from `agreement_research.jsonl`. Each row "
    "trains SOP as `sopfast demo --full` does on a backbone trained the ordinary way (`plain`: the demo's ViT; "
    "`adapted`: its `sopfast adapt` copy; `deit`: a 6-layer DeiT of width 96; `cnn`: an HF ResNet of two basic "
    "stages; `minilm`: the text demo's MiniLM classifier, 8 groups, 500 test tweets; `roberta`: "
    "`second_text_model.py`'s RoBERTa, scored as `minilm`) and scores it on 1,000 "
    "test images; `recipe` is 0.5.3's default, every other row names what it changes. SOP and random groups "
    "go through the same trained selector (with the row's agreement prior). Cells: mean (min–max) over the "
    "seeds listed; 2-core machine shared with other jobs, one thread per run.\n"
)


COLUMNS = (
    ("accuracy", "acc."),
    ("agreement", "agree"),
    ("agreement_kl", "KL"),
    ("generator_bound", "gen. bound"),
    ("selector_bound", "sel. bound"),
    ("one_group_agrees", "one group agrees"),
)


def _by_row(path: str) -> dict[tuple[str, str], list[dict]]:
    """The JSON-lines records of ``path`` grouped by (backbone, row), each group by seed."""
    rows: dict[tuple[str, str], list[dict]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            rows.setdefault((r["backbone"], r["row"]), []).append(r)
    return {key: sorted(records, key=lambda r: r["seed"]) for key, records in rows.items()}


def table(path: str = RESULTS) -> str:
    """Mean and range over seeds of each (backbone, row): SOP and random groups at each τ."""
    rows = _by_row(path)
    out = []
    for tau in TAUS:
        key = f"tau={tau:g}"
        head = " | ".join(f"SOP {label} | random {label}" for _, label in COLUMNS)
        out += [f"\nτ = {tau:g}\n", f"| backbone | row | seeds | {head} | distinct | on object |"]
        out.append("|" + "---|" * (3 + 2 * len(COLUMNS) + 2))
        for (backbone, row), records in sorted(rows.items()):
            cells = []
            for metric, _ in COLUMNS:
                for method in ("SOP", "Random"):
                    cells.append(_cell([r[key][method].get(metric) for r in records]))
            distinct = _cell([r[key]["SOP"].get("distinct_groups") for r in records], 1)
            on_object = _cell([r[key]["SOP"].get("on_object") for r in records])
            out.append(f"| {backbone} | {row} | {_seeds(records)} | {' | '.join(cells)} | {distinct} | {on_object} |")
    return "\n".join(out)


def curves_table(path: str = CURVES) -> str:
    """SOP's and random groups' accuracy at each τ and group count m (``--curves`` records): mean and range
    over the seeds of each (backbone, row); with m = 1 there is nothing to select, so the groups alone compare."""
    rows = _by_row(path)
    keys = [f"{tau:g}/{m}" for tau in TAUS for m in CURVE_COUNTS]
    head = " | ".join(f"τ = {k.split('/')[0]}, m = {k.split('/')[1]}" for k in keys)
    out = [
        "\nAccuracy over the group count m (`--curves`; SOP / random groups through the same selector)\n",
        f"| backbone | row | seeds | {head} |",
        "|" + "---|" * (3 + len(keys)),
    ]
    for (backbone, row), records in sorted(rows.items()):
        cells = [f"{_cell([r['SOP'][k] for r in records])} / {_cell([r['Random'][k] for r in records])}" for k in keys]
        out.append(f"| {backbone} | {row} | {_seeds(records)} | {' | '.join(cells)} |")
    return "\n".join(out)


def _seeds(records: list[dict]) -> str:
    """The seeds of a (backbone, row)'s records, as a table cell."""
    return ",".join(str(r["seed"]) for r in records)


def _metric_cells(records: list[dict], keys: list[str], columns: tuple[tuple[str, str], ...]) -> list[str]:
    """One :func:`_cell` per key and column: the metric's mean and range over ``records``' ``record[key]``."""
    return [_cell([r[k].get(metric) for r in records]) for k in keys for metric, _ in columns]


def _cell(values: list, digits: int = 3) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=[])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--backbone", choices=list(BACKBONES), default="plain")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--curves", action="store_true", help="accuracy over m = 1, 5, 20 of trained rows instead")
    parser.add_argument("--misses", action="store_true", help="SOP against the label-free rule, its selector's misses")
    parser.add_argument("--blank", action="store_true", help="trained rows with and without blank patches ranked last")
    parser.add_argument("--outline", action="store_true", help="where trained rows' group patches lie, blank or not")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for row in args.rows:
        for seed in args.seeds:
            studies = {"curves": run_curves, "misses": run_misses, "blank": run_blank, "outline": run_outline}
            chosen = [run for name, run in studies.items() if getattr(args, name)]
            if chosen:
                run = chosen[0]
                print(run(args.backbone, row, seed), flush=True)
                continue
            record = run_row(args.backbone, row, seed)
            sop, rnd = record["tau=0.2"]["SOP"], record["tau=0.2"]["Random"]
            print(
                f"{args.backbone} {row} seed {seed}: SOP acc {sop['accuracy']:.3f} agree {sop['agreement']:.3f} "
                f"| random acc {rnd['accuracy']:.3f} agree {rnd['agreement']:.3f} (tau 0.2)",
                flush=True,
            )
    if args.table:
        tables = [table(), curves_table(), misses_table(), blank_table(), outline_table()]
        text = "# Issue #41: the agreement research, every row and seed\n\n" + HEADER + "\n".join(tables)
        with open(os.path.join(HERE, "agreement_research.md"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(text)


if __name__ == "__main__":
    main()
