"""Issue #32: a trained model carries its preprocessing and is a Hub-style model — ``save_pretrained`` /
``from_pretrained`` (a directory, a run folder or a Hub id from the cache) / ``push_to_hub`` (up to the
upload, which needs the network) and a model card with backbone, data, recipe, τ, m, accuracy and the
backbone diagnostic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import sopfast
import user_data as U
from sopfast.cli.app import main
from sopfast.model.checkpoint import trainable_state_dict

huggingface_hub = pytest.importorskip("huggingface_hub")
TRAIN = ["--batch-size", "4", "--num-groups", "4", "--no-progress", "--max-steps", "2", "--eval-every", "1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A CLI run of a tiny HF ViT on an image folder, trained with preprocessing flags of its own."""
    root = tmp_path_factory.mktemp("hub")
    vit, images = U.vit_dir(root), U.image_folder(root, per_class=4)
    out = root / "run"
    argv = ["train", "--backbone", str(vit), "--data", str(images), "--output-dir", str(out)]
    flags = ["--image-mean", "0.2", "--image-std", "0.3", "--diagnose-examples", "4"]
    assert main([*argv, *flags, *TRAIN]) == 0
    return {"root": root, "vit": vit, "images": images, "out": out}


def _same_weights(a: sopfast.SOP, b: sopfast.SOP) -> bool:
    first, second = trainable_state_dict(a), trainable_state_dict(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_evaluate_and_explain_apply_the_saved_preprocessing_and_a_flag_overrides_it_out_loud(run, capsys, tmp_path):
    argv = ["evaluate", "--checkpoint", str(run["out"]), "--metrics", "accuracy", "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "mean [0.2, 0.2, 0.2], std [0.3, 0.3, 0.3]" in err and "as the model was trained" in err
    assert f"data as the model was trained: --data {run['images']}" in err
    assert main([*argv, "--image-mean", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "warning: --image-mean [0.5, 0.5, 0.5] overrides the model's saved mean [0.2, 0.2, 0.2]" in err
    assert "mean [0.5, 0.5, 0.5], std [0.3, 0.3, 0.3]" in err
    pictures = tmp_path / "pics"
    assert main(["explain", "--checkpoint", str(run["out"]), "--count", "2", "--out", str(pictures)]) == 0
    assert "std [0.3, 0.3, 0.3]" in capsys.readouterr().err and len(list(pictures.glob("*.png"))) == 2


def test_a_loaded_model_preprocesses_raw_inputs_as_in_training(run):
    from PIL import Image

    model = sopfast.SOP.from_pretrained(run["out"])
    files = sorted(Path(run["images"]).rglob("*.png"))[:2]
    batch = model.preprocess([str(f) for f in files])
    assert batch["pixel_values"].shape == (2, 3, 32, 32)
    expected = torch.stack([model.preprocessing.image(Image.open(f)) for f in files])
    torch.testing.assert_close(batch["pixel_values"], expected)
    prep = model.preprocessing  # the saved statistics, not the 0.5 of the directory's processor
    assert prep.mean == (0.2,) * 3 and prep.std == (0.3,) * 3
    assert float(batch["pixel_values"].max()) > 1.5  # (x - 0.2) / 0.3 of bright pixels; (x - 0.5) / 0.5 stays ≤ 1
    with torch.no_grad():
        assert model(**batch).logits.shape == (2, 3)
    with pytest.raises(ValueError, match="PIL images or image paths, got int"):
        model.preprocess([3])


def test_a_text_model_tokenises_as_in_training(tmp_path):
    bert = sopfast.adapters.load_backbone(str(U.bert_dir(tmp_path)))
    model = sopfast.SOP(bert, num_groups=2)
    model.provenance["preprocessing"] = {"modality": "text", "tokenizer": "BertTokenizer", "max_length": 5}
    batch = model.preprocess(["good movie film plot actor boring fun", "bad"])
    assert batch["input_ids"].shape == (2, 5) and set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    with torch.no_grad():
        assert model(**batch).logits.shape == (2, 2)


def test_the_model_card_lists_backbone_data_recipe_tau_m_accuracy_and_the_diagnostic(run, tmp_path):
    model = sopfast.SOP.from_pretrained(run["out"])
    path = Path(model.save_pretrained(tmp_path / "shared"))
    card = huggingface_hub.ModelCard.load(path / "README.md")
    assert card.data.library_name == "sopfast" and card.data.pipeline_tag == "image-classification"
    text = card.text
    diagnosis = json.loads((run["out"] / "diagnosis.json").read_text())
    validation = json.loads((run["out"] / "best" / "sop_config.json").read_text())["provenance"]["validation"]
    assert f"`{run['vit']}`" in text and f"`{run['images']}`" in text and "| recipe | `sopfast` |" in text
    assert "| τ (fraction of the features per group) | 0.2 |" in text and "| m (groups per input) | 4 |" in text
    assert f"accuracy {validation['val_accuracy']:.4f}" in text
    assert f"{diagnosis['full_accuracy']:.3f} on whole inputs" in text and diagnosis["verdict"] in text
    assert _same_weights(sopfast.SOP.from_pretrained(path), model)


def test_loading_by_a_hub_id_from_the_cache(run, tmp_path):
    cache = tmp_path / "cache"
    snapshot = cache / "models--me--sop-vit" / "snapshots" / ("a" * 40)
    sopfast.SOP.from_pretrained(run["out"]).save_pretrained(snapshot)
    (cache / "models--me--sop-vit" / "refs").mkdir()
    (cache / "models--me--sop-vit" / "refs" / "main").write_text("a" * 40)
    loaded = sopfast.SOP.from_pretrained("me/sop-vit", cache_dir=cache, local_files_only=True)
    assert _same_weights(loaded, sopfast.SOP.from_pretrained(run["out"]))
    with pytest.raises(FileNotFoundError, match="'me/other' is not in the local cache"):
        sopfast.SOP.from_pretrained("me/other", cache_dir=cache, local_files_only=True)
    with pytest.raises(FileNotFoundError, match="no such directory"):  # a local path, never a Hub id
        sopfast.SOP.from_pretrained(tmp_path / "missing")


def test_push_to_hub_uploads_weights_config_and_card_in_one_commit(run, monkeypatch, tmp_path):
    calls = {}

    def create_repo(self, repo_id, **kwargs):
        calls["create"] = (repo_id, kwargs)
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        import shutil

        shutil.copytree(folder_path, tmp_path / "uploaded")
        calls["upload"] = (repo_id, kwargs)
        return "commit"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    model = sopfast.SOP.from_pretrained(run["out"])
    assert model.push_to_hub("me/sop-vit", private=True) == "commit"
    assert calls["create"] == ("me/sop-vit", {"private": True, "exist_ok": True})
    assert calls["upload"][0] == "me/sop-vit"
    uploaded = tmp_path / "uploaded"
    assert {p.name for p in uploaded.iterdir()} == {"sop_model.safetensors", "sop_config.json", "README.md"}
    assert _same_weights(sopfast.SOP.from_pretrained(uploaded), model)
