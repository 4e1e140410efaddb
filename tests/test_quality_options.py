"""The generator changes of docs/quality.md (the "sopfast" recipe; off in the "paper" recipe): exact
semantics when on."""

from __future__ import annotations

import math

import pytest
import torch

import sopfast
from sopfast.evaluation.methods import SOPMethod
from sopfast.model.checkpoint import save_pretrained
from sopfast.model.generator import GroupGenerator, diverse_positions, gumbel_noise
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
    model = sopfast.SOP(
        make_hf_vit(), num_groups=4, tau=0.25, diversity_weight=0.5, saliency_weight=0.0, sufficiency_weight=0.0
    )
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    out = model(x)
    plain = sopfast.SOPOutput(**{k: v for k, v in vars(out).items() if k != "penalty_terms"})
    from sopfast.model.losses import attention_overlap

    overlap = attention_overlap(out.attention)
    torch.testing.assert_close(out.loss(y), plain.loss(y) + 0.5 * overlap)
    terms = out.loss_terms(y)  # logged apart by sopfast.train (issue #32)
    assert set(terms) == {"task_loss", "diversity_penalty"}
    torch.testing.assert_close(terms["task_loss"], plain.loss(y))
    torch.testing.assert_close(terms["task_loss"] + terms["diversity_penalty"], out.loss(y))
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


def test_mean_saliency_runs_the_full_input_once_and_equals_the_levels_mean():
    from sopfast.model.losses import feature_saliency, mean_saliency

    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25)
    inputs = model.prepare(torch.randn(3, 3, 32, 32))
    levels = (0.1, 0.5, 0.9)
    expected = torch.stack([feature_saliency(model, inputs, z) for z in levels]).mean(dim=0)
    calls = []
    model.backbone.register_forward_hook(lambda *_: calls.append(1))
    inputs = model.prepare(inputs.pixels.clone())  # new tensors: the full input is not known yet
    assert torch.equal(mean_saliency(model, inputs, levels), expected)
    assert len(calls) == len(levels) + 1  # one soft forward per level, the full input once


def test_saliency_weight_adds_its_term_and_trains_the_generator():
    from sopfast.model.losses import feature_saliency, saliency_alignment

    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), recipe="paper", num_groups=4, tau=0.25, saliency_weight=2.0)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    out = model(x)
    expected = saliency_alignment(out.attention, feature_saliency(model, model.prepare(x), 0.25))
    torch.testing.assert_close(out.penalty, 2.0 * expected)
    out.loss(y).backward()
    assert model.generator.heads[0].grad.abs().sum() > 0
    assert all(p.grad is None for p in model.backbone.parameters())


# -- the options of the group-quality research (docs/quality.md, "Research (issue #11)") -------------
def test_key_score_starts_at_zero_and_leaves_an_untrained_model_unchanged():
    x = torch.randn(2, 3, 32, 32)
    options = dict(recipe="paper", num_groups=4, tau=0.25, normalize_logits=True, center_embeddings=True)
    torch.manual_seed(0)
    plain = sopfast.SOP(make_hf_vit(), **options).eval()
    torch.manual_seed(0)
    keyed = sopfast.SOP(make_hf_vit(), key_score=True, **options).eval()
    assert plain.generator.key_score is None and keyed.generator.key_score.shape == (32,)
    assert not keyed.generator.key_score.any()
    with torch.no_grad():
        torch.testing.assert_close(keyed(x).logits, plain(x).logits)
        keyed.generator.key_score.normal_()
        assert not torch.allclose(keyed(x).attention, plain(x).attention)


def test_key_score_adds_the_same_score_to_every_row():
    torch.manual_seed(0)
    emb, valid = torch.randn(2, 9, 8), torch.ones(2, 9, dtype=torch.bool)
    plain = GroupGenerator(8, scale=2.0)
    keyed = GroupGenerator(8, scale=2.0, key_score=True)
    keyed.heads.load_state_dict(plain.heads.state_dict())
    keyed.key_score.data = torch.randn(8)
    added = keyed.logits(emb, valid, 3, None) - plain.logits(emb, valid, 3, None)
    torch.testing.assert_close(added, (2.0 * emb @ keyed.key_score).unsqueeze(1).expand(2, 3, 9))


def test_unit_lambda_predicts_with_lambda_one_and_still_trains_the_generator():
    from sopfast.ops import aggregate

    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(0)
    plain = sopfast.SOP(make_hf_vit(), recipe="paper", num_groups=4, tau=0.25).train()
    torch.manual_seed(0)
    unit = sopfast.SOP(make_hf_vit(), recipe="paper", num_groups=4, tau=0.25, unit_lambda=True).train()
    out, ref = unit(x), plain(x)
    assert torch.equal(out.group_masks, ref.group_masks) and not torch.allclose(ref.lam, torch.ones_like(ref.lam))
    torch.testing.assert_close(out.lam, torch.ones_like(out.lam))
    torch.testing.assert_close(out.logits, aggregate(out.group_scores, torch.ones_like(out.lam), out.group_logits))
    out.loss(torch.tensor([0, 1])).backward()
    ref.loss(torch.tensor([0, 1])).backward()
    assert float(unit.generator.heads[0].grad.abs().sum()) > 0
    lam_grad = torch.autograd.grad(unit(x).logits.sum(), unit.generator.heads[0])[0]
    assert float(lam_grad.abs().sum()) > 0


def test_saliency_kl_by_hand():
    from sopfast.model.losses import saliency_kl

    a = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]])
    s = torch.tensor([[3.0, 0.0, -3.0]])

    def kl(p, q):
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))

    def softmax(v):
        e = [math.exp(t) for t in v]
        return [t / sum(e) for t in e]

    z = 3 / 6**0.5  # s standardised: (3, 0, -3) / √6
    p = softmax([2 * z, 0.0, -2 * z])
    expected = (kl(p, [0.5, 0.25, 0.25]) + kl(p, [0.2, 0.3, 0.5])) / 2
    assert float(saliency_kl(a, s, gamma=2.0)) == pytest.approx(expected, rel=1e-5)
    p = softmax([2.0, -2.0])  # over features 0 and 2 only: standardised (1, -1)
    expected = (kl(p, [0.5, 0.25]) + kl(p, [0.2, 0.5])) / 2
    masked = saliency_kl(a, s, valid=torch.tensor([[True, False, True]]), gamma=2.0)
    assert float(masked) == pytest.approx(expected, rel=1e-5)
    assert float(saliency_kl(a[:, :0], s)) == 0.0
    with pytest.raises(ValueError, match="saliency"):
        saliency_kl(a, s[:, :2])


def test_saliency_kl_at_levels_is_the_penalty_and_trains_the_key_score():
    from sopfast.model.losses import feature_saliency, saliency_kl

    torch.manual_seed(0)
    model = sopfast.SOP(
        make_hf_vit(),
        recipe="paper",
        num_groups=4,
        tau=0.25,
        normalize_logits=True,
        group_gen_scale=2.0,
        key_score=True,
        saliency_weight=2.0,
        saliency_loss="kl",
        saliency_levels=(0.2, 0.6),
    ).train()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    out = model(x)
    inputs = model.prepare(x)
    teacher = (feature_saliency(model, inputs, 0.2) + feature_saliency(model, inputs, 0.6)) / 2
    torch.testing.assert_close(out.penalty, 2.0 * saliency_kl(out.attention, teacher, gamma=2.0))
    out.loss(y).backward()
    assert float(model.generator.key_score.grad.abs().sum()) > 0
    assert all(p.grad is None for p in model.backbone.parameters())


def test_demoted_features_rank_last_and_give_no_query_rows():
    torch.manual_seed(0)
    gen = GroupGenerator(8)
    emb = torch.randn(2, 10, 8)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, 8:] = False
    demote = torch.zeros(2, 10, dtype=torch.bool)
    demote[0, :4] = True
    demote[1] = True  # every feature of example 1: nothing is demoted there
    s = gen.logits(emb, valid, 3, None, demote)
    kept = valid & ~demote
    kept[1] = valid[1]
    # the rows are those of the non-demoted features as queries
    torch.testing.assert_close(s[0, :, 4:], gen.logits(emb[:1], kept[:1], 3, None)[0, :, 4:])
    torch.testing.assert_close(s[0, :, :4], (s[0, :, 4:].amin(-1, keepdim=True) - 2).expand(3, 4))
    torch.testing.assert_close(s[1], gen.logits(emb[1:], valid[1:], 3, None)[0])
    diverse = GroupGenerator(8, queries="diverse")
    diverse.load_state_dict(gen.state_dict())
    taken = diverse_positions(emb[:1], kept[:1], 3)
    q = emb[0, taken[0]] @ gen.heads[0][16:].t()
    torch.testing.assert_close(
        diverse.logits(emb[:1], valid[:1], 3, None, demote[:1])[0, :, 4:], q @ (emb[0, 4:] @ gen.heads[0][8:16].t()).t()
    )


def test_demote_blank_leaves_background_patches_out_of_the_groups():
    model = sopfast.SOP(make_hf_vit(), recipe="paper", num_groups=4, tau=0.25, mode="drop", demote_blank=True)
    x = torch.rand(2, 3, 32, 32) * 1.8 - 0.9
    x[:, :, :16] = -1.0  # the top half is plain background (the darkest value)
    x[1, 0, 2, 2] = -0.5  # one lit pixel in patch 0 of image 1
    blank = model.adapter.blank_features(model.prepare(x))
    assert blank[0].tolist() == [True] * 8 + [False] * 8 and blank[1].sum() == 7 and not blank[1, 0]
    with torch.no_grad():
        out = model.eval()(x)
    assert not (out.group_masks & blank.unsqueeze(1)).any()
    rows = blank.unsqueeze(1).expand_as(out.attention)
    low_blank = out.attention.masked_fill(~rows, 0).amax(-1)
    assert (low_blank < out.attention.masked_fill(rows, 1).amin(-1)).all()  # every blank below every other
    method, inputs = SOPMethod(), model.prepare(x)  # evaluation re-binarises the same demoted logits
    assert torch.equal(method.groups(model, method.prepare(model, inputs, "drop"), 0.25, True).mask, out.group_masks)
    flat = torch.zeros(1, 3, 32, 32)
    assert model.adapter.blank_features(model.prepare(flat)).all()


def test_keep_special_tokens_never_groups_cls_or_sep_and_always_runs_them():
    ids, mask, types = text_batch()
    torch.manual_seed(0)
    model = sopfast.SOP(make_bert(), recipe="paper", num_groups=3, tau=0.3, mode="drop", keep_special_tokens=True)
    inputs = model.prepare(ids, mask, types)
    special = model.adapter.special_tokens(inputs)
    # [CLS] at 0 and the last token of the first segment ([SEP]; rows 0 and 1 end it at 9 and 7)
    assert special[:, 0].all() and special[0, 9] and special[1, 7] and special[2, 7] and int(special.sum()) == 6
    assert not (model.adapter.candidates(inputs) & special).any()
    assert (model.adapter.always_kept(inputs) >= special).all()
    assert torch.equal(model.adapter.blank_features(inputs), special)  # what demote_blank ranks last
    with torch.no_grad():
        out = model.eval()(ids, mask, types)
        exact = model(ids, mask, types, mode="exact")
    assert not (out.group_masks & special.unsqueeze(1)).any()
    torch.testing.assert_close(out.group_logits, exact.group_logits, atol=1e-5, rtol=1e-4)
    # a group's pass is the backbone on its words + [CLS]/[SEP] + the second segment, the rest [PAD]
    keep = out.group_masks[0, 1] | special[0] | (types[0] == 1)
    masked = sopfast.types.FeatureInputs(
        input_ids=torch.where(keep, ids[0], 0)[None],
        attention_mask=(mask[0] * keep)[None],
        token_type_ids=types[0][None],
    )
    with torch.no_grad():
        torch.testing.assert_close(
            model.adapter.full_forward(masked)[0][0], out.group_logits[0, 1], atol=1e-5, rtol=1e-4
        )
    with pytest.raises(ValueError, match="keep_special_tokens=True needs a text backbone with special tokens"):
        sopfast.SOP(make_hf_vit(), keep_special_tokens=True)


def test_research_options_survive_a_checkpoint(tmp_path):
    model = sopfast.SOP(
        make_bert(),
        recipe="paper",
        num_groups=3,
        tau=0.3,
        key_score=True,
        unit_lambda=True,
        demote_blank=True,
        keep_special_tokens=True,
        saliency_weight=1.0,
        saliency_loss="kl",
        saliency_levels=(0.2, 0.6),
    )
    with torch.no_grad():
        model.generator.key_score.normal_()
    save_pretrained(model, tmp_path)
    again = sopfast.SOP.from_pretrained(tmp_path, model.backbone).eval()
    torch.testing.assert_close(again.generator.key_score, model.generator.key_score)
    assert again.unit_lambda and again.demote_blank and again.adapter.keep_special_tokens
    assert (again.saliency_loss, again.saliency_levels) == ("kl", (0.2, 0.6))
    ids, mask, types = text_batch()
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask, types).logits, model.eval()(ids, mask, types).logits)


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"saliency_loss": "key"}, ValueError, r"saliency_loss must be one of \('align', 'kl'\), got 'key'"),
        ({"saliency_levels": (0.2, 1.5)}, ValueError, r"saliency_levels\[1\] must lie in \(0, 1\], got 1.5"),
        ({"saliency_levels": ()}, ValueError, r"saliency_levels must be a non-empty sequence .* got \(\)"),
        ({"saliency_levels": "0.2"}, ValueError, r"saliency_levels must be a non-empty sequence .* got '0.2'"),
        ({"saliency_levels": (0.2, "a")}, TypeError, r"saliency_levels\[1\] must be a float in \(0, 1\], got 'a'"),
        ({"explore": -0.5}, ValueError, r"explore must be a finite number ≥ 0.0, got -0.5"),
        ({"explore": "a"}, TypeError, r"explore must be a finite number ≥ 0.0, got 'a' \(str\)"),
    ],
)
def test_bad_research_options_name_what_is_allowed(options, error, match):
    with pytest.raises(error, match=match):
        sopfast.SOP(make_hf_vit(), **options)


def test_gumbel_noise_is_standard_gumbel():
    torch.manual_seed(0)
    sample = gumbel_noise(torch.empty(200_000))
    assert abs(float(sample.mean()) - 0.5772) < 0.01  # the Euler–Mascheroni constant
    assert abs(float(sample.var()) - math.pi**2 / 6) < 0.03
    assert bool(torch.isfinite(sample).all())


def test_explore_draws_groups_near_the_generators_own_in_training_only():
    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=6, tau=0.25, explore=0.5)
    inputs = model.prepare(torch.randn(4, 3, 32, 32))
    own = model.eval().make_groups(inputs).mask
    assert torch.equal(model.make_groups(inputs).mask, own)  # evaluation: no noise
    model.train()
    torch.manual_seed(1)
    drawn = model.make_groups(inputs)
    torch.manual_seed(2)
    again = model.make_groups(inputs).mask
    assert not torch.equal(drawn.mask, own) and not torch.equal(again, drawn.mask)
    kept = (drawn.mask & own).sum() / own.sum()
    assert 0.5 < float(kept) < 1.0  # near the generator's choice, not a random group
    drawn.lam.sum().backward()
    assert model.generator.heads[0].grad is not None and model.generator.heads[0].grad.abs().sum() > 0
    model.explore = 0.0
    assert torch.equal(model.make_groups(inputs).mask, own)
