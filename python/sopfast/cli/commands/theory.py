"""``sopfast theory``: lower bounds on per-feature SANN error vs the group construction
(:mod:`sopfast.theory`): a table, exponential fits and a plot."""

from __future__ import annotations

import argparse

from ...theory import KINDS, MAX_ENUMERATED_D
from ..common import check_output_file, needs
from ..parser import CLIError, int_at_least

#: The largest --max-d: the binomial bound's linear program grows about as d⁴ per dimension.
MAX_D = 64


def _at_most(maximum: int, minimum: int = 0):
    at_least = int_at_least(minimum)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be an integer ≤ {maximum}, got {value}")
        return value

    parse.__name__ = f"integer in [{minimum}, {maximum}]"
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML/JSON file with option values (flags override it)")
    p.add_argument("--min-d", type=_at_most(MAX_D, 1), default=2, help="smallest dimension d (default 2)")
    p.add_argument(
        "--max-d",
        type=_at_most(MAX_D, 1),
        default=20,
        help=f"largest dimension d (default 20, at most {MAX_D}: the programs grow about as d^4)",
    )
    p.add_argument("--kind", choices=[*KINDS, "both"], default="both", help="which bound (default both)")
    p.add_argument("--mse", action="store_true", help="mean-squared-error variants instead of absolute error")
    p.add_argument("--out", default="theory.png", help="PNG path for the plot (default theory.png)")
    p.add_argument(
        "--verify-max-d",
        type=_at_most(MAX_ENUMERATED_D),
        default=12,
        help="cross-check against the programs over all 2^d subsets up to this d (default 12; 0 disables)",
    )
    p.add_argument(
        "--unequal-blocks",
        action="store_true",
        help="binomial at every d >= 2 with near-equal blocks (the paper's d=2..20 fit) instead of multiples of 3",
    )


def run(args: argparse.Namespace) -> int:
    """Print the table of minimum errors and the fits, write the plot."""
    from ...theory import compute_series, format_fits, format_table, group_check_summary, plot_series

    check_output_file("--out", args.out)
    try:
        import scipy  # noqa: F401 - the bounds are linear programs solved with scipy
    except ImportError as err:
        raise needs("scipy", "theory", "sopfast theory") from err
    if args.min_d > args.max_d:
        raise CLIError(f"--min-d ({args.min_d}) must be <= --max-d ({args.max_d})")
    kinds = list(KINDS) if args.kind == "both" else [args.kind]
    ds = range(args.min_d, args.max_d + 1)
    series = [
        compute_series(k, ds, mse=args.mse, equal_blocks=not args.unequal_blocks, verify_max_d=args.verify_max_d)
        for k in kinds
    ]
    series = [s for s in series if s.ds]
    if not series:
        raise CLIError("no dimension in the range is valid for the chosen kind")
    print(format_table(series))
    print(format_fits(series))
    print(group_check_summary(kinds, args.max_d))
    plot_series(series, args.out)
    print(f"plot written to {args.out}")
    return 0
