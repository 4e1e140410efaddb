"""Tiny user-side files for the command-line tests: model directories, weights and data of every kind."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import torch

from sopfast.testing import make_bert, make_hf_vit

CLASSES = ("cat", "dog", "owl")
WORDS = "the a good bad movie film great awful love hate plot actor boring fun not very".split()


def vit_dir(root: Path, image_size: int = 32) -> Path:
    """A tiny HF ViT (3 named classes) saved with ``save_pretrained`` plus a ``preprocessor_config.json``."""
    model = make_hf_vit(num_labels=3, image_size=image_size)
    model.config.id2label = dict(enumerate(CLASSES))
    model.config.label2id = {c: i for i, c in enumerate(CLASSES)}
    path = root / "vit"
    model.save_pretrained(path)
    processor = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": image_size, "width": image_size},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return path


def bert_dir(root: Path) -> Path:
    """A tiny HF BERT (2 labels) with a word-level tokenizer over :data:`WORDS`, in one directory."""
    from transformers import BertTokenizer

    model = make_bert(num_labels=2)
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    model.config.vocab_size = len(vocab)
    model.resize_token_embeddings(len(vocab))
    path = root / "bert"
    model.save_pretrained(path)
    BertTokenizer(vocab=vocab).save_pretrained(path)
    return path


def timm_weights(root: Path, image_size: int = 32, suffix: str = ".safetensors") -> Path:
    """Weights of timm's ``test_vit`` at ``image_size`` pixels with 3 classes (safetensors or torch)."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False, num_classes=3, img_size=image_size, dynamic_img_size=False)
    path = root / f"test_vit{suffix}"
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, path) if suffix == ".safetensors" else torch.save(state, path)
    return path


def _image(seed: int, label: int, size: int) -> np.ndarray:
    """An RGB image whose brightest channel is the class (so the task is learnable)."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 90, (size, size + 4, 3), dtype=np.uint8)
    image[..., label] += 150
    return image


def image_folder(root: Path, per_class: int = 4, size: int = 40, splits: bool = False) -> Path:
    """A torchvision ImageFolder tree of PNGs, ``root/<class>/<i>.png`` (or per split)."""
    from PIL import Image

    path = root / "images"
    parts = ("train", "test") if splits else ("",)
    for p, part in enumerate(parts):
        for c, name in enumerate(CLASSES):
            folder = path / part / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                Image.fromarray(_image(100 * p + 10 * c + i, c, size)).save(folder / f"{i}.png")
    return path


def _texts(n: int, seed: int) -> tuple[list[str], list[int]]:
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(n):
        label = i % 2
        key = ["good", "great", "love", "fun"] if label else ["bad", "awful", "hate", "boring"]
        words = [*rng.choice(WORDS, 5), *rng.choice(key, 2)]
        texts.append(" ".join(rng.permutation(words)))
        labels.append(label)
    return texts, labels


def saved_text_dataset(root: Path, n_train: int = 12, n_test: int = 6, column: str = "sentence") -> Path:
    """A ``DatasetDict`` (train / test) of short texts and ClassLabel labels, written with ``save_to_disk``."""
    import datasets

    features = datasets.Features({column: datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    parts = {}
    for split, (n, seed) in {"train": (n_train, 0), "test": (n_test, 1)}.items():
        texts, labels = _texts(n, seed)
        parts[split] = datasets.Dataset.from_dict({column: texts, "label": labels}, features=features)
    path = root / "saved_text"
    datasets.DatasetDict(parts).save_to_disk(str(path))
    return path


def text_csv(root: Path, n: int = 12, pairs: bool = False) -> Path:
    """``texts.csv`` with ``text`` (and ``text_pair``) and string ``label`` columns (pos / neg)."""
    texts, labels = _texts(n, 2)
    path = root / "texts.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", *(["text_pair"] if pairs else []), "label"])
        for t, y in zip(texts, labels):
            writer.writerow([t, *(["a film"] if pairs else []), "pos" if y else "neg"])
    return path


def image_csv(root: Path, per_class: int = 4, size: int = 40, jsonl: bool = False) -> Path:
    """``images.csv`` (or ``images.jsonl``) with image paths relative to it and class-name labels."""
    from PIL import Image

    folder = root / "pictures"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for c, name in enumerate(CLASSES):
        for i in range(per_class):
            Image.fromarray(_image(10 * c + i, c, size)).save(folder / f"{name}{i}.png")
            rows.append({"image": f"pictures/{name}{i}.png", "label": name})
    path = root / ("images.jsonl" if jsonl else "images.csv")
    with open(path, "w", newline="", encoding="utf-8") as f:
        if jsonl:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        else:
            writer = csv.DictWriter(f, ["image", "label"])
            writer.writeheader()
            writer.writerows(rows)
    return path


def count_files(path: Path, suffix: str) -> int:
    return sum(1 for _, _, files in os.walk(path) for f in files if f.endswith(suffix))


def family_dir(root: Path, family: str) -> Path:
    """A tiny HF classifier of ``family`` (``sopfast.testing.TINY_HF``) saved with ``save_pretrained``; text
    families get the word-level tokenizer over :data:`WORDS` of :func:`bert_dir`."""
    from transformers import BertTokenizer

    from sopfast.testing import make_hf

    model = make_hf(family)
    path = root / family
    model.save_pretrained(path)
    if "SequenceClassification" in type(model).__name__:
        vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
        BertTokenizer(vocab=vocab).save_pretrained(path)
    return path
