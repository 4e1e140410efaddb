"""The backbone adapter protocol.

sopfast talks to a backbone only through a :class:`BackboneAdapter`.  To use SOP with a
model family sopfast does not know, subclass it and implement the abstract methods, then
pass ``adapter=MyAdapter(backbone)`` to :class:`sopfast.SOP` (or register it with
:func:`sopfast.adapters.register_adapter`).

The four duties (docs/method.md):

* **generator embedding** – :meth:`make_projection` returns the trainable copy and
  :meth:`embed` runs it on the *unmasked* input, returning ``[B, d, E]`` feature embeddings
  (no CLS) read at the second-to-last hidden layer;
* **run groups** – :meth:`run_groups` runs the frozen backbone once per group in a mode
  (``"exact"`` or ``"drop"``) and returns logits ``y [B, m, C]`` and keys ``z [B, m, H]``;
  :meth:`full_forward` is the plain masked full forward used by :mod:`sopfast.model.reference`;
* **classifier weights** – :meth:`classifier_weight` ``[C, H]`` initialises the selector's queries;
* **feature grid** – :meth:`feature_grid` gives ``(h, w)`` for grid-shaped features (blur, pictures)
  or ``None`` for sequences; :meth:`candidates` marks which of the ``d`` features may join a group.

Optional hooks, used by the baselines (:mod:`sopfast.baselines`) and the oracle; an adapter
that lacks one raises :class:`AdapterHookMissing` naming it:

* :meth:`soft_forward` – logits with each feature scaled by a presence in ``[0, 1]`` (gradient
  and Integrated-Gradients baselines; images have a default, pixel masking);
* :meth:`cam_layer` – the activation Grad-CAM reads;
* :meth:`cls_attention` – last-layer attention from the CLS token (FRESH), with
  :attr:`has_cls_attention`;
* :meth:`reference_embed` – the generator embedding computed the authors' way (a full forward of
  the projection with ``output_hidden_states``), for :mod:`sopfast.model.reference`; defaults to :meth:`embed`.

Hooks of SOP's opt-in options (``docs/quality.md``), with defaults:

* :meth:`blank_features` – features without content, ranked last by ``SOP(demote_blank=True)``
  (images with a feature grid: all-background cells; text: the special tokens);
* :attr:`has_soft_forward` – whether :meth:`soft_forward` exists, which ``SOP(saliency_weight=...)``
  needs (the default recipe turns the teacher off for adapters without it);
* :attr:`has_special_tokens` / :attr:`keep_special_tokens` – text backbones whose special tokens
  ([CLS]/[SEP]) ``SOP(keep_special_tokens=True)`` takes out of the candidates and always runs.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..checks import check_text_only
from ..ops import num_kept
from ..types import FeatureInputs, GroupPredictions, Groups, HostValues
from .flops import TransformerSize, ideal_drop_ratio
from .images import upsample_mask

MODES = ("exact", "drop")
#: What :func:`feature_inputs` takes: images ``[B, C, H, W]``, a mapping of ``input_ids`` … or FeatureInputs.
InputsLike = torch.Tensor | Mapping[str, torch.Tensor] | FeatureInputs
#: Adapter classes whose :attr:`BackboneAdapter.exact_modes` claim was measured (:func:`sopfast.adapters.check`,
#: or an explainer's first use of the class): the modes found to compute the backbone's own function.
MEASURED_EXACT_MODES: dict[type, tuple[str, ...]] = {}
#: About this many tokens (or feature cells) per backbone call when group passes are chunked.
TOKENS_PER_CALL = 4096
#: Inference runs the batch in chunks of about this many input tokens (16 ViT-B/16 images), so that
#: peak memory stops growing with the batch size.
TOKENS_PER_EXAMPLE_CHUNK = 16 * 197
#: On a GPU both are this many times larger: calls of 4,096 tokens leave an H100 waiting for Python
#: (bench/gpu/h200_profile_before.md: 20 backbone calls per ViT-B/16 forward at batch 64).
GPU_CALL_SCALE = 16
#: ``exact`` passes (every group at full length) on the CPU take about this many tokens per call instead:
#: on 1 thread a ViT-B/16 forward at batch 2 ran 1.02× the authors' algorithm with it, 0.99× with 4,096 (a call's
#: working set stays nearer the cache; bench/RESULTS.md §1, note ³).
CPU_EXACT_TOKENS_PER_CALL = 2048


def call_scale(device: torch.device) -> int:
    """How many times ``TOKENS_PER_CALL`` and ``TOKENS_PER_EXAMPLE_CHUNK`` a call on ``device`` takes."""
    return GPU_CALL_SCALE if device.type == "cuda" else 1


def tokens_per_call(device: torch.device, mode: str | None = None) -> int:
    """About how many tokens one chunked backbone call of ``mode`` takes on ``device``."""
    if mode == "exact" and device.type == "cpu":
        return CPU_EXACT_TOKENS_PER_CALL
    return TOKENS_PER_CALL * call_scale(device)


class StopForward(Exception):
    """Raised by a hook to end a forward pass once the wanted activation is captured."""


class AdapterHookMissing(NotImplementedError):
    """An optional adapter hook (``cam_layer``, ``cls_attention``, ``soft_forward``) is not provided."""

    def __init__(self, adapter: BackboneAdapter, hook: str, needed_by: str):
        super().__init__(
            f"{type(adapter).__name__} does not implement BackboneAdapter.{hook}(), which {needed_by} needs; "
            f"implement it in the adapter (see sopfast.adapters.base) or choose another method"
        )


class BackboneAdapter(ABC):
    """Connects one backbone family to SOP (see the module docstring)."""

    #: The backbone family in words (for messages listing what is supported).
    family: str = "custom backbone"
    modality: str = "image"
    supported_modes: tuple[str, ...] = ("exact",)
    #: Modes whose group passes compute the backbone's own function on the masked input (BERT ``drop``
    #: runs the kept tokens at their positions: the same logits as ``exact``; a ViT's ``drop`` does not).
    exact_modes: tuple[str, ...] = ("exact",)
    #: Why the modes of :data:`MODES` this adapter lacks are not supported (the error of :func:`check_mode`
    #: says it).
    mode_refusal: str = ""
    #: Tokens a group pass runs before the features, always (a ViT's [CLS]; DeiT also its distillation token).
    num_prefix_tokens: int = 0
    #: Modes whose group passes need every group of one call to keep the same number of features
    #: (ViT ``drop``: a ``-1`` pad would run as a token that attends).
    equal_size_modes: tuple[str, ...] = ()
    #: The backbone's submodule (a ``named_modules`` path; ``""``: the whole backbone) of which
    #: :meth:`make_projection` makes the trainable copy; checkpoint converters map names by it.
    projection_source: str = ""
    #: Whether :meth:`embed` may recompute its layers in the backward pass instead of keeping their
    #: activations (:meth:`run_layer`); the adapters whose ``embed`` walks layers set it.
    supports_checkpointing: bool = False
    #: Activation checkpointing of the projection, set by ``SOP(checkpoint_projection=...)``.
    checkpoint_layers: bool = False
    #: Image backbones: input channels and the fixed input size ``(H, W)`` when there is one.
    channels: int | None = None
    image_size: tuple[int, int] | None = None
    #: Text backbones: the longest input (position table) and the id of the padding token.
    max_tokens: int | None = None
    pad_token_id: int | None = None
    #: Whether the inputs carry special tokens (BERT's [CLS]/[SEP]) that :attr:`keep_special_tokens`
    #: can take out of the candidates.
    has_special_tokens: bool = False
    #: Special tokens are no candidates but always run, set by ``SOP(keep_special_tokens=...)``;
    #: honoured by adapters with :attr:`has_special_tokens`.
    keep_special_tokens: bool = False

    def __init__(self, backbone: nn.Module):
        # A third-party model whose submodules and config the adapter reads by name: typed ``Any``.
        self.backbone: Any = backbone

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def constructor_options(cls, probe: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Constructor arguments of a ``timm:`` / ``torchvision:`` model that its weights ``state`` fix
        (read off a default-built ``probe``), beyond the class count; e.g. a ViT's image size."""
        return {}

    @classmethod
    def open_constructor_options(cls, probe: nn.Module) -> dict[str, Any]:
        """Constructor arguments of a ``timm:`` / ``torchvision:`` model that no weights file fixes (a ViT's
        heads), with the default-built ``probe``'s values: what ``--backbone-option`` must name when a
        model was built with others."""
        return {}

    @classmethod
    def adapter_options(cls, backbone: nn.Module, **given: Any) -> dict[str, Any]:
        """The keyword arguments this adapter takes from ``given`` (``None`` values: not given),
        checked; options that only other families take are a ValueError naming them."""
        extra = sorted(k for k, v in given.items() if v is not None)
        if extra:
            flags = ", ".join(f"{k} (--{k.replace('_', '-')})" for k in extra)
            raise ValueError(
                f"{flags} {'is an option' if len(extra) == 1 else 'are options'} of other backbone families, "
                f"not of {type(backbone).__name__} ({cls.family})"
            )
        return {}

    @property
    def trusted_exact_modes(self) -> tuple[str, ...]:
        """:attr:`exact_modes`, or the modes a measurement of this class found exact when one was made
        (:data:`MEASURED_EXACT_MODES`)."""
        return MEASURED_EXACT_MODES.get(type(self), self.exact_modes)

    @property
    def faithful_mode(self) -> str:
        """The fastest mode that runs the backbone's own function on a masked input (:attr:`trusted_exact_modes`):
        what the explainers of :mod:`sopfast.masking` use unless told otherwise."""
        return "drop" if "drop" in self.trusted_exact_modes and "drop" in self.supported_modes else "exact"

    @classmethod
    def weight_name(cls, name: str) -> str:
        """``name``, a weight of this family as another version of its library names it (e.g. transformers
        4.x), in the installed layout; other names pass unchanged (the authors' checkpoints are read by it)."""
        return name

    # -- inputs ---------------------------------------------------------------------------
    @abstractmethod
    def prepare(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> FeatureInputs:
        """Validate one batch and wrap it (raise ValueError/TypeError on bad input)."""

    @abstractmethod
    def num_features(self, inputs: FeatureInputs) -> int:
        """``d``: the length of the feature axis groups live on."""

    def candidates(self, inputs: FeatureInputs) -> torch.Tensor | None:
        """``[B, d]`` bool of the features that may join a group, or ``None`` for all."""
        return None

    def feature_grid(self, inputs: FeatureInputs) -> tuple[int, int] | None:
        """``(h, w)`` when features lie on a 2-D grid (``h · w = d``), else ``None``."""
        return None

    # -- generator ------------------------------------------------------------------------
    def make_projection(self) -> nn.Module:
        """A trainable deep copy of what :meth:`embed` runs (the generator's encoder)."""
        return trainable_copy(self.backbone)

    @abstractmethod
    def embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        """Feature embeddings ``[B, d, E]`` from ``projection`` on the unmasked input (with grad)."""

    def run_layer(self, layer: nn.Module, *args: Any) -> Any:
        """``layer(*args)`` inside :meth:`embed`; with :attr:`checkpoint_layers` and autograd recording,
        checkpointed (activations recomputed in the backward pass, dropout replayed identically)."""
        if self.checkpoint_layers and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    @property
    @abstractmethod
    def embed_dim(self) -> int:
        """``E``, the width of :meth:`embed`'s output."""

    # -- group passes ---------------------------------------------------------------------
    @abstractmethod
    def run_groups(self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size: int) -> GroupPredictions:
        """Run the frozen backbone on every group (no autograd), ``chunk_size`` groups at a time."""

    def run_groups_sized(
        self, inputs: FeatureInputs, groups: Groups, mode: str, chunk_size_for: Callable[[int], int]
    ) -> GroupPredictions:
        """:meth:`run_groups` with ``chunk_size_for(tokens_per_group)`` groups per call; an adapter whose
        group length needs a host read (BERT ``drop``) overrides it to read that length once."""
        return self.run_groups(inputs, groups, mode, chunk_size_for(self.tokens_per_group(inputs, groups, mode)))

    def tokens_per_group(self, inputs: FeatureInputs, groups: Groups, mode: str) -> int:
        """How many tokens (or feature cells) one group pass processes at most, to size the chunks: all
        ``d`` plus one in ``exact``, the ``k_max`` a group holds at most plus one in ``drop`` (read off
        the shapes, no host sync)."""
        if mode == "exact":
            return groups.mask.shape[-1] + 1
        return groups.indices.shape[-1] + 1

    def compile_units(self, projection: nn.Module) -> list[nn.Module]:
        """The modules ``SOP(compile=...)`` compiles with ``torch.compile``: the transformer blocks of the frozen
        backbone and of ``projection`` (each called with static shapes); ``[]`` (the default): none."""
        return []

    def drop_widths(self, inputs: FeatureInputs, tau: float) -> HostValues | None:
        """What bounds the width of each example's ``drop`` passes for groups of ``tau``, from ``inputs`` alone
        and started on its way to the host (:class:`~sopfast.types.HostValues`), for an adapter whose ``drop``
        widths depend on the data (BERT); ``None`` (the default): they are read off shapes."""
        return None

    @abstractmethod
    def full_forward(self, inputs: FeatureInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain forward of the backbone on (already masked) inputs: logits ``[N, C]``, keys ``[N, H]``."""

    # -- selector -------------------------------------------------------------------------
    @abstractmethod
    def classifier_weight(self) -> torch.Tensor:
        """The backbone classifier's weight ``[C, H]`` (ValueError when there is none to copy)."""

    @property
    def key_dim(self) -> int:
        """``H``, the width of the group keys ``z`` :meth:`run_groups` returns (the selector's width):
        the classifier's input width, or :attr:`embed_dim` without a classifier weight."""
        try:
            return int(self.classifier_weight().shape[1])
        except (AttributeError, ValueError):
            return self.embed_dim

    @property
    def label2id(self) -> dict[str, int]:
        """Class names → ids when the backbone names its classes (a Hugging Face ``label2id`` that is not
        the default ``LABEL_i``), else empty."""
        config = getattr(self.backbone, "config", None)
        names = {str(k): int(v) for k, v in (getattr(config, "label2id", None) or {}).items()}
        return {} if list(names) == [f"LABEL_{i}" for i in range(len(names))] else names

    @property
    def num_classes(self) -> int | None:
        """``C``, the backbone's number of logits, when its classifier says (``None``: unknown)."""
        try:
            return int(self.classifier_weight().shape[0])
        except (AttributeError, ValueError):
            return None

    # -- cost -----------------------------------------------------------------------------
    def transformer_size(self) -> TransformerSize | None:
        """Width, layers and MLP width of a Transformer backbone (``None``: not a Transformer)."""
        return None

    def drop_tokens(self, inputs: FeatureInputs, kept: int) -> int:
        """Tokens a ``drop`` group pass runs when the group keeps ``kept`` features: those, the prefix
        tokens and the features that are no candidates (example 0 of ``inputs``)."""
        valid = self.candidates(inputs)
        d = self.num_features(inputs)
        return kept + self.num_prefix_tokens + (0 if valid is None else d - int(valid[0].sum()))

    def drop_flop_ratio(self, inputs: FeatureInputs, tau: float, num_groups: int, train: bool) -> float | None:
        """The ideal speed-up of ``drop`` over the authors' algorithm in FLOPs (:func:`~sopfast.adapters.flops.
        ideal_drop_ratio`) on ``inputs`` (example 0) with ``num_groups`` groups of ``tau``; ``None`` for a
        backbone without a :meth:`transformer_size` or a ``drop`` mode."""
        size = self.transformer_size()
        if size is None or "drop" not in self.supported_modes:
            return None
        valid = self.candidates(inputs)
        d = self.num_features(inputs) if valid is None else int(valid[0].sum())
        tokens = self.num_features(inputs) + self.num_prefix_tokens
        kept = self.drop_tokens(inputs, num_kept(tau, d))
        return ideal_drop_ratio(tokens, kept, num_groups, size.width, size.layers, size.mlp, train)

    # -- optional hooks -------------------------------------------------------------------
    def candidate_mask(self, inputs: FeatureInputs) -> torch.Tensor:
        """``[B, d]`` bool: :meth:`candidates`, or every feature when that is ``None``."""
        valid = self.candidates(inputs)
        if valid is not None:
            return valid
        return torch.ones(inputs.batch_size, self.num_features(inputs), dtype=torch.bool, device=inputs.device)

    def reference_embed(self, projection: Any, inputs: FeatureInputs) -> torch.Tensor:
        """:meth:`embed` computed as the authors do (a plain full forward); the oracle's embedding."""
        return self.embed(projection, inputs)

    def soft_forward(self, inputs: FeatureInputs, presence: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, C]`` with feature ``j`` scaled by ``presence [B, d] ∈ [0, 1]`` (differentiable).

        Image backbones with a feature grid: the pixels times the presence upsampled to pixels
        (``presence = 0`` is SOP's masking).
        """
        grid = self.feature_grid(inputs)
        pixels = inputs.pixels
        if pixels is None or grid is None:
            raise AdapterHookMissing(
                self, "soft_forward", "gradient and Integrated-Gradients attributions (and SOP's saliency_weight)"
            )
        mask = upsample_mask(presence.view(-1, *grid), (pixels.shape[-2], pixels.shape[-1])).unsqueeze(1)
        return self.full_forward(FeatureInputs(pixels=pixels * mask.to(pixels.dtype)))[0]

    @property
    def has_soft_forward(self) -> bool:
        """Whether :meth:`soft_forward` is available: the adapter implements it, or has a feature grid
        for the image default (``SOP(saliency_weight=...)`` needs it)."""
        own = type(self).soft_forward is not BackboneAdapter.soft_forward
        return own or type(self).feature_grid is not BackboneAdapter.feature_grid

    def blank_features(self, inputs: FeatureInputs) -> torch.Tensor | None:
        """``[B, d]`` bool: features without content (``SOP(demote_blank=True)`` ranks them last), or
        ``None`` when the adapter knows of none.

        Image backbones with a feature grid: the cells whose pixels, in every channel, all lie within
        1e-3 of the image's darkest value (plain background, as on Fashion-MNIST).
        """
        grid = self.feature_grid(inputs)
        pixels = inputs.pixels
        if pixels is None or grid is None:
            return None
        x = pixels.float()
        low = x.flatten(1).min(dim=1).values.view(-1, 1, 1, 1)
        lit = ((x - low).abs() > 1e-3).float().amax(dim=1, keepdim=True)
        return F.adaptive_max_pool2d(lit, grid).flatten(1) == 0

    def cam_layer(self) -> tuple[nn.Module, bool, int]:
        """``(module, read its input?, prefix tokens)``: the activation Grad-CAM weighs — a feature
        map ``[B, E, h, w]`` or tokens ``[B, prefix + d, E]``."""
        raise AdapterHookMissing(self, "cam_layer", "Grad-CAM")

    @property
    def has_cls_attention(self) -> bool:
        """Whether :meth:`cls_attention` is available for this backbone."""
        return False

    def cls_attention(self, inputs: FeatureInputs) -> torch.Tensor:
        """``[B, d]``: last-layer attention from the CLS token to each feature, averaged over heads."""
        raise AdapterHookMissing(self, "cls_attention", "FRESH with source='cls'")


def feature_inputs(adapter: BackboneAdapter, inputs: InputsLike) -> FeatureInputs:
    """``inputs`` as the adapter's checked :class:`~sopfast.types.FeatureInputs`: an image tensor
    ``[B, C, H, W]``, a mapping with ``input_ids`` / ``attention_mask`` / ``token_type_ids`` (or
    ``pixel_values``), or FeatureInputs."""
    if isinstance(inputs, FeatureInputs):
        return inputs
    if isinstance(inputs, torch.Tensor):
        return adapter.prepare(inputs)
    if isinstance(inputs, Mapping):
        x = inputs.get("input_ids", inputs.get("pixel_values", inputs.get("pixels")))
        if x is None:
            raise ValueError(f"inputs has none of input_ids, pixel_values: keys {sorted(inputs)}")
        masks = {k: inputs.get(k) for k in ("attention_mask", "token_type_ids")}
        check_text_only(adapter.modality, **masks)
        return adapter.prepare(x, masks["attention_mask"], masks["token_type_ids"])
    raise TypeError(f"inputs must be a tensor, a mapping of tensors or FeatureInputs, got {type(inputs).__name__}")


def check_mode(adapter: BackboneAdapter, mode: str) -> str:
    """Validate ``mode`` for ``adapter`` (ValueError naming what is allowed)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode not in adapter.supported_modes:
        reason = adapter.mode_refusal
        raise ValueError(
            f"mode={mode!r} is not supported by {type(adapter).__name__}"
            + (f" ({reason})" if reason else "")
            + f"; supported: {adapter.supported_modes}"
        )
    return mode


def trainable_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with every parameter trainable."""
    copied = copy.deepcopy(module)
    for p in copied.parameters():
        p.requires_grad_(True)
    return copied


def run_chunked(
    groups: Groups, chunk_size: int, run: Callable[[slice, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
) -> GroupPredictions:
    """``run(rows, example)`` on each chunk of ``chunk_size`` of the ``B·m`` flattened groups (``example``:
    the example index of each row) returning ``(logits [n, C], keys [n, H])``; stacked to ``[B, m, ·]``."""
    b, m = groups.mask.shape[:2]
    example = group_batch_index(groups)
    outputs = [run(rows, example[rows]) for rows in chunks(b * m, chunk_size)]
    logits = torch.cat([y for y, _ in outputs]).reshape(b, m, -1)
    return GroupPredictions(logits=logits, keys=torch.cat([z for _, z in outputs]).reshape(b, m, -1))


def chunks(total: int, size: int):
    """Yield ``slice`` objects covering ``range(total)`` in steps of ``size``."""
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def freeze_(*modules: nn.Module | None) -> None:
    """Mark the parameters of ``modules`` as not trainable (parts of a projection it never uses)."""
    for module in modules:
        if module is not None:
            for p in module.parameters():
                p.requires_grad_(False)


def group_batch_index(groups: Groups) -> torch.Tensor:
    """``[B·m]`` example index of each flattened group."""
    b, m = groups.mask.shape[:2]
    return torch.arange(b, device=groups.mask.device).repeat_interleave(m)
