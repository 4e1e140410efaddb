"""What the 0.6 recipe costs against 0.5.3's (issue #41): an SOP forward with and without the agreement prior
(one more backbone pass per input), and a training step of each recipe (0.5.3: the 2-level saliency teacher;
0.6: the prior and the sufficiency term, no teacher), measured side by side in one process, interleaved
round by round, median of the rounds.

    python bench/quality/prior_cost.py [--model b16|demo] [--batch 8] [--rounds 5]

Writes ``bench/quality/prior_cost.md``.  ``b16``: a randomly initialised ViT-B/16 at 224 pixels (timing
needs no trained weights); ``demo``: the image demo's 4-layer ViT on 28-pixel images.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from sopfast import testing
from sopfast.model.sop import SOP

HERE = os.path.dirname(os.path.abspath(__file__))
#: The 0.5.3 recipe's image options that 0.6 changed (everything else is the same).
RECIPE_053 = {"saliency_weight": 1.0, "agreement_prior": 0.0, "sufficiency_weight": 0.0}


def backbone(name: str) -> torch.nn.Module:
    if name == "b16":
        return testing.vit("b16", num_labels=10)
    return testing.vit((64, 4, 4), image_size=28, patch_size=4, channels=1, num_labels=10, mlp=128)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("b16", "demo"), default="b16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = backbone(args.model)
    size = 224 if args.model == "b16" else 28
    x = torch.randn(args.batch, 3 if args.model == "b16" else 1, size, size)
    y = torch.randint(0, 10, (args.batch,))
    models = {
        "0.6 (prior 3, sufficiency 4)": SOP(net),
        "0.5.3 (2-level saliency teacher)": SOP(net, **RECIPE_053),
        "0.6 without the prior": SOP(net, agreement_prior=0.0),
    }
    optimizers = {k: torch.optim.AdamW(m.trainable_parameters(), lr=1e-4) for k, m in models.items()}

    def forward(model: SOP) -> None:
        model.eval()
        with torch.no_grad():
            model(x.clone())  # new tensors: the backbone's full-input pass is not remembered between calls

    def step(name: str) -> None:
        model = models[name].train()
        loss = model(x, labels=y).loss
        optimizers[name].zero_grad()
        loss.backward()
        optimizers[name].step()

    times: dict[tuple[str, str], list[float]] = {}
    for name in models:  # warm-up
        forward(models[name])
        step(name)
    for _ in range(args.rounds):
        for name, model in models.items():
            times.setdefault(("forward", name), []).append(timed(lambda m=model: forward(m)))
            times.setdefault(("training step", name), []).append(timed(lambda n=name: step(n)))
    median = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        "# What the 0.6 recipe costs (issue #41)\n",
        f"`python bench/quality/prior_cost.py --model {args.model} --batch {args.batch} --rounds {args.rounds}`; "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        "`drop` mode, m = 20, τ = 0.2; median of the rounds, interleaved; ratios against the 0.5.3 recipe.\n",
        "| step | recipe | seconds | × 0.5.3 |",
        "|---|---|---:|---:|",
    ]
    for what in ("forward", "training step"):
        base = median[(what, "0.5.3 (2-level saliency teacher)")]
        for name in models:
            value = median[(what, name)]
            lines.append(f"| {what} | {name} | {value:.3f} | {value / base:.2f}× |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(HERE, "prior_cost.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
