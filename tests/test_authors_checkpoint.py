"""Loading the authors' checkpoints (exlib ``SOPImageCls`` directories).

Two writers: :mod:`authors_format` rebuilds the authors' ``SOPConfig``/``SOPImageCls`` and lets the
installed transformers' ``save_pretrained`` write the files (config without ``num_labels``, sharded
or single-file weights); :func:`write_authors_checkpoint` writes their ``SOP.save`` layout by hand
(``save_to_json`` keys, HF ViT names as transformers 4.x wrote them).  Both under the authors'
wrapper prefixes, the generator heads and the selector as ``[3E, E]`` ``input_weights``,
``projected_input_scale`` ≠ 1; random weights."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save_file

import sopfast
from authors_format import save_as_authors
from sopfast.cli.app import main
from sopfast.model.authors import AuthorsCheckpointError
from sopfast.testing import make_hf_vit

# transformers 5.x name → the 4.x name the authors' checkpoints hold (one layer's worth, written out)
LEGACY = [
    (r"^vit\.layers\.(\d+)\.attention\.q_proj\.", r"vit.encoder.layer.\1.attention.attention.query."),
    (r"^vit\.layers\.(\d+)\.attention\.k_proj\.", r"vit.encoder.layer.\1.attention.attention.key."),
    (r"^vit\.layers\.(\d+)\.attention\.v_proj\.", r"vit.encoder.layer.\1.attention.attention.value."),
    (r"^vit\.layers\.(\d+)\.attention\.o_proj\.", r"vit.encoder.layer.\1.attention.output.dense."),
    (r"^vit\.layers\.(\d+)\.mlp\.fc1\.", r"vit.encoder.layer.\1.intermediate.dense."),
    (r"^vit\.layers\.(\d+)\.mlp\.fc2\.", r"vit.encoder.layer.\1.output.dense."),
    (r"^vit\.layers\.(\d+)\.", r"vit.encoder.layer.\1."),
]
INPUT_SCALE = 2.0


def legacy_name(name: str) -> str:
    for pattern, replacement in LEGACY:
        new = re.sub(pattern, replacement, name)
        if new != name:
            return new
    return name


def trained_sop(heads: int, blur: int, num_labels: int = 3) -> sopfast.SOP:
    """A sopfast model with every trainable weight moved off its initial value."""
    torch.manual_seed(0)
    model = sopfast.SOP(
        make_hf_vit(num_labels),
        recipe="paper",
        num_groups=5,
        tau=0.25,
        num_heads=heads,
        group_gen_scale=3.0,
        group_sel_scale=2.0,
        blur_kernel_size=blur,
        blur_sigma=0.8,
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def write_authors_checkpoint(model: sopfast.SOP, directory, binary: bool = False) -> None:
    """``model`` in the authors' SOPImageCls layout (what their ``save_pretrained`` writes)."""
    e = model.adapter.embed_dim
    sel = model.selector
    weights = {"class_weights": sel.class_queries.detach().clone()}
    for h, w in enumerate(model.generator.heads):
        weights[f"input_attn.multihead_attns.{h}.input_weights"] = w.detach().clone()
        weights[f"input_attn.multihead_attns.{h}.output_projection.weight"] = torch.randn(e, e)
    values = torch.randn(e, e)
    weights["output_attn.multihead_attn.input_weights"] = torch.cat(
        [values, sel.key_proj.weight.detach(), sel.query_proj.weight.detach()]
    )
    weights["output_attn.multihead_attn.output_projection.weight"] = torch.randn(e, e)
    projection = {f"vit.{k}": v for k, v in model.projection.state_dict().items()}
    for name, tensor in model.backbone.state_dict().items():
        weights[f"blackbox_model.model.{legacy_name(name)}"] = tensor.clone()
        weights[f"projection.model.model.{legacy_name(name)}"] = projection.get(name, tensor).clone()
    weights = {k: v.contiguous() for k, v in weights.items()}
    config = {
        "architectures": ["SOPImageCls"],
        "hidden_size": e,
        "num_labels": model.num_classes,
        "num_heads": model.generator.num_heads,
        "num_masks_sample": model.num_groups,
        "num_masks_max": 200,
        "image_size": 32,
        "num_channels": 3,
        "attn_patch_size": 8,
        "finetune_layers": ["model.classifier"],
        "class_weight_layer": "model.classifier",
        "group_gen_scale": model.generator.scale / INPUT_SCALE**2,
        "group_sel_scale": sel.scale,
        "group_gen_blur_ks1": model.generator.blur_kernel_size or 1,
        "group_gen_blur_sigma1": model.generator.blur_sigma,
        "group_gen_blur_ks2": -1,
        "group_gen_blur_sigma2": -1,
        "freeze_projection": False,
        "projected_input_scale": INPUT_SCALE,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if binary:
        torch.save(weights, directory / "pytorch_model.bin")
    else:
        save_file(weights, directory / "model.safetensors")


def assert_same_model(a: sopfast.SOP, b: sopfast.SOP) -> None:
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out_a, out_b = a.eval()(x), b.eval()(x)
    assert torch.equal(out_a.group_masks, out_b.group_masks)
    torch.testing.assert_close(out_a.logits, out_b.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_a.group_scores, out_b.group_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads, blur, num_labels", [(1, 0, 3), (2, 3, 2), (4, 0, 5)])
def test_save_pretrained_checkpoint_loads_as_the_same_model(tmp_path, heads, blur, num_labels):
    model = trained_sop(heads, blur, num_labels)
    save_as_authors(model, tmp_path / "authors")
    config = json.loads((tmp_path / "authors" / "config.json").read_text())
    assert "num_labels" not in config and config["architectures"] == ["SOPImageCls"]
    assert ("id2label" in config) == (num_labels != 2)  # transformers leaves out its own default
    loaded = sopfast.SOP.from_authors(tmp_path / "authors", make_hf_vit(num_labels), tau=0.25)
    assert loaded.num_classes == num_labels and loaded.generator.num_heads == heads
    assert_same_model(model, loaded)


def test_sharded_save_pretrained_checkpoint(tmp_path):
    model = trained_sop(2, 3)
    save_as_authors(model, tmp_path / "authors", max_shard_size="40KB")
    assert len(list((tmp_path / "authors").glob("model-*-of-*"))) > 1
    assert_same_model(model, sopfast.SOP.from_authors(tmp_path / "authors", make_hf_vit(), tau=0.25))


def test_save_pretrained_checkpoint_without_safetensors(tmp_path):
    model = trained_sop(1, 0)
    save_as_authors(model, tmp_path / "authors", safe_serialization=False)
    assert_same_model(model, sopfast.SOP.from_authors(tmp_path / "authors", make_hf_vit(), tau=0.25))


def test_convert_command_reads_save_pretrained(tmp_path):
    model = trained_sop(2, 0, num_labels=2)
    save_as_authors(model, tmp_path / "authors")
    model.backbone.save_pretrained(tmp_path / "backbone")
    args = ["convert", "--authors", str(tmp_path / "authors"), "--backbone", str(tmp_path / "backbone")]
    assert main([*args, "--out", str(tmp_path / "converted"), "--tau", "0.25"]) == 0
    assert_same_model(model, sopfast.SOP.from_pretrained(tmp_path / "converted", make_hf_vit(2)))


def test_their_save_and_training_checkpoint_files(tmp_path):
    model = trained_sop(2, 3)
    write_authors_checkpoint(model, tmp_path / "save")
    weights = __import__("safetensors.torch").torch.load_file(tmp_path / "save" / "model.safetensors")
    (tmp_path / "save" / "model.safetensors").unlink()
    torch.save(weights, tmp_path / "save" / "model.pt")
    assert_same_model(model, sopfast.SOP.from_authors(tmp_path / "save", make_hf_vit(), tau=0.25))
    (tmp_path / "save" / "model.pt").rename(tmp_path / "save" / "unused")
    torch.save({"model": weights, "epoch": 3}, tmp_path / "save" / "checkpoint.pth")
    assert_same_model(model, sopfast.SOP.from_authors(tmp_path / "save", make_hf_vit(), tau=0.25))


def _edit_config(directory, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"hidden_size": None}, r"hidden_size=512 \(absent from config.json: SOPConfig's default\) but .* 32"),
        (
            {"id2label": {"0": "a", "1": "b", "2": "c", "3": "d"}},
            r"declares 4 labels \(its id2label\) but class_weights has 3 rows",
        ),
        ({"num_labels": 2}, r"declares 2 labels \(its num_labels\)"),
        ({"group_gen_scale": "big"}, r"group_gen_scale must be a finite number, got 'big'"),
        ({"input_hidden_size": 16}, r"input_hidden_size=16 but the generator reads .* 32-wide"),
        ({"architectures": ["ViTForImageClassification"]}, r"is not one of \['SOPImageCls', 'SOPTextCls'\]"),
    ],
)
def test_incomplete_or_inconsistent_configs_name_the_key(tmp_path, changes, match):
    save_as_authors(trained_sop(1, 0), tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(AuthorsCheckpointError, match=match):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit())


def test_defaults_fill_what_the_config_leaves_out(tmp_path):
    """Keys equal to SOPConfig's defaults may be absent (a hand-trimmed file): the defaults apply."""
    model = trained_sop(1, 0)
    model.selector.scale = 1.0
    save_as_authors(model, tmp_path, input_scale=1.0)
    _edit_config(
        tmp_path, **{k: None for k in ("num_heads", "projected_input_scale", "group_sel_scale", "attn_patch_size")}
    )
    loaded = sopfast.SOP.from_authors(tmp_path, make_hf_vit(), tau=0.25)
    assert loaded.generator.num_heads == 1 and loaded.selector.scale == 1.0
    assert_same_model(model, loaded)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("blur", [0, 3])
def test_authors_checkpoint_loads_as_the_same_model(tmp_path, heads, blur):
    model = trained_sop(heads, blur)
    write_authors_checkpoint(model, tmp_path / "authors")
    loaded = sopfast.SOP.from_authors(tmp_path / "authors", make_hf_vit(), tau=0.25)
    assert (loaded.mode, loaded.generator.ties, loaded.num_groups) == ("exact", "authors", 5)
    assert loaded.generator.scale == pytest.approx(3.0) and loaded.generator.blur_kernel_size == blur
    assert_same_model(model, loaded)


def test_pytorch_model_bin_checkpoint(tmp_path):
    model = trained_sop(2, 3)
    write_authors_checkpoint(model, tmp_path / "authors", binary=True)
    assert_same_model(model, sopfast.SOP.from_authors(tmp_path / "authors", make_hf_vit(), tau=0.25))


def test_convert_command_writes_sopfast_format(tmp_path, capsys):
    model = trained_sop(2, 3)
    write_authors_checkpoint(model, tmp_path / "authors")
    model.backbone.save_pretrained(tmp_path / "backbone")
    code = main(
        [
            "convert",
            "--authors",
            str(tmp_path / "authors"),
            "--backbone",
            str(tmp_path / "backbone"),
            "--out",
            str(tmp_path / "converted"),
            "--tau",
            "0.25",
        ]
    )
    assert code == 0
    converted = sopfast.SOP.from_pretrained(tmp_path / "converted", make_hf_vit())
    assert_same_model(model, converted)


def _edit_checkpoint(directory, edit) -> None:
    from safetensors.torch import load_file

    weights = load_file(directory / "model.safetensors")
    edit(weights)
    save_file(weights, directory / "model.safetensors")


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda w: w.pop("class_weights"), "lacks 'class_weights'"),
        (lambda w: w.pop("input_attn.multihead_attns.1.input_weights"), r"num_heads=2 but .* heads \[0\]"),
        (lambda w: w.update(class_weights=torch.zeros(4, 32)), r"declares 3 labels .* class_weights has 4 rows"),
        (lambda w: w.update({"output_attn.multihead_attn.input_weights": torch.zeros(32, 32)}), r"expected \[3E, E\]"),
        (lambda w: w.pop("projection.model.model.vit.layernorm.weight"), "missing .*projection.layernorm.weight"),
        (lambda w: w.pop("blackbox_model.model.classifier.bias"), "lacks backbone weights .*classifier.bias"),
    ],
)
def test_broken_checkpoints_are_clear_errors(tmp_path, edit, match):
    write_authors_checkpoint(trained_sop(2, 0), tmp_path)
    _edit_checkpoint(tmp_path, edit)
    with pytest.raises(ValueError, match=match):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit())


def test_another_backbone_is_refused(tmp_path):
    write_authors_checkpoint(trained_sop(1, 0), tmp_path)
    with pytest.raises(AuthorsCheckpointError, match="the given backbone is not the checkpoint's"):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit(seed=3))


def test_missing_files_and_config_keys(tmp_path):
    with pytest.raises(AuthorsCheckpointError, match=r"config\.json is missing"):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit())
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(AuthorsCheckpointError, match="must hold a JSON object"):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit())
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(AuthorsCheckpointError, match="no weights"):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit())


def test_convert_cli_errors_are_one_line(tmp_path, capsys):
    code = main(["convert", "--authors", str(tmp_path / "none"), "--backbone", str(tmp_path), "--out", str(tmp_path)])
    assert code == 2 and "--authors directory not found" in capsys.readouterr().err
