"""Every ```python example of README.md and docs/*.md runs as written, on tiny stand-ins.

Each block runs alone (a fresh namespace, the working directory a new temporary folder), so an
example that breaks — a renamed function, a changed argument, an import that no longer exists —
fails here.  The examples are read from the files at test time: whatever blocks the documents hold
are run, so a rewritten README needs no change here unless it names something new.

What the test provides, and the only things it changes:

* :func:`_names` — the names an example uses without defining them (``images``, ``train_set``,
  ``vit`` …): tiny tensors, datasets and a 2-layer ViT of 112-pixel images (14 × 14 = 196 patches,
  as the examples' ``grid=(14, 14)`` and ``[B, M, 196]`` masks assume).  An example that defines
  a name itself (an import, an assignment) uses its own.
* :data:`FILES` — the paths the examples read, written into the working directory before a block
  that mentions them runs: a tiny Hugging Face ViT saved at ``path/to/local/vit``, the authors'
  checkpoint format at ``path/to/authors-checkpoint``, a ``sopfast.predict`` output at ``OUT``.
* :data:`SUBSTITUTIONS` — text replaced in the examples before they run (the reason beside each).
* ``sopfast.train`` stops after :data:`MAX_STEPS` optimizer steps unless the example gives
  ``max_steps`` (a schedule of ``min_steps``, 1,000, would take minutes on the tiny data).
* :data:`NOT_RUN` — the blocks that cannot run, each with the reason (keep this list short).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import sopfast
from sopfast.testing import make_hf_vit

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

IMAGE_SIZE = 112  # 8-pixel patches: a 14 × 14 grid of 196 features
NUM_CLASSES = 3
MAX_STEPS = 2

# (text in the example, what runs instead, why)
SUBSTITUTIONS = [
    ('device="cuda"', 'device="cpu"', "the tests run on the CPU"),
    ("num_workers=4", "num_workers=0", "no worker processes on the shared test machine"),
]

# (text that marks the block, why it is not run, where what it shows is tested instead)
NOT_RUN = [
    (
        "@builtin_adapter(",
        "the source of a built-in adapter, shown to explain adapters: registering it again is an error",
        "tests/test_adapter_registry.py, tests/test_hf_families.py",
    ),
    (
        "train_dataset=...",
        "Hugging Face Trainer's arguments are left out (`args`, `...`, `checkpoint-N`)",
        "tests/test_trainer_conventions.py",
    ),
]


def _examples() -> list[Any]:
    params = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            code = match.group(1)
            reason = next((f"{why} (tested in {where})" for mark, why, where in NOT_RUN if mark in code), None)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            params.append(pytest.param(code, id=f"{document.relative_to(ROOT)}:{line}", marks=marks))
    return params


EXAMPLES = _examples()


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))


def _labels(n: int) -> torch.Tensor:
    return torch.arange(n) % NUM_CLASSES


def _object_masks(n: int) -> torch.Tensor:
    """``[n, 196]`` ground-truth masks over the features (the left half of each image)."""
    return (torch.arange(196) % 14 < 7).expand(n, 196)


@functools.cache
def _vit() -> Any:
    return make_hf_vit(num_labels=NUM_CLASSES, image_size=IMAGE_SIZE)


def _names() -> dict[str, Any]:
    """The names the examples use without defining them, fresh for every block (an example may train
    or change what it is given)."""
    import datasets
    from captum.attr import KernelShap

    vit = make_hf_vit(num_labels=NUM_CLASSES, image_size=IMAGE_SIZE)
    images, labels = _images(4, 0), _labels(4)
    train_set = TensorDataset(_images(8, 1), _labels(8))
    val_set = TensorDataset(_images(4, 2), _labels(4))
    tokens = torch.randn(2, 197, 8)
    return {
        "torch": torch,
        "sopfast": sopfast,
        "SOP": sopfast.SOP,
        "KernelShap": KernelShap,
        "datasets": datasets,
        "vit": vit,
        "backbone": vit,
        "model": sopfast.SOP(vit, num_groups=4),
        "images": images,
        "labels": labels,
        "target": labels,
        "train_set": train_set,
        "val_set": val_set,
        "train_data": train_set,
        "val_data": val_set,
        "dataset": val_set,
        "loader": DataLoader(TensorDataset(*val_set.tensors, _object_masks(4)), batch_size=2),
        "logits": torch.randn(2, 196),
        "x": tokens,
        "indices": torch.randint(1, 197, (2, 4, 5)),
    }


def _save_vit(path: Path) -> None:
    _vit().save_pretrained(path)


def _save_authors_checkpoint(path: Path) -> None:
    from authors_format import save_as_authors

    save_as_authors(sopfast.SOP(_vit(), recipe="paper", num_groups=4), path)


def _write_predictions(path: Path) -> None:
    """A ``sopfast.predict`` output with every column the examples read (object masks included)."""
    data = TensorDataset(_images(6, 3), _labels(6), _object_masks(6))
    sopfast.predict(sopfast.SOP(_vit(), num_groups=4), data, path, num_workers=0, progress=False)


FILES: dict[str, Callable[[Path], None]] = {
    "path/to/local/vit": _save_vit,
    "path/to/authors-checkpoint": _save_authors_checkpoint,
    "OUT": _write_predictions,
}


def _capped_train(train: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(train)
    def capped(*args: Any, **options: Any) -> Any:
        return train(*args, **{"max_steps": MAX_STEPS, "progress": False, **options})

    return capped


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sopfast, "train", _capped_train(sopfast.train))
    for path, write in FILES.items():
        if path in code:
            write(tmp_path / path)
    for old, new, _ in SUBSTITUTIONS:
        code = code.replace(old, new)
    exec(compile(code, "<example>", "exec"), _names())


def test_the_documents_hold_examples_and_every_block_not_run_exists():
    """The collection finds blocks (a changed fence would otherwise run nothing), and each entry of
    :data:`NOT_RUN` still marks one (a stale entry would hide a new block that happens to match)."""
    assert len(EXAMPLES) >= 4 and len(NOT_RUN) <= 3
    codes = [example.values[0] for example in EXAMPLES]
    assert all(any(mark in code for code in codes) for mark, _, _ in NOT_RUN)
