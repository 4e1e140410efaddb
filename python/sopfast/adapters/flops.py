"""The FLOP model of SOP's group passes on a Transformer backbone: what ``drop`` saves over the
authors' algorithm (the ideal speed-up :meth:`sopfast.adapters.BackboneAdapter.drop_flop_ratio`
reports, and the benchmarks compare the measured one with)."""

from __future__ import annotations

from typing import Any, NamedTuple


class TransformerSize(NamedTuple):
    """A Transformer encoder's ``width`` (hidden size), ``layers`` and ``mlp`` (inner MLP width)."""

    width: int
    layers: int
    mlp: int


def transformer_flops(tokens: int, width: int, layers: int, mlp: int) -> float:
    """Forward FLOPs of ``layers`` Transformer layers on ``tokens`` tokens (matmuls only)."""
    per_layer = 2 * tokens * (4 * width * width + 2 * width * mlp) + 4 * tokens * tokens * width
    return float(layers * per_layer)


def ideal_drop_ratio(tokens: int, kept: int, groups: int, width: int, layers: int, mlp: int, train: bool) -> float:
    """The FLOP ratio reference / drop for SOP on a Transformer (projection pass included).

    Reference: the projection runs all ``layers`` on the full input, then ``groups`` full
    passes; drop: the projection runs ``layers − 1`` layers, then ``groups`` passes on
    ``kept`` tokens.  Training adds the projection's backward (2× its forward, ``layers − 1``).
    """
    full = transformer_flops(tokens, width, 1, mlp)
    reference = (layers + groups * layers) * full
    drop = (layers - 1) * full + groups * transformer_flops(kept, width, layers, mlp)
    if train:
        backward = 2 * (layers - 1) * full
        reference += backward
        drop += backward
    return reference / drop


def hf_transformer_size(config: Any) -> TransformerSize:
    """The :class:`TransformerSize` of a Hugging Face encoder ``config`` (read by attribute name): the MLP
    width is ``intermediate_size`` (BERT, ViT …), ``hidden_dim`` (DistilBERT) or ``mlp_ratio`` times the
    width (DINOv2)."""
    width, layers = int(config.hidden_size), int(config.num_hidden_layers)
    mlp = getattr(config, "intermediate_size", None) or getattr(config, "hidden_dim", None)
    if mlp is None:
        mlp = width * float(getattr(config, "mlp_ratio", 4))
    return TransformerSize(width, layers, int(mlp))
