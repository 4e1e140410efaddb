"""sopfast.metrics: each metric on a small synthetic case computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from sopfast.evaluation import metrics as M


def _assert_close(value: torch.Tensor | float, expected: float, tol: float = 1e-6) -> None:
    assert float(value) == pytest.approx(expected, abs=tol)


def test_accuracy_and_error():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 2.0], [5.0, 0.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 0])
    _assert_close(M.accuracy(logits, labels), 0.75)
    _assert_close(M.error(logits, labels), 0.25)
    assert M.accuracy(logits, labels, reduction="none").tolist() == [1.0, 1.0, 0.0, 1.0]


def test_mse_per_output_and_single_output():
    preds = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    targets = torch.tensor([[0.0, 2.0], [1.0, 1.0]])
    assert M.mse(preds, targets, reduction="none").tolist() == [0.5, 1.0]
    _assert_close(M.mse(preds, targets), 0.75)
    _assert_close(M.mse(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])), 2.5)


def test_fidelity_hand_value_and_zero_for_exact_sums():
    logits = torch.tensor([[0.0, 0.0]])
    attributions = torch.tensor([[[0.0], [math.log(3.0)]]])
    _assert_close(M.fidelity(logits, attributions), 0.5 * math.log(4.0 / 3.0))
    alpha = torch.randn(5, 4, 7)
    assert float(M.fidelity(alpha.sum(-1), alpha)) < 1e-6


def _step_logits(probs: list[list[list[float]]]) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_insertion_is_auc_relative_to_full_input():
    steps = _step_logits([[[0.6, 0.4], [0.3, 0.7], [0.2, 0.8]]])
    assert M.probability_curve(steps).flatten().tolist() == pytest.approx([0.6, 0.7, 0.8])
    _assert_close(M.insertion(steps), 0.7 / 0.8)
    _assert_close(M.curve_auc(M.probability_curve(steps)), 0.7)


def test_deletion_scores_a_switched_prediction_as_one():
    steps = _step_logits([[[0.6, 0.4], [0.3, 0.7], [0.2, 0.8]]])
    assert M.probability_curve(steps, penalize_switch=True).flatten().tolist() == pytest.approx([1.0, 0.7, 0.8])
    _assert_close(M.deletion(steps), (2.5 / 3) / 0.8)


def test_mse_curve_and_sparsity_curve():
    curve = M.mse_curve(torch.tensor([[[1.0], [2.0]]]), torch.tensor([1.0]))
    assert curve.tolist() == [[0.0, 1.0]]
    _assert_close(M.curve_auc(curve), 0.5)
    outputs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]])
    assert M.sparsity_curve(outputs, torch.tensor([0, 0]), [0.5, 1.0]) == {0.5: 1.0, 1.0: 0.5}


MASKS = torch.tensor([[[1, 1, 0, 0], [0, 1, 1, 1]]], dtype=torch.bool)
GT = torch.tensor([[0, 1, 1, 0]], dtype=torch.bool)


def test_iou_coverage_object_ratio():
    _assert_close(M.group_iou(MASKS, GT), (1 / 3 + 2 / 3) / 2)
    _assert_close(M.group_coverage(MASKS, GT), (1 / 2 + 1) / 2)
    _assert_close(M.object_ratio(MASKS, GT), (1 / 2 + 2 / 3) / 2)
    _assert_close(M.group_iou(MASKS, GT, used=torch.tensor([[True, False]])), 1 / 3)


def test_empty_ground_truth_is_left_out_of_the_mean():
    masks = torch.cat([MASKS, MASKS])
    gt = torch.cat([GT, torch.zeros_like(GT)])
    values = M.group_iou(masks, gt, reduction="none")
    assert math.isnan(float(values[1]))
    _assert_close(M.group_iou(masks, gt), 0.5)


def test_object_ratio_by_correctness():
    out = M.object_ratio_by_correctness(
        torch.tensor([0.5, 1.0, 0.25, float("nan")]), torch.tensor([True, True, False, False])
    )
    assert out == {"correct": 0.75, "incorrect": 0.25, "num_correct": 2, "num_incorrect": 2}


GROUPS = torch.tensor([[[1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0]]], dtype=torch.bool)


def test_distinct_groups_counts_unique_masks():
    _assert_close(M.distinct_groups(GROUPS), 2)
    _assert_close(M.distinct_groups(GROUPS, used=torch.tensor([[True, True, False]])), 1)
    _assert_close(M.distinct_groups(GROUPS, used=torch.tensor([[False, True, True]])), 2)
    _assert_close(M.distinct_groups(GROUPS, used=torch.zeros(1, 3, dtype=torch.bool)), 0)
    padded = torch.tensor([[[1, 0, 1, 0], [1, 0, 0, 0]]], dtype=torch.bool)
    _assert_close(M.distinct_groups(padded), 2)
    _assert_close(M.distinct_groups(padded, valid=torch.tensor([[True, True, False, False]])), 1)


def test_pairwise_iou_averages_the_pairs():
    _assert_close(M.pairwise_iou(GROUPS), (1 + 1 / 3 + 1 / 3) / 3)
    _assert_close(M.pairwise_iou(GROUPS, used=torch.tensor([[True, False, True]])), 1 / 3)
    assert math.isnan(float(M.pairwise_iou(GROUPS, used=torch.tensor([[True, False, False]]))))
    disjoint = torch.eye(4, dtype=torch.bool).unsqueeze(0)
    _assert_close(M.pairwise_iou(disjoint), 0.0)


def test_union_coverage_and_groups_used():
    _assert_close(M.union_coverage(GROUPS), 3 / 4)
    _assert_close(M.union_coverage(GROUPS, valid=torch.tensor([[True, True, True, False]])), 1.0)
    _assert_close(M.union_coverage(GROUPS, used=torch.tensor([[True, False, False]])), 2 / 4)
    used = torch.tensor([[True, False, True], [False, False, False]])
    assert M.groups_used(used, reduction="none").tolist() == [2.0, 0.0]
    _assert_close(M.groups_used(used), 1.0)


def test_group_diversity_collects_every_measure():
    out = M.group_diversity(GROUPS, used=torch.tensor([[True, True, False]]))
    assert set(out) == set(M.DIVERSITY)
    values = {k: float(v[0]) for k, v in out.items()}
    assert values == pytest.approx(
        {
            "distinct_groups": 2.0,
            "pairwise_iou": 5 / 9,
            "union_coverage": 0.75,
            "groups_used": 2.0,
            "distinct_used_groups": 1.0,
        }
    )


def _cosmo_case() -> tuple[torch.Tensor, torch.Tensor]:
    """A 10-pixel map: σ ≈ 3.30, so only the 10 is above 3σ; four groups with known verdicts."""
    x = torch.tensor([[-1.0, -1, -1, -1, 0.5, 0.5, 0.5, 0.5, 0.5, 10.0]])
    groups = [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8, 9], [0, 1, 4, 5, 6], [0, 1, 2, 9]]
    masks = torch.zeros(1, 4, 10, dtype=torch.bool)
    for i, g in enumerate(groups):
        masks[0, i, g] = True
    return masks, x


def test_cosmogrid_alignment():
    void, cluster = M.cosmogrid_alignment(*_cosmo_case())
    assert void.flatten().tolist() == pytest.approx([0.8, 0.0, 0.4, 0.0])
    assert cluster.flatten().tolist() == pytest.approx([0.0, 1 / 6, 0.0, 0.25])


def test_cosmogrid_purity_per_output_and_thresholds():
    masks, x = _cosmo_case()
    used = torch.tensor([[[True, False, True, False], [False, True, False, True]]])
    _assert_close(M.cosmogrid_purity(masks, x, used), ((0.5 + 0.0) / 2 + (0.5 + 0.5) / 2) / 2)
    _assert_close(M.cosmogrid_purity(masks, x, used, tau_v=0.3), ((0.5 + 0.5) / 2 + 0.5) / 2)
    _assert_close(M.cosmogrid_purity(masks, x), (0.5 + 0.5 + 0.0 + 0.5) / 4)


def test_leakage_probe_finds_a_planted_label_and_not_noise():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (60,), generator=g)
    noise = torch.rand(60, 4, 5, generator=g) > 0.5
    leaky = noise.clone()
    leaky[:, 0, :3] = torch.nn.functional.one_hot(labels, 3).bool()
    out = M.leakage_probe(leaky, labels)
    assert out["accuracy"] == 1.0 and out["num_train"] == 30 and out["num_test"] == 30
    labels = torch.randint(0, 2, (400,), generator=g)
    out = M.leakage_probe(torch.rand(400, 8, generator=g) > 0.5, labels)
    assert abs(out["accuracy"] - out["chance"]) < 0.1


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.group_iou(MASKS, torch.ones(1, 5, dtype=torch.bool)), "ground_truth must have shape"),
        (lambda: M.group_iou(MASKS, GT, used=torch.ones(1, 3, dtype=torch.bool)), "used must have shape"),
        (lambda: M.accuracy(torch.zeros(3, 2), torch.zeros(2, dtype=torch.long)), "same number of examples"),
        (lambda: M.accuracy(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), reduction="sum"), "reduction"),
        (lambda: M.fidelity(torch.zeros(2, 3), torch.zeros(2, 4, 5)), "attributions must have shape"),
        (lambda: M.mse(torch.zeros(2, 2), torch.zeros(2, 3)), "targets must have"),
        (lambda: M.cosmogrid_purity(*_cosmo_case(), tau_v=1.5), "tau_v"),
        (lambda: M.cosmogrid_alignment(_cosmo_case()[0], torch.zeros(1, 9)), "agree on N and P"),
        (lambda: M.leakage_probe(torch.zeros(1, 4), torch.zeros(1, dtype=torch.long)), "at least 2 examples"),
        (
            lambda: M.leakage_probe(torch.zeros(4, 4), torch.zeros(4, dtype=torch.long), train_fraction=1.0),
            "train_fraction",
        ),
        (lambda: M.distinct_groups(GROUPS, valid=torch.ones(1, 5, dtype=torch.bool)), "valid must have shape"),
        (lambda: M.pairwise_iou(GROUPS, used=torch.ones(1, 2, dtype=torch.bool)), "used must have shape"),
        (lambda: M.union_coverage(GROUPS[0]), "masks must have shape"),
        (lambda: M.sparsity_curve(torch.zeros(2, 3, 2), torch.zeros(2, dtype=torch.long), [0.5]), "taus has 1"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
