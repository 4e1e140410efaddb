"""Named settings of an SOP model: its generator options and its training defaults, in one word.

``"paper"`` is the authors' algorithm exactly (what :meth:`sopfast.SOP.from_authors` and the parity
tests use, and what ``mode="exact"`` then reproduces).  ``"sopfast"``, the default, is the winner of the
group-quality research (``docs/quality.md``, "Research (issue #11)"; ``FINAL`` in
``bench/quality/sweep.py``) and, on image classifiers, of the agreement research (issue #41,
``bench/quality/agreement_research.py``).  What each setting fixes:
``normalize_logits`` with ``group_gen_scale`` 2 stops training from saturating the softmax (λ rewarded
inflated logits, after which the attention underflowed and the groups froze); ``center_embeddings``
removes the mean embedding, a direction that ranked the features alike in every row;
``queries="diverse"`` takes the query rows by farthest-point sampling so that they differ;
``key_score`` adds a query-independent score ``v·e_j`` so that the generator can rank a feature high in
every group (without it nothing can teach usefulness to centred, diverse rows); ``diversity_weight`` 8
penalises the overlap of the attention rows; ``unit_lambda`` predicts with λ = 1 (λ < 1 at small τ shrank or
flipped the groups' logits) while λ's gradient still trains the generator; ``demote_blank`` ranks
all-background patches last; ``keep_special_tokens`` (text backbones with special tokens only, see
:data:`REQUIRES`) keeps [CLS]/[SEP] out of the groups but in every group pass (with the earlier recipe 28 %
of the groups held [CLS]); training at lr 1e-3 (text: 5e-4) with 5 % warm-up, as in the research.

Image classifiers (issue #41): ``agreement_prior`` 3 weights the groups that alone make the backbone
predict what it predicts on the whole input (SOP agreed with the demo's ordinary ViT on 72–73 % of the test
images before, on 94–96 % with it), and ``sufficiency_weight`` 4 trains every group towards that; the
saliency teacher of 0.5 (``saliency_weight`` 1, a 2-level presence gradient) is off: with the prior it
made the groups overlap (pairwise IoU 0.48 against 0.17 without it) and cost a backward pass per level.
``explore`` 0.5 (0.6.1) picks each group in training from the logits plus Gumbel noise, so that the
sufficiency term rewards groups near the current ones: at τ = 0.1, below the training τ, SOP then scores
0.821–0.828 on the demo's ViT over 3 seeds (0.752–0.811 without it).
On text the agreement prior and the sufficiency term are on and the saliency teacher off since 0.6.1 (on the
MiniLM classifier, 2 seeds: agreement 94.8–98.6 % against 89.2 % for 0.6's 5-level teacher, 6.7–7.6
distinct groups of 8, half the training time) and no exploration (unmeasured there); a teacher given
explicitly averages five levels (0.1 … 0.9). The overlap penalty on text is 4 since 0.6.4. Issue #34 had set
2, with the teacher (a tweet has too few words for 8 groups kept apart at 8); without it, at 2, the groups
became one on MiniLM at one training seed of three (1.05 distinct of 8, SOP 0.676), and at 4 that seed keeps
7.8 distinct groups and scores 0.840 (docs/quality.md, "Text: when the groups collapse"). Since 0.7.0 the text
selector's prior is 10 at inference and stays 3 in training (``train_agreement_prior``): on MiniLM over 5 training
seeds SOP then scores 0.836–0.844 where a prior of 3 at inference scored 0.826–0.844, and on RoBERTa the same
(trained with 10, 0.6.1's text groups collapsed at one seed of two). A regressor keeps
the 2-level teacher (the agreement options compare classes) and no exploration (unmeasured).

The execution mode is part of the recipe too (``SOP(mode=None)``, the default, from Python and the
command line alike): ``"paper"`` runs ``exact``, the authors' algorithm; ``"sopfast"`` runs ``drop``
where the backbone supports it (ViT, DeiT, DINOv2, BERT-style text), else ``exact``.  ``drop`` is the
library's point (about 5× fewer tokens per group) and it is the trained model's own function: the
selector and the generator learn on the groups' ``drop`` outputs, so a model trained in ``drop`` is
explained by ``drop`` (for BERT-style text it equals ``exact``; for a ViT it is a different function,
measured in the README).  The explainers of :mod:`sopfast.masking` explain the *backbone* instead, whose
function is ``exact``, so they default to its faithful mode.

An option given explicitly to :class:`sopfast.SOP` (or a training option to :func:`sopfast.train`)
wins over the recipe; a checkpoint saves the resolved values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..checks import check_bool, check_choice, check_levels, check_number

RecipeName = Literal["sopfast", "paper"]
DEFAULT_RECIPE: RecipeName = "sopfast"
SALIENCY_LOSSES = ("align", "kl")
SWITCHES = ("normalize_logits", "center_embeddings", "key_score", "unit_lambda", "demote_blank", "keep_special_tokens")


@dataclass(frozen=True)
class Recipe:
    """``model``: :class:`sopfast.SOP` keyword defaults; ``training``: :func:`sopfast.train` defaults."""

    name: str
    description: str
    model: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    training_by_modality: dict[str, dict[str, Any]] = field(default_factory=dict)
    mode: str = "exact"
    model_by_modality: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_by_task: dict[str, dict[str, Any]] = field(default_factory=dict)

    def default_mode(self, adapter: Any) -> str:
        """The execution mode of a model built without ``mode=``: the recipe's, where the backbone's
        ``adapter`` runs it (``drop`` falls back to ``exact`` for CNNs, Swin …)."""
        return self.mode if self.mode in adapter.supported_modes else "exact"

    def model_for(self, modality: str | None, task: str = "classification") -> dict[str, Any]:
        """The model options, with those of ``modality`` ("image", "text") and then of ``task``
        ("classification", "regression") where they have their own."""
        return {**self.model, **self.model_by_modality.get(modality or "", {}), **self.model_by_task.get(task, {})}

    def training_for(self, modality: str | None) -> dict[str, Any]:
        """The training defaults, with those of ``modality`` ("image", "text") where it has its own."""
        return {**self.training, **self.training_by_modality.get(modality or "", {})}


RECIPES: dict[str, Recipe] = {
    "paper": Recipe(
        "paper",
        "the authors' algorithm: raw attention logits scaled by γ = 1, fixed query rows floor(j·d/m), the paper's "
        "loss; lr 5e-6 (their ImageNet setting)",
        model={
            "group_gen_scale": 1.0,
            "normalize_logits": False,
            "center_embeddings": False,
            "queries": "fixed",
            "diversity_weight": 0.0,
            "saliency_weight": 0.0,
            "saliency_loss": "align",
            "saliency_levels": None,
            "key_score": False,
            "unit_lambda": False,
            "demote_blank": False,
            "keep_special_tokens": False,
            "agreement_prior": 0.0,
            "train_agreement_prior": None,
            "sufficiency_weight": 0.0,
            "distill_weight": 0.0,
            "explore": 0.0,
        },
        training={"lr": 5e-6, "warmup_ratio": 0.0},
    ),
    "sopfast": Recipe(
        "sopfast",
        "standardised attention logits at γ = 2, centred embeddings, diverse query rows, a key score, an "
        "attention-overlap penalty of 8, λ = 1 in the prediction, blank features ranked last, an agreement prior of "
        "3, a sufficiency term of 4 and exploration 0.5 in training (text: [CLS]/[SEP] always kept, never grouped; "
        "overlap penalty 4, agreement prior 10 at inference and 3 in training, no exploration; regression: KL to a "
        "2-level saliency, no exploration); lr 1e-3 (text "
        "5e-4) with 5 % warm-up",
        model={
            "group_gen_scale": 2.0,
            "normalize_logits": True,
            "center_embeddings": True,
            "queries": "diverse",
            "diversity_weight": 8.0,
            "saliency_weight": 0.0,
            "saliency_loss": "kl",
            "saliency_levels": (0.2, 0.6),
            "key_score": True,
            "unit_lambda": True,
            "demote_blank": True,
            "keep_special_tokens": True,
            "agreement_prior": 3.0,
            "train_agreement_prior": None,
            "sufficiency_weight": 4.0,
            "distill_weight": 0.0,
            "explore": 0.5,
        },
        training={"lr": 1e-3, "warmup_ratio": 0.05},
        mode="drop",
        # issue #34 (docs/quality.md, "Issue #34"): at 1e-3 the text groups overlapped (4.7 distinct of 8, row
        # sal5-div2-lr1e-3), so text keeps 5e-4
        training_by_modality={"text": {"lr": 5e-4}},
        # issue #34 (docs/quality.md, "Issue #34"): with the teacher an overlap penalty of 8 kept the few words of
        # a tweet from being shared by the groups, so text had 2; 0.6.4 (issue #41): 4, as at 2 MiniLM's groups
        # collapsed at seed 2; 0.7.0: the prior 10 at inference, 3 in training (over 5 MiniLM seeds the selector
        # then misses the agreeing group on at most 0.2 % of the tweets); a teacher, if given, averages 5 levels
        # (the 2-level one ranks words worse than IG-F). Issue #41 (0.6.1, docs/quality.md "Text: the agreement
        # options on MiniLM"): the prior and sufficiency without the teacher agree with MiniLM on 94.8–98.6 % of
        # 500 tweets (the teacher recipe 89.2 %), 6.7–7.6 distinct groups of 8, half the training time; exploration
        # is unmeasured on text
        model_by_modality={
            "text": {
                "saliency_weight": 0.0,
                "saliency_levels": (0.1, 0.3, 0.5, 0.7, 0.9),
                "diversity_weight": 4.0,
                "agreement_prior": 10.0,
                "train_agreement_prior": 3.0,
                "explore": 0.0,
            }
        },
        # issue #44: a regressor (the cosmology demo's CNN) keeps the 2-level saliency teacher, which pulls
        # towards the full-input outputs; the prior and sufficiency compare classes (CLASSIFICATION_ONLY)
        model_by_task={"regression": {"saliency_weight": 1.0, "explore": 0.0}},
    ),
}
RECIPE_OPTIONS = tuple(RECIPES["paper"].model)
#: Recipe options that need a capability of the backbone's adapter (the adapter attribute named): for an
#: adapter without it a recipe gives the option its ``"paper"`` value (off) instead, so that the default
#: recipe runs on every backbone (``keep_special_tokens`` on text backbones with [CLS]/[SEP] only).
REQUIRES = {"saliency_weight": "has_soft_forward", "keep_special_tokens": "has_special_tokens"}
#: Recipe options that compare classes (the backbone's predicted class): for a regression model a recipe gives
#: them their ``"paper"`` value (off), and a value given explicitly is a ValueError.
CLASSIFICATION_ONLY = ("agreement_prior", "train_agreement_prior", "sufficiency_weight", "distill_weight")
#: Recipe options that may be ``None``: then the option named takes their place.
FOLLOWS = {"train_agreement_prior": "agreement_prior"}


def get_recipe(name: object) -> Recipe:
    """The recipe called ``name`` (ValueError naming the choices otherwise)."""
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"recipe must be one of {tuple(RECIPES)}, got {name!r}")
    return RECIPES[name]


def resolve_options(
    recipe: Recipe, given: dict[str, Any], adapter: object = None, task: str = "classification"
) -> dict[str, Any]:
    """The recipe-governed options: those ``given`` (not ``None``), the rest from ``recipe`` (the
    ``"paper"`` value for an option that needs a capability ``adapter`` lacks, see :data:`REQUIRES`, or that
    compares classes in a regression ``task``, see :data:`CLASSIFICATION_ONLY`), then
    :func:`followers_of_given`."""
    out = {}
    for name, value in recipe.model_for(getattr(adapter, "modality", None), task).items():
        if given.get(name) is not None:
            out[name] = given[name]
        elif name in REQUIRES and not getattr(adapter, REQUIRES[name], False):
            out[name] = RECIPES["paper"].model[name]
        elif name in CLASSIFICATION_ONLY and task != "classification":
            out[name] = RECIPES["paper"].model[name]
        else:
            out[name] = value
    return followers_of_given(out, given)


def followers_of_given(options: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``options`` with each :data:`FOLLOWS` option ``None`` whose leader is ``given`` (not ``None``) without
    it: an agreement prior given alone is the prior of training too (the constructor, ``from_pretrained``)."""
    return {
        **options,
        **{name: None for name, leader in FOLLOWS.items() if given.get(leader) is not None and given.get(name) is None},
    }


def check_options(options: dict[str, Any], adapter: Any, task: str = "classification") -> dict[str, Any]:
    """The resolved ``options`` (:func:`resolve_options`), each checked (TypeError / ValueError naming the
    option, its value and what is allowed), also against the backbone's ``adapter``."""
    out = dict(options)
    for name in SWITCHES:
        out[name] = check_bool(name, options[name])
    out["group_gen_scale"] = check_number("group_gen_scale", options["group_gen_scale"], 0.0, above=True)
    out["diversity_weight"] = check_number("diversity_weight", options["diversity_weight"], 0.0)
    out["saliency_weight"] = check_number("saliency_weight", options["saliency_weight"], 0.0)
    out["explore"] = check_number("explore", options["explore"], 0.0)
    for name in CLASSIFICATION_ONLY:
        out[name] = check_number(name, options[name], 0.0, optional=name in FOLLOWS)
        if out[name] is not None and out[name] > 0 and task != "classification":
            raise ValueError(f"{name}={out[name]!r} compares classes; task={task!r} has none: use 0")
    out["saliency_loss"] = check_choice("saliency_loss", options["saliency_loss"], SALIENCY_LOSSES)
    out["saliency_levels"] = check_levels("saliency_levels", options["saliency_levels"])
    kind = type(adapter).__name__
    if out["keep_special_tokens"] and not adapter.has_special_tokens:
        raise ValueError(
            f"keep_special_tokens=True needs a text backbone with special tokens ([CLS]/[SEP], e.g. BERT); "
            f"{kind} has none"
        )
    if out["saliency_weight"] > 0 and not adapter.has_soft_forward:
        raise ValueError(
            f"saliency_weight > 0 needs the adapter's soft_forward (the backbone's saliency); {kind} has none: "
            "implement it, or pass saliency_weight=0"
        )
    return out
