"""``sopfast.SOP``: a frozen backbone turned into a Sum-of-Parts self-attributing model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .adapters import BackboneAdapter, get_adapter
from .adapters.base import check_mode
from .generator import GroupGenerator
from .losses import attention_overlap, feature_saliency, saliency_alignment
from .ops import aggregate
from .ops._validate import check_tau
from .output import SOPOutput
from .selector import GroupSelector
from .types import FeatureInputs, Groups

TASKS = ("classification", "regression")
TOKENS_PER_CALL = 4096


def _check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return value


@dataclass
class RegularisedOutput(SOPOutput):
    """An :class:`SOPOutput` whose :meth:`loss` adds a training ``penalty`` (``SOP(diversity_weight=...)``)."""

    penalty: torch.Tensor | None = None

    def loss(self, labels: torch.Tensor) -> torch.Tensor:
        return super().loss(labels) + self.penalty


class SOP(nn.Module):
    """Sum-of-Parts wrapper around a frozen ``backbone`` (SPEC §1–§3).

    Args:
        backbone: HF ``ViTForImageClassification`` / ``BertForSequenceClassification``, timm
            ``VisionTransformer``, or a CNN (give ``feature_layer=``); others via ``adapter=``.
        num_groups: ``m``, groups per input.
        tau: fraction of features per group, ``k = max(1, floor(τ·d))``; changeable later
            (``model.tau = ...`` or ``model(x, tau=...)``).
        mode: ``"exact"`` (the authors' algorithm, see ``docs/method.md`` for where it differs)
            or ``"drop"`` (ViT/BERT run only the kept tokens; equal to ``exact`` for BERT, an
            approximation for ViT).
        num_heads: generator heads, each a full-width ``[3E, E]`` weight as in the authors' code
            (training uses head ``epoch mod H``; evaluation stacks the heads' rows).
        ties: top-τ tie rule: ``"authors"`` (rank the fp32 attention, equal values to the
            higher index, as the authors' code) or ``"logits"`` (rank the blurred logits, ties to
            the lower index: the paper's math at infinite precision).
        group_gen_scale, group_sel_scale: the generator's γ and the selector's β.
        blur_kernel_size, blur_sigma: optional Gaussian blur of attention logits (``≤ 1``: off).
        center_embeddings, queries: opt-in generator changes beyond the authors' algorithm
            (default off: ``False``, ``"fixed"``): subtract each example's mean feature embedding
            before the attention; pick the query rows by farthest-point sampling (``"diverse"``)
            instead of the fixed rows ``floor(j·d/m)``.  See :class:`sopfast.generator.GroupGenerator`
            and ``docs/quality.md``.
        normalize_logits: standardise each generator logit row before ``γ`` (opt-in, beyond the
            paper): ``γ`` then fixes the attention's sharpness (see ``docs/quality.md``).
        freeze_projection: keep the generator's copy of the backbone fixed (the authors' config
            option ``freeze_projection``); only the generator weight and the selector train.
        diversity_weight: in training, add ``diversity_weight ·`` :func:`sopfast.losses.attention_overlap`
            of the generator's attention rows to ``out.loss`` (default 0: the paper's loss).
        saliency_weight: in training, add ``saliency_weight ·`` :func:`sopfast.losses.saliency_alignment`
            with the backbone's :func:`sopfast.losses.feature_saliency` at ``z = τ``: a teacher
            signal towards features that move the backbone (default 0: the paper's loss).
        deletion: groups keep the lowest-attention features instead of the highest.
        group_batch_size: groups per backbone call (bounds memory); ``None`` picks about
            ``TOKENS_PER_CALL`` (4,096) tokens per call for the mode at hand.
        task: ``"classification"`` (cross-entropy) or ``"regression"`` (scaled MSE).
        class_weights: ``[C, H]`` selector queries when the backbone has no classifier to copy.
        adapter: a :class:`sopfast.adapters.BackboneAdapter` for an unsupported backbone.
        **adapter_kwargs: passed to the adapter (``feature_layer``, ``classifier`` for CNNs).
    """

    def __init__(
        self,
        backbone: nn.Module,
        num_groups: int = 20,
        tau: float = 0.2,
        mode: str = "exact",
        *,
        num_heads: int = 1,
        ties: str = "authors",
        group_gen_scale: float = 1.0,
        group_sel_scale: float = 1.0,
        blur_kernel_size: int = 0,
        blur_sigma: float = 1.0,
        center_embeddings: bool = False,
        queries: str = "fixed",
        normalize_logits: bool = False,
        freeze_projection: bool = False,
        diversity_weight: float = 0.0,
        saliency_weight: float = 0.0,
        deletion: bool = False,
        group_batch_size: int | None = None,
        task: str = "classification",
        class_weights: torch.Tensor | None = None,
        adapter: BackboneAdapter | None = None,
        **adapter_kwargs,
    ):
        super().__init__()
        if not isinstance(backbone, nn.Module):
            raise TypeError(f"backbone must be a torch.nn.Module, got {type(backbone).__name__}")
        self.num_groups = _check_positive_int("num_groups", num_groups)
        self.tau = tau
        self.group_batch_size = (
            None if group_batch_size is None else _check_positive_int("group_batch_size", group_batch_size)
        )
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.task = task
        self.deletion = bool(deletion)
        for name, weight in (("diversity_weight", diversity_weight), ("saliency_weight", saliency_weight)):
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
                raise ValueError(f"{name} must be a number ≥ 0, got {weight!r}")
        self.diversity_weight = float(diversity_weight)
        self.saliency_weight = float(saliency_weight)
        backbone.requires_grad_(False)
        backbone.eval()
        self.backbone = backbone
        self.adapter = adapter if adapter is not None else get_adapter(backbone, **adapter_kwargs)
        self.mode = mode
        self.projection = self.adapter.make_projection()
        if freeze_projection:
            self.projection.requires_grad_(False)
        self.generator = GroupGenerator(
            self.adapter.embed_dim,
            num_heads=_check_positive_int("num_heads", num_heads),
            scale=group_gen_scale,
            blur_kernel_size=blur_kernel_size,
            blur_sigma=blur_sigma,
            ties=ties,
            center=center_embeddings,
            queries=queries,
            normalize_logits=normalize_logits,
        )
        self.selector = GroupSelector(self._class_weight(class_weights), group_sel_scale)
        self.epoch = 0
        self.config = {
            "num_groups": num_groups,
            "tau": tau,
            "mode": mode,
            "num_heads": num_heads,
            "ties": ties,
            "group_gen_scale": group_gen_scale,
            "group_sel_scale": group_sel_scale,
            "blur_kernel_size": blur_kernel_size,
            "blur_sigma": blur_sigma,
            "deletion": deletion,
            "center_embeddings": center_embeddings,
            "queries": queries,
            "normalize_logits": normalize_logits,
            "freeze_projection": freeze_projection,
            "diversity_weight": diversity_weight,
            "saliency_weight": saliency_weight,
            "group_batch_size": group_batch_size,
            "task": task,
            **adapter_kwargs,
        }

    def _class_weight(self, class_weights: torch.Tensor | None) -> torch.Tensor:
        if class_weights is not None:
            if not isinstance(class_weights, torch.Tensor) or class_weights.dim() != 2:
                raise ValueError("class_weights must be a [num_classes, hidden] tensor")
            return class_weights
        try:
            return self.adapter.classifier_weight()
        except (AttributeError, ValueError) as err:
            raise ValueError(
                "the backbone has no classifier weight to initialise the group selector; pass class_weights=[C, H]"
            ) from err

    @property
    def tau(self) -> float:
        return self._tau

    @tau.setter
    def tau(self, value: float) -> None:
        self._tau = check_tau(value)

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
        return self.adapter.prepare(given[0], attention_mask, token_type_ids)

    def make_groups(self, inputs: FeatureInputs, tau: float | None = None, num_groups: int | None = None) -> Groups:
        """Run the generator on prepared ``inputs``: ``m`` groups per example (with λ).

        An example with fewer candidate features than groups repeats query rows (the rows
        ``floor(j·d/m)``), as the authors' code does.
        """
        tau = self.tau if tau is None else check_tau(tau)
        m = self.num_groups if num_groups is None else _check_positive_int("num_groups", num_groups)
        valid = self.adapter.candidates(inputs)
        emb = self.adapter.embed(self.projection, inputs)
        head = self.epoch % self.generator.num_heads if self.training else None
        return self.generator(
            emb, valid, m, tau, head=head, deletion=self.deletion, grid=self.adapter.feature_grid(inputs)
        )

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
    ) -> SOPOutput:
        """One SOP prediction: images ``[B, C, H, W]`` or ``input_ids [B, T]`` with ``attention_mask``."""
        inputs = self.prepare(x, attention_mask, token_type_ids, input_ids=input_ids, pixel_values=pixel_values)
        groups = self.make_groups(inputs, tau)
        out = self.predict_groups(inputs, groups, mode)
        if self.training and (self.diversity_weight > 0 or self.saliency_weight > 0):
            out = RegularisedOutput(**vars(out), penalty=self.training_penalty(inputs, groups, tau))
        return out

    def training_penalty(self, inputs: FeatureInputs, groups: Groups, tau: float | None = None) -> torch.Tensor:
        """The opt-in generator terms added to the loss: ``diversity_weight ·`` attention overlap
        ``+ saliency_weight ·`` saliency alignment (both 0 by default)."""
        valid = self.adapter.candidates(inputs)
        penalty = groups.lam.new_zeros(())
        if self.diversity_weight > 0:
            penalty = penalty + self.diversity_weight * attention_overlap(groups.attention, valid)
        if self.saliency_weight > 0:
            saliency = feature_saliency(self, inputs, self.tau if tau is None else tau)
            penalty = penalty + self.saliency_weight * saliency_alignment(groups.attention, saliency, valid)
        return penalty

    def predict_groups(self, inputs: FeatureInputs, groups: Groups, mode: str | None = None) -> SOPOutput:
        """Run the frozen backbone on given ``groups`` and combine with the selector."""
        mode = self.mode if mode is None else check_mode(self.adapter, mode)
        chunk = self.group_chunk_size(self.adapter.tokens_per_group(inputs, groups, mode))
        with torch.no_grad():
            preds = self.adapter.run_groups(inputs, groups, mode, chunk)
        scores = self.selector(preds.keys)
        logits = aggregate(scores, groups.lam, preds.logits)
        return SOPOutput(
            logits=logits,
            group_logits=preds.logits.float(),
            group_scores=scores,
            lam=groups.lam,
            group_masks=groups.mask,
            group_indices=groups.indices,
            attention=groups.attention,
            task=self.task,
        )

    def save_pretrained(self, directory: str) -> str:
        """Write the trainable weights (safetensors), the config and the backbone's hash to ``directory``."""
        from .checkpoint import save_pretrained

        return str(save_pretrained(self, directory))

    @classmethod
    def from_pretrained(cls, directory: str, backbone: nn.Module, **overrides) -> SOP:
        """Rebuild a model saved with :meth:`save_pretrained` over the same ``backbone``."""
        from .checkpoint import load_pretrained

        return load_pretrained(directory, backbone, **overrides)

    def group_chunk_size(self, tokens_per_group: int) -> int:
        """Groups per backbone call: ``group_batch_size``, or about ``TOKENS_PER_CALL`` tokens."""
        if self.group_batch_size is not None:
            return self.group_batch_size
        return max(1, TOKENS_PER_CALL // max(1, tokens_per_group))

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters SOP trains (projection copy, generator, selector); the backbone is frozen."""
        return [p for p in self.parameters() if p.requires_grad]
