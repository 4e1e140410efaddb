"""Loading the authors' checkpoints (exlib ``SOPImageCls`` ``save_pretrained`` directories).

The tests write a checkpoint in the authors' layout themselves (random weights): HF ViT names
as transformers 4.x wrote them, under the authors' wrapper prefixes, the generator heads and
the selector as ``[3E, E]`` ``input_weights``, ``projected_input_scale`` ≠ 1."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save_file

import sopfast
from backbones import make_hf_vit
from sopfast.authors import AuthorsCheckpointError
from sopfast.checkpoint import load_pretrained
from sopfast.cli import main

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


def trained_sop(heads: int, blur: int) -> sopfast.SOP:
    """A sopfast model with every trainable weight moved off its initial value."""
    torch.manual_seed(0)
    model = sopfast.SOP(
        make_hf_vit(),
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
    converted = load_pretrained(tmp_path / "converted", make_hf_vit())
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
        (lambda w: w.update(class_weights=torch.zeros(4, 32)), r"class_weights has shape \(4, 32\)"),
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
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(AuthorsCheckpointError, match="lacks the SOPConfig key"):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit())
    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": 32, "num_labels": 3, "num_heads": 1, "num_masks_sample": 4})
    )
    with pytest.raises(AuthorsCheckpointError, match="no weights"):
        sopfast.SOP.from_authors(tmp_path, make_hf_vit())


def test_convert_cli_errors_are_one_line(tmp_path, capsys):
    code = main(["convert", "--authors", str(tmp_path / "none"), "--backbone", str(tmp_path), "--out", str(tmp_path)])
    assert code == 2 and "--authors directory not found" in capsys.readouterr().err
