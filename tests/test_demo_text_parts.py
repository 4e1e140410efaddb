"""The text demo's split of the compared texts into long and short parts (``sopfast.demo.text.text_parts``)."""

import torch

from sopfast.data.datasets import TextDataset
from sopfast.demo.text import LONG_TEXT, text_parts


def _texts(lengths: list[int]) -> TextDataset:
    """Texts of the given token counts, padded to the longest."""
    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    ids = mask * 5
    encoded = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return TextDataset(encoded, torch.zeros(len(lengths), dtype=torch.long))


def _sizes(parts: dict) -> dict[str, tuple[int, int]]:
    return {name: (len(loader.dataset), len(curves.dataset)) for name, (loader, curves) in parts.items()}


def test_a_part_of_one_text_among_many_still_gets_a_curve_text():
    """23 long texts and one short one: 8 curve texts in proportion would give the short part 0, and its
    curve loader would yield no batch; each part with texts gets at least one."""
    parts = text_parts(_texts([LONG_TEXT + 2] * 23 + [3]), n_curve=8)
    assert _sizes(parts) == {"long": (23, 8), "short": (1, 1)}


def test_curve_texts_are_shared_in_proportion_and_empty_parts_left_out():
    assert _sizes(text_parts(_texts([LONG_TEXT] * 30 + [4] * 10), n_curve=8)) == {"long": (30, 6), "short": (10, 2)}
    assert _sizes(text_parts(_texts([LONG_TEXT - 1] * 5), n_curve=8)) == {"short": (5, 5)}
