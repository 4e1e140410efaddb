"""``sopfast predict`` over a 10,000-image folder vs a bare ``torch.no_grad()`` loop (issue #33).

Writes Fashion-MNIST's 10,000 test images as PNGs into an image folder (``<class>/<i>.png``), saves
a demo-sized HF ViT (randomly initialised: timing only) and a SOP model over it, then, in this
process, side by side:

* **bare**: ``model(x).logits.argmax(-1)`` under ``torch.no_grad()`` over the same batches, already
  decoded and preprocessed in memory;
* **predict**: ``sopfast predict --checkpoint … --data <folder> --output-dir …`` (the command's
  ``main``), timed by its own loop (the summary line's examples/s) and end to end;

first in short rounds over the first ``--round-examples`` images, then over all of them; each
predict run between two bare loops (their mean is the bare figure).  Checks that every row's
prediction equals the bare loop's ``argmax`` for that image, and measures peak RSS of the command
in fresh processes over 1,000 and 10,000 images.

    python bench/predict_speed.py                         # writes bench/RESULTS_predict.md
    python bench/predict_speed.py --examples 2000 --rounds 2 --round-examples 500 --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

import sopfast
from sopfast.cli.app import main as cli
from sopfast.data.builtin import FASHION_MNIST_CLASSES, load_fashion_mnist
from sopfast.demo.backbones import small_vit

RESULTS = Path(__file__).resolve().parent / "RESULTS_predict.md"
HEADER = """# `sopfast predict` vs a bare `torch.no_grad()` loop

`python bench/predict_speed.py` (sections added with `--append`). **bare**: `model(x).logits.argmax(-1)` over
the same batches already decoded and preprocessed in memory; **predict**: `sopfast predict` over the image
folder in the same process, between two bare loops (their mean is the bare figure); *loop* is the command's
own examples/s (its summary line: reading, forward, writing), *end to end* adds its start (loading the
model, opening the folder, fingerprints). Predictions are checked against the bare loop's `argmax` for every row.

"""


def write_folder(root: Path, n: int) -> Path:
    """Fashion-MNIST's first ``n`` test images as ``root/<class>/<i>.png``."""
    from PIL import Image

    data = load_fashion_mnist("test", n)
    pixels = ((data.x[:, 0] * 0.5 + 0.5) * 255).round().to(torch.uint8).numpy()
    for i, (image, label) in enumerate(zip(pixels, data.y.tolist())):
        folder = root / FASHION_MNIST_CLASSES[label].replace("/", "-")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:05d}.png")
    return root


def write_model(root: Path, num_groups: int = 20, mode: str = "drop") -> tuple[Path, Path]:
    """The demo's ViT shape (28×28, 4×4 patches, 1 channel, 10 classes) and a SOP model over it."""
    torch.manual_seed(0)
    backbone = small_vit(28, 4, 1, 10).eval()
    backbone.save_pretrained(root / "vit")
    processor = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": 28, "width": 28},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5],
        "image_std": [0.5],
    }
    (root / "vit" / "preprocessor_config.json").write_text(json.dumps(processor))
    sopfast.SOP(backbone, num_groups=num_groups, tau=0.2, mode=mode).save_pretrained(root / "sop")
    return root / "vit", root / "sop"


def command(vit: Path, sop: Path, folder: Path, out: Path, args: argparse.Namespace, limit: int | None = None):
    argv = ["predict", "--backbone", str(vit), "--checkpoint", str(sop), "--data", str(folder)]
    argv += ["--output-dir", str(out), "--batch-size", str(args.batch_size), "--num-workers", str(args.num_workers)]
    return argv + (["--limit", str(limit)] if limit else [])


def cpu_seconds() -> float:
    """CPU seconds of this process and of its reaped children (DataLoader workers) so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class Timing:
    """One side-by-side pair over ``n`` examples: seconds and CPU seconds of the bare loop and of
    ``sopfast predict`` (its own loop, as its summary line states, and end to end)."""

    label: str
    n: int
    bare: float
    bare_cpu: float
    loop: float
    wall: float
    predict_cpu: float
    equal: bool

    def row(self) -> str:
        n = self.n
        return (
            f"| {self.label} | {n} | {n / self.bare:.1f} | {n / self.loop:.1f} | **{self.bare / self.loop:.3f}×** | "
            f"{n / self.wall:.1f} | {self.bare / self.wall:.3f}× | {1e3 * self.bare_cpu / n:.2f} | "
            f"{1e3 * self.predict_cpu / n:.2f} | {'all rows' if self.equal else 'NO'} |"
        )


def bare_loop(model: sopfast.SOP, batches: list[torch.Tensor]) -> tuple[float, float, torch.Tensor]:
    cpu, start = cpu_seconds(), time.perf_counter()
    with torch.no_grad():
        predictions = [model(x).logits.argmax(-1) for x in batches]
    return time.perf_counter() - start, cpu_seconds() - cpu, torch.cat(predictions)


def run_predict(argv: list[str], out: Path) -> tuple[float, float, float, list[int]]:
    """``sopfast predict`` in this process: its loop seconds, wall seconds, CPU seconds and predictions."""
    stderr = io.StringIO()
    cpu, start = cpu_seconds(), time.perf_counter()
    with contextlib.redirect_stderr(stderr):  # the progress bar, the summary line
        assert cli(argv) == 0, stderr.getvalue()[-2000:]
    wall, used = time.perf_counter() - start, cpu_seconds() - cpu
    summary = stderr.getvalue().splitlines()[-1]
    loop = float(re.search(r"predicted \d+ examples in ([\d.]+) s", summary).group(1))
    table = pq.read_table(out / "data", columns=["id", "prediction"]).to_pydict()
    assert table["id"] == list(range(len(table["id"])))
    return loop, wall, used, table["prediction"]


def pair(label: str, model, batches, argv: list[str], out: Path) -> Timing:
    """The bare loop just before and just after ``sopfast predict`` (their mean is its measure: a
    change of the machine's load during the pair moves both sides alike)."""
    before, before_cpu, expected = bare_loop(model, batches)
    loop, wall, predict_cpu, predicted = run_predict(argv, out)
    after, after_cpu, _ = bare_loop(model, batches)
    equal = len(predicted) == len(expected) and bool((torch.tensor(predicted) == expected).all())
    bare, bare_cpu = (before + after) / 2, (before_cpu + after_cpu) / 2
    timing = Timing(label, len(expected), bare, bare_cpu, loop, wall, predict_cpu, equal)
    print(
        timing.row(), f"(bare before {len(expected) / before:.1f}, after {len(expected) / after:.1f} ex/s)", flush=True
    )
    return timing


def peak_rss(argv: list[str]) -> tuple[float, float]:
    """Peak RSS (MiB) of ``sopfast <argv>`` run in a fresh process, and of its worker processes."""
    code = (
        "import resource, sys; from sopfast.cli.app import main; code = main(sys.argv[1:]); "
        "usage = [resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]; "
        "print(*usage); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    own, workers = done.stdout.split()[-2:]
    return int(own) / 1024, int(workers) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10000)
    parser.add_argument("--small", type=int, default=1000, help="the smaller run of the memory comparison")
    parser.add_argument("--rounds", type=int, default=4, help="short interleaved rounds before the full run")
    parser.add_argument("--round-examples", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--num-groups", type=int, default=20)
    parser.add_argument("--mode", choices=("exact", "drop"), default="drop")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (on the shared machine 2 ran ~10× slower than 1)"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS runs")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--append", action="store_true", help="add this run's section to the results file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the memory runs' processes
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = write_folder(root / "fmnist", args.examples)
        vit, sop = write_model(root, args.num_groups, args.mode)
        warm = command(vit, sop, folder, root / "warm", args, limit=args.batch_size)
        cli([*warm, "--quiet", "--no-progress"])  # imports, the datasets cache of the folder
        from sopfast.adapters.sources import load_backbone
        from sopfast.data.splits import DataOptions, load_split

        backbone = load_backbone(str(vit))
        model = sopfast.SOP.from_pretrained(sop, backbone).eval()
        dataset = load_split(str(folder), "test", model.adapter, backbone, DataOptions(holdout=None)).dataset
        x = torch.stack([dataset[i][0] for i in range(len(dataset))])
        timings = []
        n = args.round_examples
        for r in range(args.rounds):
            out = root / f"round{r}"
            argv = command(vit, sop, folder, out, args, limit=n)
            timings.append(pair(f"round {r}", model, list(x[:n].split(args.batch_size)), argv, out))
        out = root / "full"
        argv = command(vit, sop, folder, out, args)
        timings.append(pair("full", model, list(x.split(args.batch_size)), argv, out))
        limits = () if args.no_memory else (args.small, args.examples)
        memory = {m: peak_rss(command(vit, sop, folder, root / f"mem{m}", args, limit=m)) for m in limits}
    report = _report(args, timings, memory)
    print(report)
    if not args.no_write:
        head = RESULTS.read_text().rstrip("\n") + "\n\n" if args.append and RESULTS.exists() else HEADER
        RESULTS.write_text(head + report)


def _report(args: argparse.Namespace, timings: list[Timing], memory: dict) -> str:
    load = os.getloadavg()
    rounds = sorted(t.bare / t.loop for t in timings if t.label != "full")
    lines = [
        f"## {args.examples} images, SOP with {args.num_groups} groups in {args.mode} mode, "
        f"{args.num_workers} DataLoader workers",
        "",
        f"Machine: shared 2-core CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible; "
        f"load average {load[0]:.1f} at the end: other agents' jobs share it), torch {torch.__version__}, "
        f"{args.threads} intra-op thread(s), {time.strftime('%Y-%m-%d')}. Data: Fashion-MNIST's first "
        f"{args.examples} test images as PNGs in one image folder. Model: SOP ({args.num_groups} groups, τ = 0.2, "
        f"{args.mode}) over the demo's ViT shape (28×28, 4×4 patches, hidden 64, 4 layers; random weights). "
        f"Batch {args.batch_size}, shards of 1,000. Bare: the mean of a loop just before and one just after predict.",
        "",
        "| run | examples | bare ex/s | predict ex/s (loop) | ratio | predict ex/s (end to end) | ratio | "
        "bare CPU ms/ex | predict CPU ms/ex (with workers) | predictions = argmax |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *(t.row() for t in timings),
        "",
    ]
    if rounds:
        lines.append(f"Median ratio of the short rounds: {statistics.median(rounds):.3f}×.")
    if memory:
        (own_s, work_s), (own_l, work_l) = memory[args.small], memory[args.examples]
        lines.append(
            f"Peak RSS of `sopfast predict` in a fresh process: {args.small} images {own_s:.0f} MiB, "
            f"{args.examples} images {own_l:.0f} MiB ({own_l / own_s:.3f}×); its worker processes "
            f"{work_s:.0f} / {work_l:.0f} MiB."
        )
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
