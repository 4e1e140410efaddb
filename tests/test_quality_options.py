"""The generator changes of docs/quality.md (the "sopfast" recipe; off in the "paper" recipe): exact
semantics when on."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.model.checkpoint import save_pretrained
from sopfast.model.generator import GroupGenerator, diverse_positions
from sopfast.testing import make_bert, make_hf_vit, text_batch


def test_the_paper_recipe_keeps_the_authors_algorithm():
    model = sopfast.SOP(make_hf_vit(), recipe="paper")
    assert (model.generator.center, model.generator.queries) == (False, "fixed")
    assert all(p.requires_grad for p in model.projection.layers[0].parameters())


def test_diverse_positions_is_farthest_point_sampling():
    points = torch.tensor([[0.0], [0.1], [1.0], [5.0], [4.9], [0.2]]).unsqueeze(0)
    valid = torch.ones(1, 6, dtype=torch.bool)
    # mean 1.87: 5.0 is farthest from it, then 0.0 (farthest from 5.0), then 1.0 (1.0 from the taken), then 0.2.
    assert diverse_positions(points, valid, 4).tolist() == [[3, 0, 2, 5]]
    valid[0, 3] = False
    assert diverse_positions(points, valid, 2).tolist() == [[4, 0]]
    assert diverse_positions(points[:, :2], valid[:, :2], 3).tolist() == [[0, 1, 0]]


def test_centring_ignores_a_direction_shared_by_every_feature():
    torch.manual_seed(0)
    emb = torch.randn(2, 9, 8)
    valid = torch.ones(2, 9, dtype=torch.bool)
    shift = 50 * torch.randn(1, 1, 8)
    centred = GroupGenerator(8, center=True)
    torch.testing.assert_close(centred.logits(emb + shift, valid, 4, None), centred.logits(emb, valid, 4, None))
    plain = GroupGenerator(8)
    plain.load_state_dict(centred.state_dict())
    assert not torch.allclose(plain.logits(emb + shift, valid, 4, None), plain.logits(emb, valid, 4, None))


def test_centring_uses_only_candidate_tokens():
    torch.manual_seed(0)
    gen = GroupGenerator(8, center=True, queries="diverse")
    emb = torch.randn(1, 7, 8)
    valid = torch.tensor([[True, True, True, True, True, False, False]])
    noisy = emb.clone()
    noisy[0, 5:] = 1e3
    torch.testing.assert_close(gen.logits(noisy, valid, 3, None)[..., :5], gen.logits(emb, valid, 3, None)[..., :5])


def test_diverse_queries_give_distinct_groups_on_repeated_features():
    """Half the features identical (a plain background): the fixed rows repeat groups, diverse rows do not."""
    torch.manual_seed(0)
    emb = torch.randn(1, 20, 16)
    emb[0, :10] = emb[0, :1]
    valid = torch.ones(1, 20, dtype=torch.bool)
    fixed = GroupGenerator(16, scale=0.1)
    diverse = GroupGenerator(16, scale=0.1, queries="diverse")
    diverse.load_state_dict(fixed.state_dict())
    count = lambda g: len({tuple(r.tolist()) for r in g(emb, valid, 6, 0.2).mask[0]})
    assert count(fixed) < 6 and count(diverse) == 6


@pytest.mark.parametrize("heads", [1, 2])
def test_diverse_queries_with_heads_split_rows_between_heads(heads):
    torch.manual_seed(0)
    gen = GroupGenerator(8, num_heads=heads, queries="diverse")
    emb = torch.randn(2, 10, 8)
    valid = torch.ones(2, 10, dtype=torch.bool)
    s = gen.logits(emb, valid, 4, None)
    pos = diverse_positions(emb, valid, 4)
    for j in range(4):
        w = gen.heads[j * heads // 4]
        q = emb[torch.arange(2), pos[:, j]] @ w[16:].t()
        torch.testing.assert_close(s[:, j], (q.unsqueeze(1) @ (emb @ w[8:16].t()).transpose(1, 2)).squeeze(1))


def test_text_model_with_options_trains_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = sopfast.SOP(
        make_bert(), num_groups=3, tau=0.3, center_embeddings=True, queries="diverse", freeze_projection=True
    )
    assert not any(p.requires_grad for p in model.projection.parameters())
    ids, mask, types = text_batch()
    out = model(ids, mask, types)
    out.loss(torch.tensor([0, 1, 1])).backward()
    assert model.generator.heads[0].grad is not None and model.generator.heads[0].grad.abs().sum() > 0
    save_pretrained(model, tmp_path)
    loaded = sopfast.SOP.from_pretrained(tmp_path, model.backbone).eval()
    assert (loaded.generator.center, loaded.generator.queries) == (True, "diverse")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask, types).logits, model.eval()(ids, mask, types).logits)


def test_bad_queries_option_names_what_is_allowed():
    with pytest.raises(ValueError, match=r"queries must be one of \('fixed', 'diverse'\), got 'random'"):
        sopfast.SOP(make_hf_vit(), queries="random")


def test_text_pages_leave_out_padding(tmp_path):
    from sopfast.model.pictures import explain_text

    model = sopfast.SOP(make_bert(), num_groups=3, tau=0.3).eval()
    ids, mask, types = text_batch(pairs=False)
    with torch.no_grad():
        out = model(ids[2:], mask[2:], types[2:])
    tokens = [f"tok{i}" if m else "[PAD]" for i, m in enumerate(mask[2].tolist())]
    explain_text(tokens, out, 0, str(tmp_path / "t.html"), shown=mask[2])
    page = (tmp_path / "t.html").read_text()
    assert "[PAD]" not in page and "tok7" in page
    with pytest.raises(ValueError, match="shown must have one entry per token"):
        explain_text(tokens, out, 0, str(tmp_path / "u.html"), shown=mask[2, :5])


def test_attention_overlap_by_hand():
    from sopfast.model.losses import attention_overlap

    a = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.6, 0.8, 0.0]]])
    # pairs (0,1) 0, (0,2) 0.6, (1,2) 0.8, each counted twice over 3·2 ordered pairs
    assert float(attention_overlap(a)) == pytest.approx((0.6 + 0.8) * 2 / 6)
    assert float(attention_overlap(a, valid=torch.tensor([[True, False, True]]))) == pytest.approx(2 / 6)
    assert float(attention_overlap(a[:, :1])) == 0.0


def test_diversity_weight_adds_the_overlap_to_the_training_loss():
    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25, diversity_weight=0.5)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    out = model(x)
    plain = sopfast.SOPOutput(**{k: v for k, v in vars(out).items() if k != "penalty"})
    from sopfast.model.losses import attention_overlap

    overlap = attention_overlap(out.attention)
    torch.testing.assert_close(out.loss(y), plain.loss(y) + 0.5 * overlap)
    out.loss(y).backward()
    assert model.generator.heads[0].grad.abs().sum() > 0
    assert type(model.eval()(x)) is sopfast.SOPOutput
    with pytest.raises(ValueError, match=r"diversity_weight must be a finite number ≥ 0\.0, got -1"):
        sopfast.SOP(make_hf_vit(), diversity_weight=-1)


def test_normalized_logits_fix_the_sharpness_to_gamma():
    torch.manual_seed(0)
    gen = GroupGenerator(8, scale=2.0, normalize_logits=True)
    emb = torch.randn(2, 9, 8)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 6:] = False
    s = gen.logits(emb, valid, 3, None)
    row = s[1, :, :6]
    torch.testing.assert_close(row.mean(-1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(row.var(-1, unbiased=False), torch.full((3,), 4.0), atol=1e-3, rtol=0)
    for w in gen.heads:
        w.data *= 10
    torch.testing.assert_close(gen.logits(emb, valid, 3, None)[1, :, :6], row, atol=1e-4, rtol=0)


def test_saliency_alignment_by_hand():
    from sopfast.model.losses import saliency_alignment

    a = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]])
    s = torch.tensor([[3.0, 0.0, -3.0]])
    z = 3 / 6**0.5
    assert float(saliency_alignment(a, s)) == pytest.approx(-(z + 0.5 * -z) / 2)
    masked = saliency_alignment(a, s, valid=torch.tensor([[True, False, True]]))
    assert float(masked) == pytest.approx(-(1.0 + 0.5 * -1.0) / 2)
    with pytest.raises(ValueError, match="saliency"):
        saliency_alignment(a, s[:, :2])


def test_feature_saliency_is_the_presence_gradient_of_the_predicted_class():
    from sopfast.evaluation.baselines import soft_forward
    from sopfast.model.losses import feature_saliency

    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25)
    x = torch.randn(2, 3, 32, 32)
    sal = feature_saliency(model, model.prepare(x), 0.25)
    target = model.backbone(pixel_values=x).logits.argmax(-1)
    z = torch.full((2, 16), 0.25, requires_grad=True)
    picked = soft_forward(model, model.prepare(x), z).gather(1, target.view(-1, 1)).sum()
    torch.testing.assert_close(sal, torch.autograd.grad(picked, z)[0])
    assert not sal.requires_grad


def test_saliency_weight_adds_its_term_and_trains_the_generator():
    from sopfast.model.losses import feature_saliency, saliency_alignment

    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25, saliency_weight=2.0, diversity_weight=0.0)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    out = model(x)
    expected = saliency_alignment(out.attention, feature_saliency(model, model.prepare(x), 0.25))
    torch.testing.assert_close(out.penalty, 2.0 * expected)
    out.loss(y).backward()
    assert model.generator.heads[0].grad.abs().sum() > 0
    assert all(p.grad is None for p in model.backbone.parameters())
