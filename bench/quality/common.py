"""Shared pieces of the quality sweep: the cached demo backbones, data, and one SOP run scored.

The backbone is trained once exactly as ``sopfast demo`` trains it (the ordinary way, no masking) and
cached under ``.cache/`` (git-ignored); every sweep row reuses it.
"""

from __future__ import annotations

import os
import time

import torch

from sopfast.data import builtin as data
from sopfast.model.sop import SOP

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(ROOT, ".cache")


def image_data() -> tuple[data.ImageData, data.ImageData]:
    """Fashion-MNIST train (60k) and the first 1,000 test images (as the demo)."""
    return data.load_fashion_mnist("train", 60000), data.load_fashion_mnist("test", 1000)


def image_backbone(seed: int = 0):
    """The demo's small ViT on Fashion-MNIST (trained normally), trained once and cached in
    ``.cache/fmnist-vit-plain``."""
    from transformers import ViTForImageClassification

    from sopfast.demo.run import _image_backbone

    path = os.path.join(CACHE, "fmnist-vit-plain")
    if not os.path.exists(os.path.join(path, "config.json")):
        train, _ = image_data()
        start = time.perf_counter()
        model, _ = _image_backbone(train, False, torch.device("cpu"), seed)
        model.save_pretrained(path)
        print(f"backbone trained in {time.perf_counter() - start:.0f} s -> {path}")
    return ViTForImageClassification.from_pretrained(path).eval()


@torch.no_grad()
def sop_outputs(model: SOP, x: torch.Tensor, mode: str, batch: int = 100):
    """Concatenated logits, group masks and predicted-class ``used`` flags over ``x``."""
    model.eval()
    logits, masks, used = [], [], []
    for s in range(0, len(x), batch):
        out = model(x[s : s + batch], mode=mode)
        pred = out.logits.argmax(-1)
        logits.append(out.logits)
        masks.append(out.group_masks)
        used.append(out.group_scores[torch.arange(len(pred)), pred] > 0)
    return torch.cat(logits), torch.cat(masks), torch.cat(used)


def adapted_image_backbone(seed: int = 0):
    """:func:`image_backbone` after ``sopfast.adapt_backbone`` with its defaults on SOP's 12,000 training
    images (as ``sopfast demo`` adapts it), cached in ``.cache/fmnist-vit-adapted``."""
    from transformers import ViTForImageClassification

    import sopfast

    path = os.path.join(CACHE, "fmnist-vit-adapted")
    if not os.path.exists(os.path.join(path, "config.json")):
        train, _ = image_data()
        data = torch.utils.data.TensorDataset(train.x[-12000:], train.y[-12000:])
        check = torch.utils.data.TensorDataset(train.x[-12000:][:256], train.y[-12000:][:256])
        sopfast.adapt_backbone(image_backbone(seed), data, check, seed=seed, output_dir=path)
    return ViTForImageClassification.from_pretrained(path).eval()


def other_image_backbone(kind: str, seed: int = 0):
    """A second image backbone of another family, trained the ordinary way exactly as the demo trains its
    ViT (``sopfast.demo.backbones.train_backbone``: 48,000 Fashion-MNIST images, 4 epochs, whole images), cached
    in ``.cache/fmnist-<kind>-plain``: ``"deit"``, a 6-layer HF DeiT of width 96 (3 heads, patch 4: 7×7
    patches), or ``"cnn"``, an HF ResNet of two basic stages (64 and 128 channels, depth 2; its feature grid is
    the first stage's 7×7)."""
    import transformers

    from sopfast.demo.backbones import train_backbone

    path = os.path.join(CACHE, f"fmnist-{kind}-plain")
    classes = {"deit": transformers.DeiTForImageClassification, "cnn": transformers.ResNetForImageClassification}
    if not os.path.exists(os.path.join(path, "config.json")):
        train, _ = image_data()
        common = {"num_channels": 1, "num_labels": len(train.classes)}
        if kind == "deit":
            config = transformers.DeiTConfig(
                hidden_size=96,
                num_hidden_layers=6,
                num_attention_heads=3,
                intermediate_size=192,
                image_size=28,
                patch_size=4,
                **common,
            )
        else:
            config = transformers.ResNetConfig(
                embedding_size=32, hidden_sizes=[64, 128], depths=[2, 2], layer_type="basic", **common
            )
        config.id2label = dict(enumerate(train.classes))
        config.label2id = {name: i for i, name in enumerate(train.classes)}
        torch.manual_seed(seed)
        model = classes[kind](config)
        start = time.perf_counter()
        train_backbone(model, train.x[:48000], train.y[:48000], epochs=4, seed=seed)
        model.save_pretrained(path)
        print(f"{kind} backbone trained in {time.perf_counter() - start:.0f} s -> {path}")
    return classes[kind].from_pretrained(path).eval()


def text_data(seed: int = 0):
    """The text demo's tweets of every length: ``(train, test)`` TextDatasets, the last 1,000 for
    testing, as ``run_text_demo`` splits them (``sopfast.demo.text.text_splits``)."""
    from sopfast.demo.text import text_splits

    return text_splits(False, seed)


TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def text_inputs(model: SOP, data, rows: slice):
    """``model.prepare`` of the tweets ``data.encoded[rows]`` (a TextDataset's token tensors)."""
    return model.prepare(*(data.encoded[k][rows] for k in TEXT_KEYS))


def text_training_step(model: SOP, optimizer: torch.optim.Optimizer, inputs, labels: torch.Tensor) -> float:
    """Seconds of one SOP training step on prepared text ``inputs``: forward, the loss with the recipe's
    penalties, backward and ``optimizer``'s step."""
    start = time.perf_counter()
    fields = {k: getattr(inputs, k) for k in TEXT_KEYS}
    loss = model(**fields, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def text_backbone(seed: int = 0):
    """The text demo's MiniLM + trained head, built once and cached in ``.cache/tweets-minilm-all``."""
    from transformers import BertForSequenceClassification

    from sopfast.demo.text import _text_backbone

    path = os.path.join(CACHE, "tweets-minilm-all")
    if not os.path.exists(os.path.join(path, "config.json")):
        train, _ = text_data(seed)
        model = _text_backbone(train, torch.device("cpu"), False, seed)
        model.save_pretrained(path)
    return BertForSequenceClassification.from_pretrained(path).eval()


def roberta_backbone():
    """The second text model (``second_text_model.py``'s RoBERTa, trained from scratch on the text demo's
    training tweets), built once and cached in ``.cache/tweets-roberta``."""
    from second_text_model import FULL, cached_roberta

    train, _ = text_data()
    return cached_roberta(train, FULL, os.path.join(CACHE, "tweets-roberta"))[0]
