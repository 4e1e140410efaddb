"""The ``sopfast`` command line: ``demo``, ``train``, ``evaluate``, ``explain``, ``bench``, ``convert``, ``theory``.

Every subcommand takes ``--config FILE`` (YAML or JSON with the same keys as the long flags,
dashes or underscores); flags given on the command line win over the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

DATASETS = ("fashion-mnist", "digits", "tweets")


class CLIError(Exception):
    """A bad argument or a missing file: printed as one line, exit status 2."""


def _load_config(path: str) -> dict:
    if not os.path.exists(path):
        raise CLIError(f"--config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CLIError(f"--config {path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise CLIError(f"--config {path} must hold a mapping of option names to values")
    return {k.replace("-", "_"): v for k, v in data.items()}


def _apply_config(parser: argparse.ArgumentParser, argv: Sequence[str], args: argparse.Namespace) -> None:
    """Fill options not given on the command line from ``--config``; unknown keys are an error."""
    if not getattr(args, "config", None):
        return
    config = _load_config(args.config)
    unknown = sorted(set(config) - set(vars(args)))
    if unknown:
        raise CLIError(f"--config {args.config}: unknown option(s) {unknown}")
    given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
    for key, value in config.items():
        if key not in given:
            setattr(args, key, value)


def _add_common(p: argparse.ArgumentParser, device: bool = True) -> None:
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    if device:
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda when available)")
    p.add_argument("--seed", type=int, default=0)


def _add_model_source(p: argparse.ArgumentParser, need_checkpoint: bool) -> None:
    p.add_argument("--backbone", required=True, help="directory of a Hugging Face model saved with save_pretrained")
    p.add_argument("--checkpoint", required=need_checkpoint, help="directory written by SOP.save_pretrained")
    p.add_argument("--data", choices=DATASETS, default="fashion-mnist")
    p.add_argument("--limit", type=int, default=None, help="use only the first N examples")


def _device(name: str | None):
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError as err:
        raise CLIError(f"--device {name!r} is not a device ({err})") from err


def load_backbone(path: str):
    """A Hugging Face image or sequence classifier from a local directory."""
    if not os.path.isdir(path):
        raise CLIError(f"--backbone directory not found: {path}")
    from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    auto = AutoModelForSequenceClassification if config.model_type == "bert" else AutoModelForImageClassification
    return auto.from_pretrained(path, local_files_only=True).eval()


def load_model(args: argparse.Namespace):
    """The SOP model from ``--checkpoint`` over ``--backbone``."""
    from .checkpoint import load_pretrained

    if not os.path.isdir(args.checkpoint):
        raise CLIError(f"--checkpoint directory not found: {args.checkpoint}")
    return load_pretrained(args.checkpoint, load_backbone(args.backbone))


def load_split(name: str, split: str, limit: int | None, backbone_path: str | None = None):
    """A dataset of ``(x, y)`` pairs (images) or dicts (text) for ``name``'s ``split``."""
    from . import data

    if name == "fashion-mnist":
        return data.load_fashion_mnist(split, limit).dataset()
    if name == "digits":
        images = data.load_digits_images()
        train, test = images.split(1500)
        part = train if split == "train" else test
        return type(part)(part.x[:limit], part.y[:limit], part.classes, part.name).dataset()
    from .demo import tokenize_tweets

    texts, labels = data.load_tweets()
    cut = int(0.9 * len(texts))
    texts, labels = (texts[:cut], labels[:cut]) if split == "train" else (texts[cut:], labels[cut:])
    return tokenize_tweets(texts[:limit], labels[:limit], backbone_path)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(task=args.task, out_dir=args.out, quick=args.quick, device=_device(args.device), seed=args.seed)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import sopfast

    from .train import run_cli

    backbone = load_backbone(args.backbone)
    if args.checkpoint:
        model = load_model(args)
    else:
        model = sopfast.SOP(backbone, num_groups=args.num_groups, tau=args.tau, mode=args.mode)
    train_data = load_split(args.data, "train", args.limit, args.backbone)
    val_data = load_split(args.data, "test", args.val_limit, args.backbone)
    run_cli(args, model, train_data, val_data)
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    from .evaluate import run_cli

    model = load_model(args)
    dataset = load_split(args.data, "test", args.limit, args.backbone)
    run_cli(args, model, torch.utils.data.DataLoader(dataset, batch_size=args.batch_size))
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from .demo import write_explanations

    model = load_model(args)
    dataset = load_split(args.data, "test", args.count, args.backbone)
    paths = write_explanations(model, dataset, args.out, count=args.count, device=_device(args.device))
    print("\n".join(paths))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .demo import run_bench

    print(run_bench(args.model, batch=args.batch, groups=args.num_groups, train=args.train,
                    repeats=args.repeats, warmup=args.warmup, device=_device(args.device)))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from .authors import from_authors

    if not os.path.isdir(args.authors):
        raise CLIError(f"--authors directory not found: {args.authors}")
    model = from_authors(args.authors, load_backbone(args.backbone), tau=args.tau)
    print(model.save_pretrained(args.out))
    return 0


def _cmd_theory(args: argparse.Namespace) -> int:
    from . import theory

    return theory.run_cli(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sopfast", description="Fast Sum-of-Parts self-attributing models.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {}

    def add(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        commands[name] = handler
        p.set_defaults(handler=handler)
        return p

    p = add("demo", _cmd_demo, "End-to-end run on offline data: train a backbone, train SOP, evaluate, draw.")
    _add_common(p)
    p.add_argument("--task", choices=("image", "text"), default="image")
    p.add_argument("--out", default="sopfast-demo", help="output directory (pictures, checkpoints, results.json)")
    p.add_argument("--quick", action="store_true", help="a much smaller run (about a minute), for smoke tests")

    p = add("train", _cmd_train, "Train a SOP model over a backbone on a built-in dataset.")
    _add_common(p)
    _add_model_source(p, need_checkpoint=False)
    p.add_argument("--num-groups", type=int, default=20)
    p.add_argument("--tau", type=float, default=0.2)
    p.add_argument("--mode", choices=("exact", "drop"), default="drop")
    p.add_argument("--val-limit", type=int, default=None)
    from .train import add_cli_arguments as add_train_arguments

    add_train_arguments(p)

    p = add("evaluate", _cmd_evaluate, "Evaluate a trained SOP model (accuracy, fidelity, insertion, deletion …).")
    _add_common(p, device=False)
    _add_model_source(p, need_checkpoint=True)
    p.add_argument("--batch-size", type=int, default=32)
    from .evaluate import add_cli_arguments as add_evaluate_arguments

    add_evaluate_arguments(p)

    p = add("explain", _cmd_explain, "Write explanation pictures (PNG per image, HTML per text).")
    _add_common(p)
    _add_model_source(p, need_checkpoint=True)
    p.add_argument("--count", type=int, default=8, help="how many test examples to explain")
    p.add_argument("--out", default="explanations")

    p = add("bench", _cmd_bench, "Reference vs exact vs drop, side by side, on random weights.")
    _add_common(p)
    p.add_argument("--model", choices=("vit-b16", "vit-small", "bert-base", "bert-base-pair", "cnn"),
                   default="vit-small")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--num-groups", type=int, default=20)
    p.add_argument("--train", action="store_true", help="time a training step instead of a forward")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)

    p = add("convert", _cmd_convert, "Convert an authors' SOP checkpoint (exlib SOPImageCls) to sopfast's format.")
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    p.add_argument("--authors", required=True, help="the authors' checkpoint directory (config.json + weights)")
    p.add_argument("--backbone", required=True, help="the frozen backbone, a Hugging Face directory")
    p.add_argument("--out", required=True, help="output directory (SOP.save_pretrained format)")
    p.add_argument("--tau", type=float, default=0.2, help="the authors' k: fraction of features per group")

    p = add("theory", _cmd_theory, "Lower bounds on per-feature SANN error vs the group construction.")
    from . import theory

    theory.add_cli_arguments(p)
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _apply_config(parser, argv, args)
        return int(args.handler(args) or 0)
    except (CLIError, FileNotFoundError, ValueError, TypeError) as err:
        print(f"sopfast {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
