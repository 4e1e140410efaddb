"""bench/quality/agreement_research.py's ``--outline`` (issue #41): which blank patches border a lit one, and
where a SOP's group patches lie (on the object, lit off it, blank beside a lit patch, blank farther)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import sopfast
from sopfast.testing import make_hf_vit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "quality"))
from agreement_research import PLACES, bordering_lit, far_blank, patch_places


def test_bordering_lit_marks_every_lit_cell_and_its_8_neighbours():
    blank = torch.ones(2, 4, 4, dtype=torch.bool)
    blank[0, 1, 1] = False
    blank[1, 3, 0] = False
    near = bordering_lit(blank.flatten(1), (4, 4)).view(2, 4, 4)
    expected = torch.zeros(2, 4, 4, dtype=torch.bool)
    expected[0, :3, :3] = True
    expected[1, 2:, :2] = True
    assert torch.equal(near, expected)


def _images() -> tuple[torch.Tensor, torch.Tensor]:
    """6 images of 32×32 (a 4×4 grid of 8-pixel patches): one lit patch at the top left, the rest plain
    background, and the object mask of that patch's top left quarter (too little for the patch to count as on
    the object)."""
    x = torch.zeros(6, 3, 32, 32)
    x[:, :, :8, :8] = 0.5 + torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    masks = torch.zeros(6, 32, 32)
    masks[:, :4, :4] = 1.0
    return x, masks


@pytest.mark.parametrize("ranked_last", ["all", "far", "none"])
def test_patch_places_count_every_group_patch_once(ranked_last):
    x, masks = _images()
    model = sopfast.SOP(make_hf_vit(num_labels=3).eval(), num_groups=3, tau=0.5).eval()
    model.demote_blank = ranked_last != "none"
    if ranked_last == "far":
        model.demoted = lambda inputs: far_blank(model, inputs)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(6).long(), masks), batch_size=4)
    places = patch_places(model, loader)
    assert list(places) == [key for key, _ in PLACES]
    assert sum(places.values()) == pytest.approx(1.0)
    # A group keeps 8 of the 16 patches: the lit one (a quarter of it object: "lit, off the garment"), its 3
    # blank neighbours, and 12 blank patches farther out to choose the rest from.
    assert places["garment"] == 0.0
    if ranked_last == "all":
        # every patch but the lit one is blank, so the groups cannot avoid blank ones: the generator ranks
        # them last, and the lit patch is in every group
        assert places["lit_off_garment"] == pytest.approx(1 / 8)
    if ranked_last == "far":
        # the lit patch and its 3 blank neighbours come first, then 4 of the farther ones
        assert places["lit_off_garment"] == pytest.approx(1 / 8)
        assert places["blank_bordering"] == pytest.approx(3 / 8)
        assert places["blank_far"] == pytest.approx(4 / 8)
