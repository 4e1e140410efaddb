"""The torch datasets sopfast reads: tokenised texts (dict items) and images decoded on access."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..defaults import MAX_LENGTH

# more than this share of a text's tokens being the unknown token means the tokenizer does not fit
UNKNOWN_SHARE = 0.5
logger = logging.getLogger(__name__)


def warn_if_mostly_unknown(tokenizer: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> float:
    """Log a warning when most real tokens are the tokenizer's unknown token (a tokenizer that does
    not fit the texts: the model would explain ``[UNK]`` s); returns that share."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is None:
        return 0.0
    special = set(getattr(tokenizer, "all_special_ids", [])) - {unknown}
    real = attention_mask.bool()
    for token in special:
        real &= input_ids != token
    share = float((input_ids[real] == unknown).float().mean()) if bool(real.any()) else 0.0
    if share > UNKNOWN_SHARE:
        logger.warning(
            "%.0f%% of the tokens are the unknown token %r: the tokenizer (%s) does not fit these texts",
            100 * share,
            getattr(tokenizer, "unk_token", unknown),
            type(tokenizer).__name__,
        )
    return share


class TextDataset(torch.utils.data.Dataset):
    """Tokenised texts as dict items ``{"input_ids", "attention_mask", "token_type_ids", "labels"}``
    (each ``encoded`` tensor ``[N, T]``, ``labels [N]``; ``labels=None``: unlabelled texts, items
    without ``"labels"``); the ``tokenizer`` and class names kept."""

    def __init__(
        self,
        encoded: dict[str, torch.Tensor],
        labels: torch.Tensor | None,
        tokenizer: Any = None,
        classes: Sequence[str] | None = None,
    ):
        self.encoded = encoded
        self.labels = labels
        self.tokenizer = tokenizer
        self.classes = list(classes) if classes is not None else None

    @classmethod
    def tokenize(
        cls,
        tokenizer: Any,
        texts: Sequence[str],
        labels: Sequence[int] | torch.Tensor | None,
        pairs: Sequence[str] | None = None,
        max_length: int = MAX_LENGTH,
        padding: str = "longest",
        classes: Sequence[str] | None = None,
    ) -> TextDataset:
        """``texts`` (and second segments ``pairs``) tokenised, truncated to ``max_length`` tokens."""
        enc = tokenizer(
            list(texts),
            None if pairs is None else list(pairs),
            padding=padding,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        encoded = {
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "token_type_ids": enc.get("token_type_ids", torch.zeros_like(enc["input_ids"])),
        }
        warn_if_mostly_unknown(tokenizer, encoded["input_ids"], encoded["attention_mask"])
        return cls(encoded, None if labels is None else torch.as_tensor(labels, dtype=torch.long), tokenizer, classes)

    def require_labels(self) -> torch.Tensor:
        """``labels [N]``, which labelled texts have (a ValueError for unlabelled ones)."""
        if self.labels is None:
            raise ValueError("these texts have no labels")
        return self.labels

    def subset(self, index: torch.Tensor | Sequence[int]) -> TextDataset:
        """The examples at ``index`` (a bool mask or positions), as a new dataset."""
        index = torch.as_tensor(index)
        labels = None if self.labels is None else self.labels[index]
        return TextDataset({k: v[index] for k, v in self.encoded.items()}, labels, self.tokenizer, self.classes)

    def __len__(self) -> int:
        return len(self.encoded["input_ids"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {k: v[i] for k, v in self.encoded.items()}
        return item if self.labels is None else {**item, "labels": self.labels[i]}


class ImageDataset(torch.utils.data.Dataset):
    """``(x [C, H, W], y)`` pairs decoded on access: example ``i`` is ``read(sources[i])`` turned into a
    tensor by ``preprocess``, its class id ``label_of(labels[i])``; ``classes`` names the class ids and
    ``sources`` says where each example comes from (a path, bytes, an array).  With ``object_mask``
    (``i → [H, W]`` bool, the object's pixels) items are ``(x, y, mask)``.  ``preprocess_many``
    (images → ``[B, C, H, W]``, equal to ``preprocess`` of each) serves a batch of items at once.
    Unlabelled images (``labels`` and ``label_of`` ``None``) are dict items ``{"pixel_values": x}``
    (with ``"ground_truth": mask``)."""

    def __init__(
        self,
        sources: Sequence[Any],
        labels: Sequence[Any] | None,
        read: Callable[[Any], Any],
        preprocess: Callable[[Any], torch.Tensor],
        label_of: Callable[[Any], int] | None,
        classes: Sequence[str],
        object_mask: Callable[[int], torch.Tensor] | None = None,
        preprocess_many: Callable[[list[Any]], torch.Tensor] | None = None,
    ):
        self.sources, self.labels = sources, labels
        self.read, self.preprocess, self.label_of = read, preprocess, label_of
        self.classes = list(classes)
        self.object_mask = object_mask
        self.preprocess_many = preprocess_many

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...] | dict[str, torch.Tensor]:
        return self._item(i, self.sources[i], None if self.labels is None else self.labels[i])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, ...] | dict[str, torch.Tensor]]:
        """The items at ``indices`` (a DataLoader's batch): a Hugging Face column is read once for
        them all (~20× faster per example than one access each), the images preprocessed at once
        with ``preprocess_many``."""
        sources = take(self.sources, indices)
        labels = [None] * len(indices) if self.labels is None else take(self.labels, indices)
        if self.preprocess_many is None:
            return [self._item(i, s, y) for i, s, y in zip(indices, sources, labels)]
        xs = self.preprocess_many([self.read(s) for s in sources])
        return [self._item(i, None, y, x) for i, y, x in zip(indices, labels, xs)]

    def _item(
        self, i: int, source: Any, label: Any, x: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...] | dict[str, torch.Tensor]:
        x = self.preprocess(self.read(source)) if x is None else x
        if self.label_of is None:
            item = {"pixel_values": x}
            return item if self.object_mask is None else {**item, "ground_truth": self.object_mask(i)}
        y = torch.tensor(self.label_of(label), dtype=torch.long)
        return (x, y) if self.object_mask is None else (x, y, self.object_mask(i))


def take(values: Sequence[Any], indices: Sequence[int]) -> list[Any]:
    """``values[i]`` for every ``i`` of ``indices``: one read of a Hugging Face column (or numpy
    array), an index each of a list or tuple."""
    if isinstance(values, (list, tuple)):
        return [values[i] for i in indices]
    return list(values[list(indices)])  # type: ignore[call-overload]
