"""Per-step training cost of two SOP recipes on the cached image backbone (same process, same batches):
the demo recipe vs the research winner, the default recipe (python bench/quality/step_cost.py [threads]
[steps])."""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import image_backbone, image_data
from sweep import FINAL, RECIPE

from sopfast.model.sop import SOP

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
torch.set_num_threads(threads)
bb = image_backbone()
tr, _ = image_data()
for name, opts in (("recipe", RECIPE), ("final", FINAL), ("recipe", RECIPE), ("final", FINAL)):
    torch.manual_seed(0)
    model = SOP(bb, num_groups=20, tau=0.2, mode="drop", recipe="paper", **opts).train()
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-3)
    times = []
    for s in range(steps + 3):
        x, y = tr.x[32 * s : 32 * s + 32], tr.y[32 * s : 32 * s + 32]
        t = time.perf_counter()
        loss = model(x).compute_loss(y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if s >= 3:
            times.append(time.perf_counter() - t)
    times.sort()
    print(
        f"{name:7s} {threads} threads: median {1000 * times[len(times) // 2]:.0f} ms/step (batch 32, 20 groups)",
        flush=True,
    )
