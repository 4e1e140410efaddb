"""A hostile user's try-out of the public API (issue #31), compact: every boolean, integer and enum
argument (found by introspection, setters included) refuses values that merely stand for one, naming the
argument; valid empty inputs give empty results; wrong values that used to pass silently are refused."""

from __future__ import annotations

import typing
from typing import Any, Literal

import pytest
import torch

import sopfast
from sopfast import ops
from sopfast.cli.options import _strip_optional, parameters
from sopfast.testing import make_bert, make_cnn, make_hf_vit, text_batch
from sopfast.training import TrainConfig

VIT = make_hf_vit()
X = torch.randn(2, 3, 32, 32)
MASKS = torch.ones(2, 3, 16, dtype=torch.bool)


def _kind(annotation: Any) -> str | None:
    """``"bool"``, ``"int"`` or ``"enum"`` for an argument annotated so (optional or not), else ``None``."""
    base, _ = _strip_optional(annotation)
    if base is bool:
        return "bool"
    if base is int:
        return "int"
    if typing.get_origin(base) is Literal:
        return "enum"
    return None


BAD = {"bool": ["yes", 1], "int": [2.5, "3", True], "enum": ["bogus", 1]}
# each API: a call taking one keyword override (what it needs besides: tiny inputs)
APIS = {
    "SOP": lambda **kw: sopfast.SOP(VIT, **kw),
    "TrainConfig": lambda **kw: TrainConfig(**kw),
    "evaluate": lambda **kw: sopfast.evaluate(sopfast.SOP(VIT, num_groups=2), [(X, torch.tensor([0, 1]))], **kw),
    "masked_forward": lambda **kw: sopfast.masked_forward(VIT, X, MASKS, **kw),
    "MaskedForward": lambda **kw: sopfast.MaskedForward(VIT, X, **kw),
    "rise": lambda **kw: sopfast.rise(VIT, X, torch.tensor([0, 1]), **{"num_masks": 2, **kw}),
    "top_tau": lambda **kw: ops.top_tau(torch.randn(2, 16), 0.25, **kw),
    "sparsemax": lambda **kw: ops.sparsemax(torch.randn(2, 5), **kw),
    "gather_tokens": lambda **kw: ops.gather_tokens(torch.randn(1, 4, 2), torch.zeros(1, 1, 1, dtype=torch.long), **kw),
    "from_pretrained": lambda **kw: sopfast.SOP.from_pretrained("missing", VIT, **kw),
    "probability_curve": lambda **kw: sopfast.metrics.probability_curve(torch.randn(2, 3, 4), **kw),
    "num_kept": lambda **kw: ops.num_kept(**{"tau": 0.2, "d": 10, **kw}),
    "diagnose": lambda **kw: sopfast.diagnose(VIT, [(X, torch.tensor([0, 1]))], **{"progress": False, **kw}),
    "adapt_backbone": lambda **kw: sopfast.adapt_backbone(VIT, [(X, torch.tensor([0, 1]))], **{"steps": 1, **kw}),
}
TARGETS = {
    "SOP": sopfast.SOP,
    "TrainConfig": TrainConfig,
    "evaluate": sopfast.evaluate,
    "masked_forward": sopfast.masked_forward,
    "MaskedForward": sopfast.MaskedForward,
    "rise": sopfast.rise,
    "top_tau": ops.top_tau,
    "sparsemax": ops.sparsemax,
    "gather_tokens": ops.gather_tokens,
    "from_pretrained": sopfast.SOP.from_pretrained,
    "probability_curve": sopfast.metrics.probability_curve,
    "num_kept": ops.num_kept,
    "diagnose": sopfast.diagnose,
    "adapt_backbone": sopfast.adapt_backbone,
}
# arguments typed ``str`` that take a choice (their annotation does not say so)
CHOICES = {
    ("top_tau", "ties"),
    ("rise", "mode"),
    ("masked_forward", "mode"),
    ("MaskedForward", "mode"),
    ("diagnose", "mode"),
}
PROBES = [
    (api, name, kind, value)
    for api, target in TARGETS.items()
    for name, (annotation, _) in parameters(target).items()
    if (kind := "enum" if (api, name) in CHOICES else _kind(annotation))
    for value in BAD[kind]
]


def test_the_probes_cover_every_typed_argument():
    names = {(api, name) for api, name, _, _ in PROBES}
    assert len(names) >= 40 and ("SOP", "deletion") in names and ("TrainConfig", "find_unused_parameters") in names


@pytest.mark.parametrize("api, name, kind, value", PROBES, ids=[f"{a}-{n}-{v!r}" for a, n, _, v in PROBES])
def test_every_bool_int_and_enum_argument_refuses_stand_ins(api, name, kind, value):
    with pytest.raises((TypeError, ValueError), match=name):
        APIS[api](**{name: value})


SETTERS = [
    ("num_groups", 0),
    ("num_groups", 2.5),
    ("tau", 0),
    ("tau", "0.2"),
    ("mode", "fast"),
    ("deletion", "yes"),
    ("group_batch_size", 0),
    ("checkpoint_projection", "no"),
    ("epoch", 1.5),
    ("epoch", -1),
]


@pytest.mark.parametrize("name, value", SETTERS)
def test_setters_check_like_the_constructor(name, value):
    model = sopfast.SOP(VIT, num_groups=2)
    before = getattr(model, name)
    with pytest.raises((TypeError, ValueError), match=name):
        setattr(model, name, value)
    assert getattr(model, name) == before


def _call(what: str) -> Any:
    model = sopfast.SOP(VIT, num_groups=2)
    bert, (ids, mask, types) = make_bert(), text_batch()
    calls = {
        "loss of a list": lambda: model(X).loss([0, 1]),
        "regression targets [B*C]": lambda: sopfast.SOP(VIT, num_groups=2, task="regression")(X).loss(torch.zeros(6)),
        "images with attention_mask": lambda: model(X, torch.ones(2, 16)),
        "bert attention_mask -1": lambda: sopfast.SOP(bert, num_groups=2)(ids, mask - 2 * (mask == 0).long(), types),
        "bert T=0": lambda: sopfast.SOP(bert, num_groups=2)(ids[:, :0], mask[:, :0]),
        "evaluate a plain ViT": lambda: sopfast.evaluate(VIT, [(X, torch.tensor([0, 1]))]),
        "evaluate labels beyond the classes": lambda: sopfast.evaluate(model, [(X, torch.tensor([0, 7]))]),
        "group_counts above the features": lambda: sopfast.evaluate(
            model, [(X, torch.tensor([0, 1]))], metrics=["num_groups"], group_counts=[100]
        ),
        "iou of empty ground truth": lambda: sopfast.evaluate(
            model, [(X, torch.tensor([0, 1]), torch.zeros(2, 16))], metrics=["iou"], ground_truth_key=2, progress=False
        ),
        "iou of NaN ground truth": lambda: sopfast.evaluate(
            model, [(X, torch.tensor([0, 1]), torch.full((2, 16), float("nan")))], metrics=["iou"], progress=False
        ),
        "example_ids -1": lambda: sopfast.MaskedForward(VIT, X)(torch.ones(1, 16), torch.tensor([-1])),
        "float example_ids": lambda: sopfast.MaskedForward(VIT, X)(torch.ones(1, 16), torch.tensor([0.0])),
        "NaN presence": lambda: sopfast.MaskedForward(VIT, X)(torch.full((1, 16), float("nan")), torch.tensor([0])),
        "rise target out of range": lambda: sopfast.rise(VIT, X, torch.tensor([0, 9]), num_masks=2),
        "group_select beta nan": lambda: ops.group_select(*_selector(), float("nan")),
        "group_select beta complex": lambda: ops.group_select(*_selector(), 1j),
        "group_select_reference beta inf": lambda: ops.group_select_reference(*_selector(), float("inf")),
        "aggregate int c": lambda: ops.aggregate(
            torch.ones(1, 2, 3, dtype=torch.long), torch.ones(1, 3), torch.ones(1, 3, 2)
        ),
        "aggregate_reference complex c": lambda: ops.aggregate_reference(
            torch.ones(1, 2, 3, dtype=torch.complex64), torch.ones(1, 3), torch.ones(1, 3, 2)
        ),
        "gather reference bool indices": lambda: ops.gather_tokens_reference(
            torch.randn(1, 4, 2), torch.zeros(1, 1, 1, dtype=torch.bool)
        ),
        "gather reference prefix -1": lambda: ops.gather_tokens_reference(
            torch.randn(1, 4, 2), torch.zeros(1, 1, 1, dtype=torch.long), -1
        ),
        "gather reference prefix True": lambda: ops.gather_tokens_reference(
            torch.randn(1, 4, 2), torch.zeros(1, 1, 1, dtype=torch.long), True
        ),
        "cnn embed_dim 7": lambda: sopfast.SOP(make_cnn(), feature_layer="features", embed_dim=7),
        "cnn embed_dim 2.5": lambda: sopfast.SOP(make_cnn(), feature_layer="features", embed_dim=2.5),
        "train callbacks=print": lambda: sopfast.train(
            model, [(X, torch.tensor([0, 1]))], batch_size=2, callbacks=print
        ),
        "train resume=1": lambda: sopfast.train(model, [(X, torch.tensor([0, 1]))], batch_size=2, resume=1),
        "train output_dir ''": lambda: sopfast.train(model, [(X, torch.tensor([0, 1]))], batch_size=2, output_dir=""),
        "train lr 1e38": lambda: sopfast.train(model, [(X, torch.tensor([0, 1]))], batch_size=2, lr=1e38),
        "from_pretrained backbone='vit'": lambda: sopfast.SOP.from_pretrained(".", backbone="vit"),
    }
    return calls[what]()


def _selector() -> tuple[torch.Tensor, ...]:
    return torch.randn(3, 4), torch.randn(2, 5, 4), torch.eye(4), torch.eye(4)


WRONG = {
    "loss of a list": "labels",
    "regression targets [B*C]": "targets",
    "images with attention_mask": "attention_mask",
    "bert attention_mask -1": "attention_mask",
    "bert T=0": "input_ids",
    "evaluate a plain ViT": "model must be a sopfast.SOP",
    "evaluate labels beyond the classes": r"labels must lie in \[0, 2\].*got \[7\]",
    "group_counts above the features": r"group_counts must be at most the model.s num_groups m=2, got \[100\]",
    "iou of empty ground truth": "every ground-truth mask is empty",
    "iou of NaN ground truth": "ground-truth masks must be finite",
    "example_ids -1": "example_ids",
    "float example_ids": "example_ids",
    "NaN presence": "presence",
    "rise target out of range": "target",
    "group_select beta nan": "beta",
    "group_select beta complex": "beta",
    "group_select_reference beta inf": "beta",
    "aggregate int c": "c must be float",
    "aggregate_reference complex c": "c must be float",
    "gather reference bool indices": "indices",
    "gather reference prefix -1": "prefix",
    "gather reference prefix True": "prefix",
    "cnn embed_dim 7": "embed_dim must be the 16 channels",
    "cnn embed_dim 2.5": "embed_dim",
    "train callbacks=print": "callbacks must be a list",
    "train resume=1": "resume",
    "train output_dir ''": "output_dir",
    "train lr 1e38": "lr must be",
    "from_pretrained backbone='vit'": "backbone must be",
}


@pytest.mark.parametrize("what", WRONG)
def test_wrong_values_are_refused_naming_the_argument(what):
    with pytest.raises((TypeError, ValueError), match=WRONG[what]):
        _call(what)


@pytest.mark.parametrize("batch, count", [(2, 0), (0, 3)])
@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_masked_forward_of_no_mask_or_no_example_is_empty(batch, count, mode):
    out = sopfast.masked_forward(
        VIT, X[:batch], torch.ones(batch, count, 16, dtype=torch.bool), mode=mode, return_embeddings=True
    )
    assert out.logits.shape == (batch, count, 3) and out.embeddings.shape == (batch, count, 32)


# -- the command line ----------------------------------------------------------------------------
def _cli(argv: list[str], capsys) -> tuple[int, str]:
    from sopfast.cli.app import main

    code = main(argv)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    import user_data as U

    return str(U.vit_dir(tmp_path_factory.mktemp("vit")))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--no-resume", "--resume-from", "state.pt"], "--no-resume and --resume-from contradict each other"),
        (["--output-dir", ""], "--output-dir is empty"),
        (["--data", "digits", "--text-column", "body"], "text_column (--text-column) is for text data"),
        (["--data", "digits", "--label-map", "0=1"], "label_map (--label-map) is for your own data"),
    ],
)
def test_cli_train_mistakes_are_one_line(vit_dir, flags, message, capsys):
    code, err = _cli(["train", "--backbone", vit_dir, "--no-progress", *flags], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_cli_theory_bounds_max_d(capsys):
    code, err = _cli(["theory", "--max-d", "100000"], capsys)
    assert code == 2 and "argument --max-d: must be an integer ≤ 64, got 100000" in err


def test_cli_labels_the_backbone_does_not_name_need_a_label_map(vit_dir, tmp_path, capsys):
    import user_data as U

    table = U.image_csv(tmp_path, per_class=6)  # test, validation and training parts each hold every class
    table.write_text(table.read_text().replace(",owl", ",Owl"))
    argv = ["train", "--backbone", vit_dir, "--data", str(table), "--holdout", "0.2", "--no-progress"]
    argv += ["--num-groups", "2", "--batch-size", "4", "--max-steps", "1", "--output-dir", str(tmp_path / "run")]
    code, err = _cli(argv, capsys)
    assert code == 2 and "labels ['Owl'] are not classes of the backbone" in err and "'owl'" in err, err
    code, err = _cli([*argv, "--label-map", "Owl=owl", "cat=cat", "dog=1"], capsys)
    assert code == 0, err
