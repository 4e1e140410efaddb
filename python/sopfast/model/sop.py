"""``sopfast.SOP``: a frozen backbone turned into a Sum-of-Parts self-attributing model."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from ..adapters import BackboneAdapter, get_adapter
from ..adapters.base import TOKENS_PER_EXAMPLE_CHUNK, call_scale, check_mode, tokens_per_call
from ..adapters.sources import Backbone, inferred_source
from ..checks import (
    BACKBONE_DTYPES,
    Checked,
    check_bool,
    check_choice,
    check_dtype,
    check_int,
    check_number,
    check_tau,
    check_text_only,
)
from ..ops import aggregate, num_kept
from ..types import FeatureInputs, GroupPredictions, Groups
from .agreement import AgreementSelection, FullInputLogits
from .authors import AuthorsCheckpoint
from .checkpoint import hash_backbone
from .generator import GroupGenerator, check_candidates, check_finite_lam, no_groups
from .hub import HubMixin, SOPConfig, backbone_module
from .output import SOPOutput, check_finite_group_logits, concatenate_outputs
from .penalty import RegularisedOutput, training_penalty
from .pictures import explain_batch
from .recipes import DEFAULT_RECIPE, RECIPE_OPTIONS, RecipeName, check_options, get_recipe, resolve_options
from .runtime import COMPILE_CHOICES, cast_backbone, compile_blocks, compiles_on
from .selector import GroupSelector, check_class_weights

TASKS = ("classification", "regression")


class SOP(HubMixin, AgreementSelection, nn.Module):
    """Sum-of-Parts wrapper around a frozen ``backbone`` (docs/method.md); saved, loaded and shared like a
    Hugging Face model (:class:`sopfast.model.hub.HubMixin`: ``save_pretrained``, ``from_pretrained``,
    ``push_to_hub``, a model card, and ``preprocess`` of raw inputs as in training).

    Args:
        backbone: a Hugging Face image or text classifier of a family sopfast knows (ViT, DeiT, BEiT,
            DINOv2, Swin, ResNet, ConvNeXt; BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT, ELECTRA,
            DeBERTa-v2), timm or torchvision ``VisionTransformer``, or a CNN (give ``feature_layer=``);
            others via ``adapter=``.  A :func:`sopfast.adapters.load_backbone` record also tells where it came
            from (saved with the model).
        num_groups: ``m``, groups per input.
        tau: fraction of features per group, ``k = max(1, floor(τ·d))``; changeable later
            (``model.tau = ...`` or ``model(x, tau=...)``).
        mode: ``"exact"`` (the authors' algorithm, see ``docs/method.md`` for where it differs)
            or ``"drop"`` (ViT/BERT run only the kept tokens; equal to ``exact`` for BERT, an
            approximation for ViT); ``None``: the recipe's — ``drop`` where the backbone supports it for
            ``"sopfast"``, ``exact`` for ``"paper"`` (why: :mod:`sopfast.model.recipes`).
        recipe: a named setting (:mod:`sopfast.model.recipes`): ``"sopfast"`` (the measured one that
            learns distinct groups beating random ones; ``docs/quality.md``) or ``"paper"`` (the authors'
            algorithm exactly).  It fills the options below marked "from the recipe" that are not
            given, and :func:`sopfast.train`'s learning rate and warm-up.
        num_heads: generator heads, each a full-width ``[3E, E]`` weight as in the authors' code
            (training uses head ``epoch mod H``; evaluation stacks the heads' rows).
        ties: top-τ tie rule: ``"authors"`` (rank the fp32 attention, equal values to the
            higher index, as the authors' code) or ``"logits"`` (rank the blurred logits, ties to
            the lower index: the paper's math at infinite precision).
        group_gen_scale: the generator's γ (from the recipe: 1 for ``"paper"``, 2 on standardised
            logits for ``"sopfast"``).
        group_sel_scale: the selector's β.
        blur_kernel_size: size of the optional Gaussian blur of the attention logits over the feature grid
            (``≤ 1``: off).
        blur_sigma: standard deviation of that blur, in features.
        center_embeddings: subtract each example's mean feature embedding before the attention
            (from the recipe; beyond the paper, see :class:`sopfast.model.generator.GroupGenerator`).
        queries: the query rows: ``"fixed"`` (the paper's ``floor(j·d/m)``) or ``"diverse"``
            (farthest-point sampling over the embeddings); from the recipe.
        normalize_logits: standardise each generator logit row before ``γ``, so ``γ`` alone fixes the
            attention's sharpness (from the recipe; beyond the paper, see ``docs/quality.md``).
        freeze_projection: keep the generator's copy of the backbone fixed (the authors' config
            option ``freeze_projection``); only the generator weight and the selector train.
        diversity_weight: in training, add ``diversity_weight ·`` :func:`sopfast.model.losses.attention_overlap`
            of the generator's attention rows to ``out.loss`` (from the recipe; 0 is the paper's loss).
        saliency_weight: in training, add ``saliency_weight ·`` a saliency loss (``saliency_loss``) between
            the generator's attention rows and the backbone's :func:`sopfast.model.losses.feature_saliency`:
            a teacher signal towards features that move the backbone (from the recipe, for adapters with a
            ``soft_forward``; 0 is the paper's loss).
        saliency_loss: ``"align"`` (:func:`sopfast.model.losses.saliency_alignment`, ``−Σ a ŝ``) or ``"kl"``
            (:func:`sopfast.model.losses.saliency_kl`, KL of each row to ``softmax(γ·ŝ)``: the whole
            ranking); from the recipe.
        saliency_levels: the presence levels ``z`` in ``(0, 1]`` the saliency is averaged over, one backbone
            backward each (recipe ``"sopfast"``: ``(0.2, 0.6)``, on text 0.1 … 0.9; ``None`` after the recipe:
            the single level ``z = τ``).
        key_score: add a query-independent score ``v·e_j`` (zero at init) to every attention row, so the
            generator can rank a feature high in every group (from the recipe; beyond the paper).
        unit_lambda: predict with ``λ = 1`` (as random groups do) while λ's gradient still reaches the
            generator: ``λ → 1 + λ − λ.detach()`` (from the recipe; beyond the paper).
        demote_blank: rank the features the adapter finds blank (``blank_features``: all-background patches,
            [CLS]/[SEP]) last in every row and take no query row from them (from the recipe).
        keep_special_tokens: text backbones with special tokens (BERT): [CLS]/[SEP] are no candidates but
            always run, so groups are made of words (from the recipe, which sets it only for such
            backbones; ``True`` for a backbone without special tokens is a ValueError).
        agreement_prior: ``α``: the selector adds ``α · log p_i(ŷ)`` to every class's score of group ``i``, where
            ``p_i`` is the backbone's prediction on the group alone and ``ŷ`` its prediction on the whole input
            (one more backbone pass per input), so that the groups that make the backbone say what it says
            carry SOP's prediction (from the recipe; 0 is the paper's selector; classification only).
        train_agreement_prior: the selector's ``α`` in training, where it differs from ``agreement_prior`` (then
            the prior at inference only). ``None``: from the recipe (3 on text, where ``agreement_prior`` is 10;
            none on images), and where the recipe sets none or ``agreement_prior`` is given alone,
            ``agreement_prior`` in training too.
        sufficiency_weight: in training, add ``sufficiency_weight ·`` :func:`sopfast.model.losses.sufficiency_loss`:
            each group's ``λ`` is pushed up when the group alone predicts the backbone's full-input class better
            than the input's other groups, down when worse — a signal for every group, used or not (from the
            recipe; 0 is the paper's loss; classification only).
        distill_weight: in training, add ``distill_weight ·`` the KL divergence of SOP's class distribution from
            the backbone's on the whole input (from the recipe; 0 is the paper's loss; classification only).
        explore: in training, ``explore ·`` Gumbel noise on the generator's logits before the top τ (from the recipe).
        deletion: groups keep the lowest-attention features instead of the highest.
        group_batch_size: groups per backbone call (bounds memory); ``None`` picks about
            ``TOKENS_PER_CALL`` (4,096; 65,536 on a GPU; 2,048 in ``exact`` on the CPU) tokens per call.
        checkpoint_projection: activation checkpointing of the projection's layers in training
            (recomputed in the backward pass instead of kept: less memory, one more projection
            forward); ``None`` turns it on where the adapter supports it (ViT, BERT).
        backbone_dtype: hold the frozen backbone's weights in this dtype (``"bfloat16"``, ``"float16"``,
            ``"float32"`` or the ``torch.dtype``), cast once, in place, after the trainable copies are made
            (projection, selector: they stay fp32).  Under autocast in that dtype (a GPU's mixed precision)
            the group passes then cast no weights per call; without autocast the backbone computes in it.
            Checkpoints record the backbone as given (its hash before the cast), so they load over it.
        compile: ``torch.compile`` the transformer blocks of the frozen backbone and the projection (static
            shapes; the adapter's ``compile_units``) on the first forward: ``False`` (the default), ``True``,
            or ``"auto"`` (on a CUDA device only).  Same logits as eager (tested on the CPU); the first call
            of each shape compiles.  Whether it is faster on a GPU is unmeasured until ``bench/gpu_script.py``'s
            compile step runs on a card (on the CPU: no faster, ``bench/RESULTS_compile_cpu.md``).
        task: ``"classification"`` (cross-entropy) or ``"regression"`` (scaled MSE).
        class_weights: ``[C, H]`` selector queries when the backbone has no classifier to copy.
        adapter: a :class:`sopfast.adapters.BackboneAdapter` for an unsupported backbone, or the name of
            one (:func:`sopfast.adapters.list_adapters`, e.g. ``"hf-deit"``; saved with the model); ``None``
            finds the backbone's family.
        **adapter_kwargs: passed to the adapter (``feature_layer``, ``classifier`` for CNNs).
    """

    def __init__(
        self,
        backbone: nn.Module | Backbone,
        num_groups: int = 20,
        tau: float = 0.2,
        mode: Literal["exact", "drop"] | None = None,
        *,
        recipe: RecipeName = DEFAULT_RECIPE,
        num_heads: int = 1,
        ties: Literal["authors", "logits"] = "authors",
        group_gen_scale: float | None = None,
        group_sel_scale: float = 1.0,
        blur_kernel_size: int = 0,
        blur_sigma: float = 1.0,
        center_embeddings: bool | None = None,
        queries: Literal["fixed", "diverse"] | None = None,
        normalize_logits: bool | None = None,
        freeze_projection: bool = False,
        diversity_weight: float | None = None,
        saliency_weight: float | None = None,
        saliency_loss: Literal["align", "kl"] | None = None,
        saliency_levels: Sequence[float] | None = None,
        key_score: bool | None = None,
        unit_lambda: bool | None = None,
        demote_blank: bool | None = None,
        keep_special_tokens: bool | None = None,
        agreement_prior: float | None = None,
        train_agreement_prior: float | None = None,
        sufficiency_weight: float | None = None,
        distill_weight: float | None = None,
        explore: float | None = None,
        deletion: bool = False,
        group_batch_size: int | None = None,
        checkpoint_projection: bool | None = None,
        backbone_dtype: torch.dtype | str | None = None,
        compile: bool | Literal["auto"] = False,
        task: Literal["classification", "regression"] = "classification",
        class_weights: torch.Tensor | None = None,
        adapter: BackboneAdapter | str | None = None,
        **adapter_kwargs,
    ):
        super().__init__()
        source = backbone.describe() if isinstance(backbone, Backbone) else None
        backbone = backbone_module(backbone)
        #: Where the backbone (and the inputs' preprocessing) came from, saved with the model so that
        #: :meth:`from_pretrained` can load it again from the directory alone.
        self.provenance: dict[str, Any] = {"backbone": source or inferred_source(backbone)}
        self.recipe = get_recipe(recipe)
        self.num_groups = num_groups
        self.tau = tau
        self.group_batch_size = group_batch_size
        self.task = check_choice("task", task, TASKS)
        self.deletion = deletion
        backbone.requires_grad_(False)
        backbone.eval()
        self.backbone = backbone
        if isinstance(adapter, BackboneAdapter):
            self.adapter = adapter
        else:
            self.adapter = get_adapter(backbone, adapter, **adapter_kwargs)
        # the recipe options, as given (None: from the recipe); the signature is their one list
        arguments = locals()
        given = {name: arguments[name] for name in RECIPE_OPTIONS}
        options = check_options(resolve_options(self.recipe, given, self.adapter, self.task), self.adapter, self.task)
        self.diversity_weight, self.saliency_weight = options["diversity_weight"], options["saliency_weight"]
        self.saliency_loss, self.saliency_levels = options["saliency_loss"], options["saliency_levels"]
        self.unit_lambda, self.demote_blank = options["unit_lambda"], options["demote_blank"]
        self.agreement_prior, self.explore = options["agreement_prior"], options["explore"]
        self.train_agreement_prior = options["train_agreement_prior"]
        self.sufficiency_weight, self.distill_weight = options["sufficiency_weight"], options["distill_weight"]
        self.adapter.keep_special_tokens = options["keep_special_tokens"]
        self.mode = self.recipe.default_mode(self.adapter) if mode is None else mode
        self.projection = self.adapter.make_projection()
        self.checkpoint_projection = checkpoint_projection
        if check_bool("freeze_projection", freeze_projection):
            self.projection.requires_grad_(False)
        self.generator = GroupGenerator(
            self.adapter.embed_dim,
            num_heads=check_int("num_heads", num_heads, 1),
            scale=options["group_gen_scale"],
            blur_kernel_size=check_int("blur_kernel_size", blur_kernel_size),
            blur_sigma=check_number("blur_sigma", blur_sigma, 0.0, above=True),
            ties=ties,
            center=options["center_embeddings"],
            queries=options["queries"],
            normalize_logits=options["normalize_logits"],
            key_score=options["key_score"],
        )
        selector_scale = check_number("group_sel_scale", group_sel_scale, 0.0, above=True)
        self.selector = GroupSelector(self._class_weight(class_weights), selector_scale)
        self.backbone_dtype = check_dtype("backbone_dtype", backbone_dtype, BACKBONE_DTYPES, optional=True)
        self._given_backbone_sha256 = cast_backbone(self.backbone, self.backbone_dtype)
        self.compile_option = check_choice("compile", compile, COMPILE_CHOICES)
        if compile is True and not self.adapter.compile_units(self.projection):
            raise ValueError(f"compile=True: {type(self.adapter).__name__} names no blocks to compile; use False")
        self._compiled = False
        self._reference = FullInputLogits(self.adapter)
        self.epoch = 0
        self.config = SOPConfig(
            {
                "num_groups": num_groups,
                "tau": tau,
                "mode": self.mode,
                "recipe": recipe,
                "num_heads": num_heads,
                "ties": ties,
                "group_sel_scale": group_sel_scale,
                "blur_kernel_size": blur_kernel_size,
                "blur_sigma": blur_sigma,
                "deletion": deletion,
                **options,
                "freeze_projection": freeze_projection,
                "group_batch_size": group_batch_size,
                "checkpoint_projection": checkpoint_projection,
                "backbone_dtype": self.backbone_dtype,
                "compile": compile,
                "task": task,
                **({"adapter": adapter} if isinstance(adapter, str) else {}),
                **adapter_kwargs,
            }
        )

    def _compile_for(self, device: torch.device) -> None:
        """Compile the adapter's blocks once, the first time ``compile`` says so for inputs on ``device``."""
        if not self._compiled and compiles_on(self.compile_option, device):
            compile_blocks(self.adapter.compile_units(self.projection))
            self._compiled = True

    def backbone_sha256(self) -> str:
        """SHA-256 of the frozen backbone as it was given (before a ``backbone_dtype`` cast): what a saved
        model records and checks the backbone it is loaded over against."""
        return self._given_backbone_sha256 or hash_backbone(self.backbone)

    def _class_weight(self, class_weights: torch.Tensor | None) -> torch.Tensor:
        if class_weights is not None:
            return check_class_weights(class_weights, self.adapter.key_dim, self.adapter.num_classes)
        try:
            return self.adapter.classifier_weight()
        except (AttributeError, ValueError) as err:
            raise ValueError(
                f"the backbone has no classifier weight to initialise the group selector ({err}); pass "
                f"class_weights=[C, H] with H = {self.adapter.key_dim}, the width of its group keys"
            ) from err

    # options that may change after construction (saved with their current values), each set checked
    tau = Checked(lambda name, v: check_tau(v, name), "The fraction of features a group keeps.")
    num_groups = Checked(lambda name, v: check_int(name, v, 1), "``m``, groups per input.")
    group_batch_size = Checked(lambda name, v: check_int(name, v, 1, optional=True), "Groups per backbone call.")
    deletion = Checked(check_bool, "Whether groups keep the lowest-attention features.")
    demote_blank = Checked(check_bool, "Whether the features the adapter finds blank are ranked last.")
    epoch = Checked(lambda name, v: check_int(name, v, 0), "The training epoch (head ``epoch mod H`` trains).")

    @property
    def checkpoint_projection(self) -> bool:
        """Whether the projection's layers are checkpointed in training (see the constructor)."""
        return self.adapter.checkpoint_layers

    @checkpoint_projection.setter
    def checkpoint_projection(self, value: bool | None) -> None:
        check_bool("checkpoint_projection", value, optional=True)
        if value and not self.adapter.supports_checkpointing:
            raise ValueError(
                f"checkpoint_projection=True is not supported by {type(self.adapter).__name__} "
                "(its embed does not run layer by layer)"
            )
        self.adapter.checkpoint_layers = self.adapter.supports_checkpointing if value is None else value

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        self._mode = check_mode(self.adapter, value)

    @property
    def num_classes(self) -> int:
        return int(self.selector.class_queries.shape[0])

    def train(self, mode: bool = True) -> SOP:
        """Train the trainable parts; the frozen backbone always stays in eval mode."""
        super().train(mode)
        self.backbone.eval()
        return self

    def prepare(self, x=None, attention_mask=None, token_type_ids=None, *, input_ids=None, pixel_values=None):
        """Validate and wrap a batch (images ``[B, C, H, W]`` or token ids ``[B, T]`` + masks)."""
        given = [v for v in (x, input_ids, pixel_values) if v is not None]
        if len(given) != 1:
            raise ValueError("pass exactly one input: x, input_ids= or pixel_values=")
        check_text_only(self.adapter.modality, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return self.adapter.prepare(given[0], attention_mask, token_type_ids)

    def make_groups(self, inputs: FeatureInputs, tau: float | None = None, num_groups: int | None = None) -> Groups:
        """Run the generator on prepared ``inputs``: ``m`` groups per example (with λ).

        An example with fewer candidate features than groups repeats query rows (the rows
        ``floor(j·d/m)``), as the authors' code does.
        """
        tau = self.tau if tau is None else check_tau(tau)
        m = self.num_groups if num_groups is None else check_int("num_groups", num_groups, 1)
        d = self.adapter.num_features(inputs)
        if inputs.batch_size == 0:
            return no_groups(m, d, num_kept(tau, d), inputs.device)
        valid = self.adapter.candidates(inputs)
        if valid is not None:
            check_candidates(valid)
        self._compile_for(inputs.device)
        widths = self.adapter.drop_widths(inputs, tau)  # before the projection pass: no GPU sync later
        emb = self.adapter.embed(self.projection, inputs)
        head, explore = (self.epoch % self.generator.num_heads, self.explore) if self.training else (None, 0.0)
        grid = self.adapter.feature_grid(inputs)
        groups = self.generator(emb, valid, m, tau, head, self.deletion, grid, self.demoted(inputs), explore)
        groups.drop_widths = widths
        return groups

    def demoted(self, inputs: FeatureInputs) -> torch.Tensor | None:
        """``[B, d]`` bool: the features the generator ranks last (``demote_blank``: the adapter's
        ``blank_features``), or ``None``."""
        return self.adapter.blank_features(inputs) if self.demote_blank else None

    def forward(
        self,
        x: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        input_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        tau: float | None = None,
        mode: str | None = None,
        labels: torch.Tensor | None = None,
    ) -> SOPOutput:
        """One SOP prediction: images ``[B, C, H, W]`` or ``input_ids [B, T]`` with ``attention_mask``.

        With ``labels`` (``[B]`` class ids, or regression targets) the output's ``.loss`` is the
        paper's loss as a tensor (and ``out[0]``), so Hugging Face ``Trainer``-style and
        Lightning-style loops work unchanged.
        """
        inputs = self.prepare(x, attention_mask, token_type_ids, input_ids=input_ids, pixel_values=pixel_values)
        if torch.is_grad_enabled() or inputs.batch_size <= (size := self.example_chunk_size(inputs)):
            groups = self.make_groups(inputs, tau)
            penalised = self.training and self.has_penalties()
            reference = self.reference_logits(inputs) if penalised else None
            out = self.predict_groups(inputs, groups, mode, reference)
            if penalised:
                fields = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
                out = RegularisedOutput(**fields, penalty_terms=training_penalty(self, inputs, groups, out, tau))
        else:
            parts = []
            for start in range(0, inputs.batch_size, size):
                rows = inputs.rows(slice(start, start + size))
                parts.append(self.predict_groups(rows, self.make_groups(rows, tau), mode))
            out = concatenate_outputs(parts)
        return out if labels is None else out.with_labels(labels)

    def has_penalties(self) -> bool:
        """Whether training adds terms beyond the paper's loss (the recipe's penalties)."""
        weights = (self.diversity_weight, self.saliency_weight, self.sufficiency_weight, self.distill_weight)
        return any(w > 0 for w in weights)

    def reference_logits(self, inputs: FeatureInputs) -> torch.Tensor:
        """``[B, C]`` (fp32): the frozen backbone's logits on the whole ``inputs`` (its own function, no
        gradient; ``[0, C]`` for an empty batch): what SOP's prediction is compared with (agreement) and what
        the agreement prior (:attr:`selection_prior`) selects by; kept for the last inputs
        (:class:`sopfast.model.agreement.FullInputLogits`)."""
        return self._reference(inputs) if inputs.batch_size else torch.zeros(0, self.num_classes, device=inputs.device)

    def example_chunk_size(self, inputs: FeatureInputs) -> int:
        """Examples per chunk of an inference forward (about ``TOKENS_PER_EXAMPLE_CHUNK`` input tokens);
        with autograd on the batch runs whole."""
        tokens = TOKENS_PER_EXAMPLE_CHUNK * call_scale(inputs.device)
        return max(1, tokens // (self.adapter.num_features(inputs) + 1))

    def predict_groups(
        self, inputs: FeatureInputs, groups: Groups, mode: str | None = None, reference: torch.Tensor | None = None
    ) -> SOPOutput:
        """Run the frozen backbone on given ``groups`` and combine with the selector; ``reference [B, C]``:
        the backbone's full-input logits when already computed (:meth:`reference_logits`; computed here
        when the agreement prior in use, :attr:`selection_prior`, needs them).

        Raises ValueError when the backbone's logits on the groups are not finite (inputs far
        outside what the backbone can represent, e.g. pixels of 1e30).
        """
        mode = self.mode if mode is None else check_mode(self.adapter, mode)
        if inputs.batch_size == 0:
            preds = GroupPredictions(
                logits=groups.lam.new_zeros(0, groups.mask.shape[1], self.num_classes),
                keys=groups.lam.new_zeros(0, groups.mask.shape[1], self.selector.class_queries.shape[1]),
            )
        else:
            check_finite_lam(groups.lam)
            self._compile_for(inputs.device)
            with torch.no_grad():
                preds = self.adapter.run_groups_sized(
                    inputs, groups, mode, lambda tokens: self.group_chunk_size(tokens, inputs.device, mode)
                )
            check_finite_group_logits(preds.logits)
            if reference is None and self.selection_prior > 0:
                reference = self.reference_logits(inputs)
        scores = self.select(preds, reference)
        # unit_lambda: λ = 1 in the prediction, λ's gradient kept for the generator
        lam = 1.0 + groups.lam - groups.lam.detach() if self.unit_lambda else groups.lam
        logits = aggregate(scores, lam, preds.logits)
        return SOPOutput(
            logits=logits,
            group_logits=preds.logits.float(),
            group_scores=scores,
            lam=lam,
            group_masks=groups.mask,
            group_indices=groups.indices,
            attention=groups.attention,
            task=self.task,
            backbone_logits=reference,
        )

    @classmethod
    def from_authors(cls, directory: str | os.PathLike, backbone: nn.Module, **overrides) -> SOP:
        """The model of an authors' checkpoint (``exlib`` ``SOPImageCls``/``SOPTextCls`` directory) over
        ``backbone``, which must be the checkpoint's frozen backbone (:mod:`sopfast.model.authors`);
        ``overrides`` go to the constructor (``tau``, the authors' ``k``, is not in their config)."""
        checkpoint = AuthorsCheckpoint(directory, backbone)
        model = cls(backbone, **{**checkpoint.options, "mode": "exact", **overrides})
        checkpoint.load_into(model)
        return model.to(next(backbone.parameters()).device)

    @torch.no_grad()
    def explain(
        self,
        x: torch.Tensor,
        out_dir: str | os.PathLike,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        class_names: Sequence[str] | None = None,
        labels: torch.Tensor | None = None,
        tokens: Sequence[Sequence[str]] | None = None,
    ) -> list[str]:
        """Pictures of the predictions on a batch, one file per example in ``out_dir``: a PNG per image
        ``x [B, C, H, W]`` (the distinct groups the prediction uses, with ``c·λ·y``, and a legend), or
        an HTML page per text (``x`` the ``input_ids [B, T]`` with ``attention_mask``; ``tokens`` their
        strings, e.g. ``tokenizer.convert_ids_to_tokens``).  ``labels`` adds the true class.  Returns
        the paths written."""
        return explain_batch(self, x, out_dir, attention_mask, token_type_ids, class_names, labels, tokens)

    def group_chunk_size(self, tokens: int, device: torch.device | None = None, mode: str | None = None) -> int:
        """Groups per backbone call of ``tokens`` each: ``group_batch_size``, or about ``tokens_per_call(device, mode)``
        tokens in all."""
        if self.group_batch_size is not None:
            return self.group_batch_size
        return max(1, tokens_per_call(device or torch.device("cpu"), mode) // max(1, tokens))

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters SOP trains (projection copy, generator, selector); the backbone is frozen."""
        return [p for p in self.parameters() if p.requires_grad]
