"""The backbone-only baselines (-F conversions, FRESH) at τ ∈ {0.05, 0.1, 0.2, 0.4}, one group each, on
the first --test test inputs; cached in .cache/baselines_<task>.json (curves.baseline_table).  Text with
KEEP_SPECIAL=1: candidates without [CLS]/[SEP] (SOP(keep_special_tokens=True))."""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CACHE, image_backbone, image_data, text_backbone, text_data
from curves import baseline_table

from sopfast.model.sop import SOP

p = argparse.ArgumentParser()
p.add_argument("--task", default="image")
p.add_argument("--test", type=int, default=1000)
p.add_argument("--names", nargs="*", default=None)
a = p.parse_args()
torch.set_num_threads(1)
t = time.perf_counter()
if a.task == "image":
    bb, te = image_backbone(), image_data()[1]
    model = SOP(bb, num_groups=20, tau=0.2, mode="drop", recipe="paper")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(te.x[: a.test], te.y[: a.test]), batch_size=50)
else:
    bb, te = text_backbone(), text_data()[1]
    keep = os.environ.get("KEEP_SPECIAL") == "1"
    model = SOP(bb, num_groups=8, tau=0.2, mode="drop", recipe="paper", keep_special_tokens=keep)
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(te, range(min(a.test, len(te)))), batch_size=50)
tag = a.task + ("-keep" if os.environ.get("KEEP_SPECIAL") == "1" else "") + f"-{a.test}"
print(json.dumps(baseline_table(model, loader, tag, CACHE, names=a.names), indent=1))
print(f"{time.perf_counter() - t:.0f} s")
