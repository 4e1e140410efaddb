"""``sopfast train --backbone DIR`` trains every Hugging Face family from its ``save_pretrained`` directory
(tiny configs, ``sopfast.testing.TINY_HF``), with the family's adapter and its default mode."""

from __future__ import annotations

import pytest

import sopfast
import user_data as U
from sopfast.adapters import adapter_class
from sopfast.cli.app import main
from sopfast.testing import TINY_HF

FAST = ["--epochs", "1", "--batch-size", "4", "--num-groups", "3", "--no-progress", "--quiet"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-data")
    return {"image": str(U.image_folder(root, per_class=2)), "text": str(U.text_csv(root, n=8))}


# hf-vit and hf-bert: tests/test_user_data.py trains them from the README's commands
@pytest.mark.parametrize("family", [f for f in TINY_HF if f not in ("hf-vit", "hf-bert")])
def test_train_from_a_save_pretrained_directory(family, data, tmp_path, capsys):
    backbone = U.family_dir(tmp_path, family)
    image = "Image" in TINY_HF[family][1]
    flags = ["--data", data["image"], "--image-size", "32"] if image else ["--data", data["text"]]
    run = tmp_path / "run"
    code = main(["train", "--backbone", str(backbone), *flags, "--output-dir", str(run), *FAST])
    assert code == 0, capsys.readouterr().err
    model = sopfast.SOP.from_pretrained(run / "last")
    assert type(model.adapter) is adapter_class(family)
    assert model.mode == ("drop" if "drop" in adapter_class(family).supported_modes else "exact")


def test_train_takes_an_adapter_by_name(data, tmp_path, capsys):
    backbone = str(U.family_dir(tmp_path, "hf-deit"))
    flags = ["--data", data["image"], "--image-size", "32", *FAST]
    assert (
        main(["train", "--backbone", backbone, "--adapter", "hf-deit", "--output-dir", str(tmp_path / "r"), *flags])
        == 0
    )
    assert sopfast.SOP.from_pretrained(tmp_path / "r" / "last").config["adapter"] == "hf-deit"
    assert main(["train", "--backbone", backbone, "--adapter", "hf-nope", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' progress bars
    assert err.startswith("sopfast train: error: adapter 'hf-nope' is not a sopfast adapter; allowed: ")
