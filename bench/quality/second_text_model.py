"""Issue #34's second text model: a RoBERTa-architecture classifier trained from scratch on the text
demo's tweets, then frozen, and the text demo's comparison (:func:`sopfast.demo.text.text_study`) on it.

No pretrained RoBERTa or BERT-base is available offline, so the model is built from a ``RobertaConfig``
(4 layers, hidden 256, 4 heads, MLP 1024) over the demo's MiniLM WordPiece vocabulary (so the demo's
tokenised tweets, :func:`sopfast.demo.text.text_splits`, feed it unchanged) and every weight is trained
(AdamW, one-cycle schedule, seed 0) on the demo's training tweets. Then SOP (the default recipe, 8 groups,
τ = 0.2, drop) is trained with seeds 0 and 1 and compared with every baseline on the first 500 test
tweets, exactly as the text demo does on MiniLM. Writes ``demo_text_roberta.md`` (the demo's printed
summary, :func:`sopfast.demo.report.format_results`), ``demo_text_roberta.json`` and
``demo_text_roberta_curves.png`` beside this file.

    python bench/quality/second_text_model.py            # about an hour on 2 shared cores, 1 thread
    python bench/quality/second_text_model.py --quick    # tiny model, few texts, one seed: a minute
    python bench/quality/second_text_model.py --fresh-check  # FRESH's words vs the least attended ones
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import sopfast
from sopfast.data.datasets import TextDataset

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class RobertaSize:
    """The classifier's shape and its training schedule."""

    layers: int
    hidden: int
    heads: int
    mlp: int
    epochs: int
    lr: float
    batch_size: int = 32


FULL = RobertaSize(layers=4, hidden=256, heads=4, mlp=1024, epochs=2, lr=5e-4)
QUICK = RobertaSize(layers=2, hidden=64, heads=2, mlp=128, epochs=1, lr=2e-3)


def roberta_classifier(
    vocab_size: int, pad_id: int, cls_id: int, sep_id: int, max_length: int, size: RobertaSize, seed: int = 0
) -> Any:
    """A randomly initialised ``RobertaForSequenceClassification`` (2 classes) of ``size`` over a vocabulary
    of ``vocab_size`` ids whose [PAD] is ``pad_id``: RoBERTa counts positions from ``pad_id + 1``, so it has
    ``max_length + pad_id + 2`` position embeddings."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    config = RobertaConfig(
        vocab_size=vocab_size,
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=size.mlp,
        max_position_embeddings=max_length + pad_id + 2,
        type_vocab_size=1,
        pad_token_id=pad_id,
        bos_token_id=cls_id,
        eos_token_id=sep_id,
        num_labels=2,
    )
    torch.manual_seed(seed)
    return RobertaForSequenceClassification(config)


def train_text_classifier(model: Any, texts: TextDataset, size: RobertaSize, seed: int = 0) -> Any:
    """Train every weight of the HF text classifier ``model`` on ``texts`` (cross-entropy, AdamW with a
    one-cycle schedule, ``size.epochs`` epochs of batches of ``size.batch_size``); returns it frozen, in
    eval mode."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=size.lr, weight_decay=0.01)
    n = len(texts)
    steps = size.epochs * ((n + size.batch_size - 1) // size.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=size.lr, total_steps=steps, pct_start=0.1)
    ids, mask = texts.encoded["input_ids"], texts.encoded["attention_mask"]
    model.train()
    for _ in range(size.epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, size.batch_size):
            idx = order[start : start + size.batch_size]
            loss = F.cross_entropy(model(input_ids=ids[idx], attention_mask=mask[idx]).logits, texts.labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return model.requires_grad_(False).eval()


def tweet_roberta(train_set: TextDataset, size: RobertaSize, seed: int = 0) -> tuple[Any, float]:
    """The RoBERTa classifier of ``size`` over ``train_set``'s tokenizer, trained on it; its training seconds."""
    tok = train_set.tokenizer
    model = roberta_classifier(
        tok.vocab_size,
        tok.pad_token_id,
        tok.cls_token_id,
        tok.sep_token_id,
        train_set.encoded["input_ids"].shape[1],
        size,
        seed,
    )
    start = time.perf_counter()
    train_text_classifier(model, train_set, size, seed)
    return model, time.perf_counter() - start


def cached_roberta(train_set: TextDataset, size: RobertaSize, path: str) -> tuple[Any, float]:
    """:func:`tweet_roberta` of seed 0, saved in ``path`` (with its training seconds) and read back from there
    when a run is repeated."""
    from transformers import RobertaForSequenceClassification

    record = os.path.join(path, "training.json")
    if os.path.exists(record):
        with open(record, encoding="utf-8") as f:
            saved = json.load(f)
        if saved["size"] == size.__dict__:
            return RobertaForSequenceClassification.from_pretrained(path).requires_grad_(False).eval(), saved["seconds"]
    model, seconds = tweet_roberta(train_set, size, seed=0)
    model.save_pretrained(path)
    with open(record, "w", encoding="utf-8") as f:
        json.dump({"size": size.__dict__, "seconds": seconds}, f)
    return model, seconds


def fresh_check(backbone: Any, test_set: TextDataset, n: int = 100, tau: float = 0.2) -> dict:
    """How the backbone's prediction from FRESH's words (the top-τ by last-layer [CLS] attention) and from
    the τ with the least attention agrees with its full-input prediction and the labels, on the first
    ``n`` test tweets, in ``exact`` and ``drop`` mode."""
    from sopfast.data.batches import parse_batch
    from sopfast.evaluation.attributions import cls_attention
    from sopfast.evaluation.methods import candidate_mask, run_masks, top_tau_masks
    from sopfast.model.sop import SOP

    texts = test_set.subset(torch.arange(min(n, len(test_set))))
    model = SOP(backbone, num_groups=8, tau=tau, mode="drop").eval()
    raw = next(iter(torch.utils.data.DataLoader(texts, batch_size=len(texts))))
    inputs = model.prepare(**parse_batch(raw).model_inputs())
    out: dict = {"texts": len(texts), "tau": tau}
    with torch.no_grad():
        full = backbone(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits.argmax(-1)
        attention = cls_attention(model, inputs).unsqueeze(1)
        valid = candidate_mask(model, inputs)
        for name, scores in (("most attention (FRESH)", attention), ("least attention", -attention)):
            masks = top_tau_masks(scores, valid, tau)
            for mode in ("exact", "drop"):
                pred = run_masks(model, inputs, masks, mode).logits[:, 0].argmax(-1)
                out[f"{name}, {mode}"] = {
                    "agrees with the full input": float((pred == full).float().mean()),
                    "accuracy": float((pred == texts.labels).float().mean()),
                }
    return out


def _header(quick: bool, size: RobertaSize, n_train: int, accuracy: float, seconds: float, total: float) -> str:
    params = "4 layers, hidden 256, 4 heads, MLP 1024" if size == FULL else "tiny (quick)"
    return "\n".join(
        [
            "# Issue #34's second text model: RoBERTa architecture, trained from scratch on the tweets",
            "",
            f"`OMP_NUM_THREADS=1 python bench/quality/second_text_model.py{' --quick' if quick else ''}` on "
            f"{platform.processor() or platform.machine()} ({os.cpu_count()} shared cores, no GPU), torch "
            f"{torch.__version__}, sopfast {sopfast.__version__} (its default recipe), one intra-op thread beside "
            f"other jobs: {total:.0f} s wall in all.",
            f"The backbone: `RobertaForSequenceClassification` ({params}) over the MiniLM WordPiece vocabulary, "
            f"every weight trained from scratch on the text demo's {n_train} training tweets "
            f"(`text_splits(quick={quick}, seed=0)`; {size.epochs} epochs, batch {size.batch_size}, AdamW "
            f"lr {size.lr:g} one-cycle, seed 0) in {seconds:.0f} s, then frozen; test accuracy {accuracy:.3f} "
            "on all the demo's test tweets. No pretrained RoBERTa or BERT-base is available offline. Then "
            "the text demo's study (`sopfast.demo.text.text_study`) on it, unchanged. The printed summary "
            "follows; everything in `demo_text_roberta.json`, the curves in `demo_text_roberta_curves.png`.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    from sopfast.demo.report import format_results
    from sopfast.demo.text import TEXT_SCALES, _backbone_text_accuracy, text_splits, text_study

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few texts, one seed")
    parser.add_argument(
        "--fresh-check", action="store_true", help="only the FRESH check on the trained (cached) backbone"
    )
    parser.add_argument("--out", default=None, help="where the study writes (default: a temporary folder)")
    parser.add_argument(
        "--results",
        default=None,
        help="folder for demo_text_roberta.{md,json} and the curves (default: here; quick: --out)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    device = torch.device("cpu")
    size = QUICK if args.quick else FULL
    out_dir = args.out or os.path.join("/tmp", "second_text_model" + ("_quick" if args.quick else ""))
    os.makedirs(out_dir, exist_ok=True)
    results_dir = args.results or (out_dir if args.quick else HERE)
    os.makedirs(results_dir, exist_ok=True)
    train_set, test_set = text_splits(quick=args.quick, seed=0)
    backbone, seconds = cached_roberta(train_set, size, os.path.join(out_dir, "backbone"))
    if args.fresh_check:
        check = fresh_check(backbone, test_set)
        print(json.dumps(check, indent=2))
        with open(os.path.join(results_dir, "demo_text_roberta_fresh.json"), "w", encoding="utf-8") as f:
            json.dump(check, f, indent=2)
        return check
    accuracy = _backbone_text_accuracy(backbone, test_set, device)
    print(f"RoBERTa backbone: test accuracy {accuracy:.3f} on {len(test_set)} tweets, trained in {seconds:.0f} s")
    scale = TEXT_SCALES["quick" if args.quick else "full"]
    results = text_study(backbone, train_set, test_set, out_dir, scale, device, [0] if args.quick else [0, 1])
    results["backbone"] = {
        "architecture": "RobertaForSequenceClassification",
        "size": size.__dict__,
        "train_tweets": len(train_set),
        "train_seconds": seconds,
        "test_accuracy": accuracy,
    }
    results["total_seconds"] = time.perf_counter() - start
    curves = os.path.join(results_dir, "demo_text_roberta_curves.png")
    if results.get("curves_png"):
        shutil.copyfile(results["curves_png"], curves)
        results["curves_png"] = "[demo_text_roberta_curves.png](demo_text_roberta_curves.png)"
    n_pages = len(results.get("pictures", []))
    results["pictures"] = [f"{n_pages} explanation pages in {os.path.join(out_dir, 'explanations')} (not committed)"]
    summary = format_results(results)
    print(summary)
    with open(os.path.join(results_dir, "demo_text_roberta.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    header = _header(args.quick, size, len(train_set), accuracy, seconds, results["total_seconds"])
    with open(os.path.join(results_dir, "demo_text_roberta.md"), "w", encoding="utf-8") as f:
        f.write(header + "\n" + summary + "\n")
    print(f"\nTotal {results['total_seconds']:.0f} s")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
