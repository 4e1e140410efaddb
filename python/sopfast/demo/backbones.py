"""The demo's small backbone, trained the ordinary way (whole images, no masking), as a user's own
classifier would be; ``sopfast.adapt_backbone`` is the separate, opt-in step that makes a copy of it
predict from groups of its patches."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import testing
from ..integrity import sha256_bytes
from ..model.checkpoint import hash_backbone
from ..model.state_files import write_model_folder
from ..version import __version__

logger = logging.getLogger("sopfast.demo")
#: What a cached backbone's folder records besides the model: its settings and its weights' SHA-256.
CACHE_RECORD = "sopfast_demo_backbone.json"


def cache_root() -> Path:
    """Where the demo keeps what it trained for a later run: ``$SOPFAST_CACHE``, else ``~/.cache/sopfast``."""
    return Path(os.environ.get("SOPFAST_CACHE") or Path.home() / ".cache" / "sopfast")


def cached_backbone(name: str, settings: dict[str, Any], make: Callable[[], Any]) -> nn.Module:
    """The Hugging Face classifier ``make()`` trains, kept in ``<cache_root()>/demo/<name>-<key>`` (``key``:
    a hash of ``settings`` and the versions of sopfast, torch and transformers) so that a later run with the
    same settings loads it instead of training it again.  The folder records the weights' SHA-256; a copy
    that does not match it (damaged, edited) is trained again, with a warning."""
    import transformers

    record = {**settings, "sopfast": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    key = sha256_bytes(json.dumps(record, sort_keys=True).encode())[:16]
    folder = cache_root() / "demo" / f"{name}-{key}"
    saved = folder / CACHE_RECORD
    if saved.is_file():
        try:
            expected = json.loads(saved.read_text(encoding="utf-8"))["sha256"]
            model = transformers.AutoModelForImageClassification.from_pretrained(folder).eval()
            if hash_backbone(model) == expected:
                logger.info("demo: backbone loaded from %s (an earlier run trained it; delete to retrain)", folder)
                return model
            reason = "its weights do not match the SHA-256 it recorded"
        except (OSError, ValueError, KeyError) as err:
            reason = f"it cannot be read ({err})"
        logger.warning("demo: the cached backbone in %s is not used: %s; training it again", folder, reason)
    model = make()

    def write(target: Path) -> None:
        model.save_pretrained(target)
        text = json.dumps({**record, "sha256": hash_backbone(model)}, indent=2)
        (target / CACHE_RECORD).write_text(text, encoding="utf-8")

    write_model_folder(folder, write, overwrite=folder.exists(), name="the demo's backbone cache")
    return model


def small_vit(
    image_size: int, patch_size: int, channels: int, num_labels: int, hidden: int = 64, layers: int = 4, heads: int = 4
) -> nn.Module:
    """The demo's randomly initialised HF ``ViTForImageClassification`` of a few layers (MLP 2× wide)."""
    return testing.vit(
        (hidden, layers, heads),
        image_size=image_size,
        patch_size=patch_size,
        channels=channels,
        num_labels=num_labels,
        mlp=2 * hidden,
        seed=None,
    ).train()


def train_backbone(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int = 3,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = True,
) -> nn.Module:
    """Train an HF image classifier the ordinary way: whole images, cross-entropy, AdamW with a one-cycle
    schedule — no masking (``sopfast.adapt_backbone`` is the separate, opt-in step that adds it)."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    bar = tqdm(total=steps, desc="backbone", disable=not progress)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(model(pixel_values=x[idx]).logits, y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    return model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Top-1 accuracy of a plain HF image classifier."""
    model.eval()
    correct = 0
    for start in range(0, len(x), batch_size):
        logits = model(pixel_values=x[start : start + batch_size]).logits
        correct += int((logits.argmax(-1) == y[start : start + batch_size]).sum())
    return correct / max(1, len(x))
