"""The demo's summary in Markdown: the quantities, SOP against the baselines, the paper's curves and
the diagnostic — for the image demo twice, on the backbone as trained and on its adapted copy."""

from __future__ import annotations

from .debugging import debugging_table

COMPARISON_COLUMNS = (
    ("accuracy", "accuracy ↑", "{:.3f}"),
    ("agreement", "agrees with the backbone ↑", "{:.3f}"),
    ("agreement_kl", "KL from the backbone ↓", "{:.3f}"),
    ("insertion", "insertion ↑", "{:.3f}"),
    ("deletion", "deletion ↓", "{:.3f}"),
    ("distinct_groups", "distinct groups", "{:.1f}"),
    ("pairwise_iou", "pairwise IoU", "{:.2f}"),
    ("union_coverage", "coverage", "{:.2f}"),
    ("groups_used", "groups used", "{:.1f}"),
    ("on_object", "on object", "{:.2f}"),
    ("fidelity", "fidelity", "{:.1e}"),
)


def _label(name: str, row: dict) -> str:
    seeds = row.get("seeds", 1)
    return f"{name} ({seeds} seeds)" if seeds > 1 else name


def format_comparison(comparison: dict[str, dict], spread: dict[str, dict] | None = None) -> str:
    """Markdown table of the methods' scalar metrics (mean ± half the range over the seeds where a
    method was trained with several; the best accuracy and insertion in bold)."""
    from ..evaluation.seeds import format_with_spread

    spread = spread or {}
    best = {
        key: max(r[key] for r in comparison.values() if key in r and r[key] == r[key])
        for key in ("accuracy", "insertion")
        if any(key in r for r in comparison.values())
    }
    header = "| method | " + " | ".join(title for _, title, _ in COMPARISON_COLUMNS) + " |"
    lines = [header, "|---|" + "---|" * len(COMPARISON_COLUMNS)]
    for name, r in comparison.items():
        cells = []
        for key, _, fmt in COMPARISON_COLUMNS:
            value = r.get(key, float("nan"))
            if value != value:
                text = "–"
            elif spread.get(name, {}).get(key) and key in (
                "accuracy",
                "agreement",
                "insertion",
                "deletion",
                "on_object",
            ):
                text = format_with_spread(value, spread[name][key])
            else:
                text = fmt.format(value)
            cells.append(f"**{text}**" if key in best and value == best[key] else text)
        lines.append(f"| {_label(name, r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_curves(comparison: dict[str, dict], spread: dict[str, dict] | None = None) -> str:
    """Markdown tables of the paper's curves: per group count m, accuracy at each inference τ
    (columns) for every method that has curves (one-group methods appear under every m)."""
    from ..evaluation.seeds import format_with_spread

    spread = spread or {}
    owners = {name: r["curves"] for name, r in comparison.items() if r.get("curves")}
    parsed = [(k, *k.partition("/")[::2]) for c in owners.values() for k in c]
    taus = list(dict.fromkeys(tau for _, tau, _ in parsed))
    counts = list(dict.fromkeys(m for _, _, m in parsed if m)) or [""]
    tables = []
    for m in counts:
        lines = [f"| {'m = ' + m if m else 'method'} | " + " | ".join(f"τ = {t}" for t in taus) + " |"]
        lines.append("|---|" + "---:|" * len(taus))
        for name, curve in owners.items():
            cells = []
            for tau in taus:
                key = f"{tau}/{m}" if f"{tau}/{m}" in curve else tau
                value = curve.get(key, float("nan"))
                cells.append(format_with_spread(value, spread.get(name, {}).get("curves", {}).get(key)))
            if any(c != "–" for c in cells):
                lines.append(f"| {_label(name, comparison[name])} | " + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def _seed_note(seeds: int) -> str:
    if seeds == 1:
        return "one training seed"
    return f"SOP and random groups: mean ± half the range over {seeds} training seeds; the others do not depend on them"


def _curve_note(row: dict) -> str:
    n = row.get("curve_examples")
    return "" if n is None or n == row.get("examples") else f" (fidelity, insertion and deletion on the first {n:.0f})"


def _quantities(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(k) for k, _ in rows)
    return ["| quantity | value |", "|---|---|"] + [f"| {k.ljust(width)} | {v} |" for k, v in rows]


def _study_lines(study: dict, chance: float) -> list[str]:
    """One backbone's part of the summary: its quantities, the comparison and the curves."""
    seconds = study.get("sop_train_seconds", [])
    rows = [
        ("backbone accuracy", f"{study['backbone_accuracy']:.3f}"),
        ("untrained SOP accuracy (chance)", f"{study['untrained_accuracy']:.3f} ({chance:.3f})"),
        ("SOP accuracy, exact (first seed)", f"{study['sop_exact_accuracy']:.3f}"),
        ("SOP accuracy, drop (first seed)", f"{study['sop_drop_accuracy']:.3f}"),
        ("exact/drop prediction agreement", f"{study['exact_drop_agreement']:.3f}"),
        ("exact/drop group-prediction agreement", f"{study['exact_drop_group_agreement']:.3f}"),
        ("mean groups used per prediction (exact)", f"{study['active_groups_exact']:.2f}"),
        ("mean groups used per prediction (drop)", f"{study['active_groups_drop']:.2f}"),
        ("SOP training wall time per seed", ", ".join(f"{s:.1f} s" for s in seconds)),
    ]
    lines = _quantities(rows)
    if "diagnosis" in study:
        lines += ["", "The backbone diagnostic before training (`sopfast.diagnose`):", "```"]
        lines += [*_diagnosis_lines(study["diagnosis"]), "```"]
    comparison, spread = study["comparison"], study.get("spread")
    n = int(comparison["SOP"].get("examples", 0))
    seeds = comparison["SOP"].get("seeds", 1)
    lines += [
        "",
        f"SOP vs the baselines on {n} test inputs{_curve_note(comparison['SOP'])} "
        f"({study.get('mode', 'drop')} mode, recipe '{study.get('recipe')}'; {_seed_note(seeds)}):",
        format_comparison(comparison, spread),
    ]
    curves = format_curves(comparison, spread)
    if curves:
        lines += ["", "Accuracy over inference sparsity τ, one table per group count m (the paper's curves):", curves]
    if "curves_png" in study:
        lines += ["", f"Curves: {study['curves_png']}"]
    lines += ["", *debugging_table(comparison)]
    return [*lines, "", "Pictures: " + ", ".join(study.get("pictures", []))]


def _text_lines(results: dict) -> list[str]:
    """The text demo's additions: the comparison on the long texts and the targets of issue #34."""
    lines: list[str] = []
    if "long" in results:
        long = results["long"]
        n = int(long["comparison"]["SOP"].get("examples", 0))
        lines += [
            "",
            f"The same on the {n} texts of at least {results.get('long_text', 12)} tokens:",
            format_comparison(long["comparison"], long["spread"]),
            "",
            format_curves(long["comparison"], long["spread"]),
        ]
    if "majority" in results:
        lines += ["", f"Majority class share of the compared texts: {results['majority']:.3f}"]
    lines += ["", "Targets (SOP's mean over the seeds; m = 8 groups):", "| target | SOP | against | gap | met |"]
    lines.append("|---|---:|---:|---:|---|")
    for name, sop, other, met in text_targets(results["comparison"]):
        lines.append(f"| {name} | {sop:.3f} | {other:.3f} | {sop - other:+.3f} | {'yes' if met else 'no'} |")
    return lines


def text_targets(comparison: dict[str, dict]) -> list[tuple[str, float, float, bool]]:
    """``(target, SOP's value, the value it is held against, met)`` for issue #34's text targets: accuracy
    at τ = 0.2 (the model's) ≥ every -F baseline and FRESH; ≥ random groups + 3 points at τ ∈ {0.05,
    0.1, 0.2} (m = 8); ≥ 6 distinct groups of 8; insertion ≥ IG-F's."""
    sop = comparison["SOP"]
    rivals = {n: r["accuracy"] for n, r in comparison.items() if n.endswith("-F") or n == "FRESH"}
    out = []
    if rivals:
        best = max(rivals, key=lambda n: rivals[n])
        out.append(
            (f"accuracy ≥ the best -F / FRESH ({best})", sop["accuracy"], rivals[best], sop["accuracy"] >= rivals[best])
        )
    random = comparison.get("Random", {}).get("curves", {})
    for tau in ("0.05", "0.1", "0.2"):
        key = f"{tau}/8"
        if key in random and key in sop.get("curves", {}):
            mine, theirs = sop["curves"][key], random[key] + 0.03
            out.append((f"τ = {tau}: ≥ random groups + 0.03", mine, theirs, mine >= theirs))
    if "distinct_groups" in sop:
        out.append(("distinct groups ≥ 6 of 8", sop["distinct_groups"], 6.0, sop["distinct_groups"] >= 6.0))
    if "IG-F" in comparison and "insertion" in sop:
        ig = comparison["IG-F"]["insertion"]
        out.append(("insertion ≥ IG-F's", sop["insertion"], ig, sop["insertion"] >= ig))
    return out


def _diagnosis_lines(diagnosis: dict) -> list[str]:
    from ..masking.diagnose import Diagnosis, GroupAccuracy
    from ..masking.own_groups import OwnGroups

    fields = {k: v for k, v in diagnosis.items() if k in Diagnosis.__dataclass_fields__}
    fields["random_groups"] = {m: GroupAccuracy(**g) for m, g in diagnosis["random_groups"].items()}
    if fields.get("own_groups") is not None:
        fields["own_groups"] = OwnGroups(**fields["own_groups"])
    return Diagnosis(**fields).lines()


def format_results(results: dict) -> str:
    """The demo's summary (markdown): the quantities, the comparison and the curves — for the image
    demo twice, on the backbone as trained and on its adapted copy."""
    if "ordinary" not in results:  # the text demo: one backbone
        lines = [f"Data set: {results['dataset']}", "", *_study_lines(results, results["chance"])]
        lines += _text_lines(results)
    else:
        adaptation = results["adaptation"]
        rows = [
            ("data set", results["dataset"]),
            ("backbone accuracy, as trained (no masking)", f"{results['ordinary']['backbone_accuracy']:.3f}"),
            ("backbone accuracy, adapted copy", f"{results['adapted']['backbone_accuracy']:.3f}"),
            ("adaptation wall time", f"{adaptation['seconds']:.1f} s ({adaptation['settings']['steps']} steps)"),
        ]
        lines = _quantities(rows)
        lines += [
            "",
            "## SOP on the backbone as trained (whole images, no masking)",
            "",
            *_study_lines(results["ordinary"], results["chance"]),
        ]
        lines += [
            "",
            "## SOP on the adapted copy (`sopfast adapt`: fine-tuned under random patch masking; SOP then explains "
            "the copy, not the original)",
            "",
            *_study_lines(results["adapted"], results["chance"]),
        ]
    for name, value in results.get("epoch_seconds", {}).items():
        lines.append(f"training epoch, {name} (recipe 'paper'): {value:.1f} s")
    if "timing_table" in results:
        lines += ["", "One training step, batch of 32 (same run):", results["timing_table"]]
    return "\n".join(lines)
