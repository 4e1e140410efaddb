"""SOP vs every baseline on a trained sweep model (``.cache/sweep/<row>``): the demo's comparison table.

python bench/quality/compare.py ROW [--task image|text] [--test 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CACHE, image_backbone, image_data, text_backbone, text_data

from sopfast.demo.report import format_comparison
from sopfast.demo.run import compare_methods
from sopfast.model.sop import SOP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("row", help="a sweep row whose model is saved under .cache/sweep/")
    parser.add_argument("--task", choices=("image", "text"), default="image")
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.task == "image":
        backbone, test = image_backbone(), image_data()[1]
        data = torch.utils.data.TensorDataset(test.x[: args.test], test.y[: args.test])
    else:
        backbone, test = text_backbone(), text_data()[1]
        data = torch.utils.data.Subset(test, range(min(args.test, len(test))))
    model = SOP.from_pretrained(os.path.join(CACHE, "sweep", args.row), backbone)
    start = time.perf_counter()
    comparison = compare_methods(model, torch.utils.data.DataLoader(data, batch_size=50), torch.device("cpu"))
    seconds = time.perf_counter() - start
    print(format_comparison(comparison))
    print(f"{seconds:.0f} s")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "comparisons.jsonl"), "a") as f:
        f.write(json.dumps({"row": args.row, "task": args.task, "seconds": seconds, "comparison": comparison}) + "\n")


if __name__ == "__main__":
    main()
