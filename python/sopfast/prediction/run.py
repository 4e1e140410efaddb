"""``sopfast.predict``: a whole dataset through a SOP model (or a backbone and a perturbation
explainer), written as a Parquet dataset — sharded, resumable, and split over the processes of
``torchrun``.  docs/predict.md shows the command, the columns and queries."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..adapters import BackboneAdapter
from ..adapters.base import check_mode
from ..checks import check_bool, check_choice, check_int, check_path
from ..data.batches import check_ground_truth_key, parse_batch
from ..devices import check_device, resolve_device
from ..evaluation.registry import feature_ground_truth
from ..masking.explainers import ExplainerName
from ..masking.forward import adapter_of
from ..model.output import SOPOutput
from ..model.sop import SOP
from ..training.config import AMP_DTYPES
from ..training.distributed import DistInfo, barrier, cleanup, init_distributed
from ..types import FeatureInputs
from .card import card
from .columns import BACKBONE_OUTPUTS, DEFAULT_OUTPUTS, OUTPUTS, SOP_OUTPUTS, BatchPredictions, Output, record_batch
from .explainers import check_explainer, explain, input_shaped
from .loading import LoadedBatch, ShardPlan, Skipped, check_dataset, make_loader, read_example
from .store import FORMAT, OutputDir, data_fingerprint, model_fingerprint

logger = logging.getLogger(__name__)


@dataclass
class PredictResult:
    """What one process did: ``rows`` written and ``skipped`` (unreadable) examples in this run,
    ``shards_written`` now and ``shards_kept`` from an earlier run, in ``seconds`` (the loop alone);
    ``skipped_file`` lists every skipped example of the dataset (``None``: none, or not rank 0)."""

    output_dir: str
    examples: int
    rows: int
    skipped: int
    shards_written: int
    shards_kept: int
    seconds: float
    rank: int = 0
    world_size: int = 1
    skipped_file: str | None = None

    @property
    def examples_per_s(self) -> float:
        return (self.rows + self.skipped) / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line: rows, speed, shards, skipped examples, where."""
        who = f" (rank {self.rank} of {self.world_size})" if self.world_size > 1 else ""
        skipped = f", {self.skipped} unreadable skipped" if self.skipped else ""
        listed = f" (listed in {self.skipped_file})" if self.skipped_file else ""
        return (
            f"predicted {self.rows} examples{who} in {self.seconds:.1f} s ({self.examples_per_s:.1f} examples/s)"
            f"{skipped}{listed}; {self.shards_written} shards written, {self.shards_kept} kept from an earlier run; "
            f"{self.examples} examples in {self.output_dir}"
        )


@dataclass
class _Run:
    """The settings one batch is computed with."""

    model: nn.Module
    adapter: BackboneAdapter
    device: torch.device
    outputs: tuple[str, ...]
    explainer: str | None
    explainer_options: dict[str, Any]
    input_shaped: bool
    mode: str | None
    amp: str | None
    seed: int
    ground_truth_key: str | int | None
    tokenizer: Any = None  # text: names the tokens (the dataset's ``tokenizer``)

    @property
    def sop(self) -> SOP | None:
        return self.model if isinstance(self.model, SOP) else None

    def autocast(self) -> AbstractContextManager:
        return nullcontext() if self.amp is None else torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])


def predict(
    model: nn.Module,
    dataset: Dataset,
    output_dir: str | os.PathLike,
    *,
    batch_size: int = 32,
    num_workers: int | None = None,
    outputs: Sequence[Output] | None = None,
    explainer: ExplainerName | None = None,
    explainer_options: dict[str, Any] | None = None,
    attribution_shape: Literal["features", "input"] = "features",
    mode: Literal["exact", "drop"] | None = None,
    device: str | torch.device | None = None,
    amp: Literal["bf16", "fp16"] | None = None,
    shard_size: int = 1000,
    strict: bool = False,
    seed: int = 0,
    ground_truth_key: str | int | None = None,
    description: str | None = None,
    progress: bool = True,
) -> PredictResult:
    """Predict every example of ``dataset`` and write the predictions as a Parquet dataset in ``output_dir``.

    Args:
        model: a :class:`sopfast.SOP` (its predictions and groups), or a backbone sopfast has an
            adapter for (its logits; with ``explainer`` its attributions).
        dataset: a map-style dataset whose items :func:`sopfast.data.batches.parse_batch` reads once
            collated (``(x, y)``, ``(x, y, object_mask)``, dicts of token ids …).
        output_dir: a new or empty directory, or one this same run wrote before (it is resumed:
            the shards that prove themselves against ``predict.json`` are kept, the rest computed,
            each with a warning saying why).  A directory of another model, data or settings is
            refused, as are one whose ``predict.json`` cannot be read and one whose ``data/`` holds
            files this run does not write.
        batch_size: examples per forward.
        num_workers: DataLoader worker processes reading the data (0: this process; default: half
            the CPU cores, at most 4).
        outputs: the optional columns to write (default: all but attributions).
        explainer: also write this explainer's attributions of the predicted class (one of
            :data:`sopfast.masking.EXPLAINERS`), run on sopfast's masked inference, each example alone
            with the same seed.
        explainer_options: the explainer's options (rise: num_masks, keep, cells; kernelshap, lime,
            shapley_sampling: n_samples, perturbations_per_eval; occlusion: window, perturbations_per_eval;
            feature_ablation: perturbations_per_eval; ig: n_steps, internal_batch_size).
        attribution_shape: attributions per feature (features) or per pixel (input; images).
        mode: group execution of SOP and of the explainer (default: the model's mode for SOP,
            sopfast.masking's default for the explainer).
        device: run there (default: CUDA when available; under torchrun this process's GPU).
        amp: autocast the forward in bf16 or fp16.
        shard_size: examples per Parquet shard; bounds the memory a run holds.
        strict: stop at the first example that cannot be read (default: skip it, list it).
        seed: the explainer's random seed.
        ground_truth_key: where batches keep object masks (dict key or tuple position; default: the
            third tuple entry or an evidence_mask / gt_mask / ground_truth key).
        description: what the data is, for the dataset card.
        progress: show a progress bar and print a summary line.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a sopfast.SOP or a backbone (nn.Module), got {type(model).__name__}")
    columns = _check_outputs(model, outputs)
    explainer_options = check_explainer(explainer, explainer_options)
    check_int("batch_size", batch_size, 1)
    num_workers = (
        min(4, (os.cpu_count() or 1) // 2) if num_workers is None else check_int("num_workers", num_workers, 0)
    )
    check_int("shard_size", shard_size, 1)
    check_int("seed", seed, 0)
    check_bool("strict", strict)
    check_bool("progress", progress)
    check_choice("attribution_shape", attribution_shape, ("features", "input"))
    check_choice("amp", amp, (None, *AMP_DTYPES))
    check_ground_truth_key(ground_truth_key)
    adapter = adapter_of(model)
    if mode is not None:
        check_mode(adapter, mode)
    if explainer is not None and isinstance(model, SOP) and model.task != "classification":
        raise ValueError(f"explainer {explainer!r} explains a predicted class; this model's task is {model.task!r}")
    check_path("output_dir", output_dir)
    check_dataset(dataset)
    if description is not None and not isinstance(description, str):
        raise TypeError(f"description must be a str or None, got {type(description).__name__}")
    info = init_distributed(None if device is None else check_device(device).type)
    was_training = model.training
    try:
        run = _Run(
            model,
            adapter,
            resolve_device(device, local_rank=info.local_rank if info.enabled else None),
            columns,
            explainer,
            explainer_options,
            attribution_shape == "input",
            mode,
            amp,
            seed,
            ground_truth_key,
            getattr(dataset, "tokenizer", None),
        )
        model.to(run.device).eval()
        return _predict(
            run, dataset, output_dir, info, batch_size, num_workers, shard_size, strict, description, progress
        )
    finally:
        model.train(was_training)
        cleanup(info)


def _check_outputs(model: nn.Module, outputs: Sequence[str] | None) -> tuple[str, ...]:
    sop = isinstance(model, SOP)
    if outputs is None:
        return DEFAULT_OUTPUTS if sop else BACKBONE_OUTPUTS
    chosen = (outputs,) if isinstance(outputs, str) else tuple(outputs)
    for name in chosen:
        check_choice("outputs", name, OUTPUTS)
    if not sop and set(chosen) & set(SOP_OUTPUTS):
        raise ValueError(
            f"outputs {sorted(set(chosen) & set(SOP_OUTPUTS))} need a SOP model; a backbone writes only 'logits' "
            "and 'tokens' (and an explainer's attributions)"
        )
    return tuple(dict.fromkeys(chosen))


def _predict(
    run: _Run,
    dataset: Dataset,
    output_dir: str | os.PathLike,
    info: DistInfo,
    batch_size: int,
    num_workers: int,
    shard_size: int,
    strict: bool,
    description: str | None,
    progress: bool,
) -> PredictResult:
    examples = len(dataset)  # type: ignore[arg-type]
    plan = ShardPlan(examples, shard_size)
    store = OutputDir(output_dir, plan)
    schema = _schema(run, dataset, examples)
    settings = _settings(run)
    manifest = {
        "format": FORMAT,
        "model": model_fingerprint(run.model, settings),
        "data": data_fingerprint(dataset),
        "settings": settings,
        "examples": examples,
        "shard_size": shard_size,
        "shards": plan.shards,
        "columns": schema.names,
    }
    resuming = store.check(manifest)
    barrier(info)
    if info.is_main and not resuming:
        store.create(manifest)
    barrier(info)
    store.open()
    owned = plan.owned(info.rank, info.world_size)
    kept = store.proven(owned)
    todo = [s for s in owned if s not in kept]
    loader = make_loader(dataset, plan, todo, batch_size, num_workers, run.device.type == "cuda")
    total = sum(len(plan.ids(s)) for s in todo)
    bar = tqdm(total=total, unit="ex", desc="predict", disable=not (progress and info.is_main), dynamic_ncols=True)
    result = PredictResult(str(output_dir), examples, 0, 0, 0, len(kept), 0.0, info.rank, info.world_size)
    start = time.perf_counter()
    _write_shards(run, loader, plan, store, schema, strict, bar, result)
    result.seconds = time.perf_counter() - start
    bar.close()
    barrier(info)
    if info.is_main:
        records, every = store.complete()
        text = card(
            model=_describe(run),
            data=description or type(dataset).__name__,
            examples=examples,
            rows=examples - len(every),
            skipped=len(every),
            shards=plan.shards,
            columns=schema.names,
            settings=settings,
            explainer=run.explainer,
        )
        result.skipped_file = store.finish(text, records, every)
    logger.debug(result.summary())
    if progress and info.is_main:
        print(f"sopfast: {result.summary()}", file=sys.stderr)
    return result


def _write_shards(
    run: _Run,
    loader: Any,
    plan: ShardPlan,
    store: OutputDir,
    schema: Any,
    strict: bool,
    bar: Any,
    result: PredictResult,
) -> None:
    """Predict the loader's batches and write each shard once its last batch is done."""
    shard: int | None = None
    parts: list[Any] = []
    skipped: list[Skipped] = []
    for loaded in loader:
        first = loaded.ids[0] if loaded.ids else loaded.skipped[0].id
        if shard is not None and plan.shard_of(first) != shard:
            _write(store, shard, schema, parts, skipped, result)
            parts, skipped = [], []
        shard = plan.shard_of(first)
        if loaded.skipped and strict:
            bad = loaded.skipped[0]
            raise ValueError(f"example {bad.id} ({bad.source or 'no file'}) cannot be read: {bad.error} (strict)")
        skipped += loaded.skipped
        if loaded.batch is not None:
            part = record_batch(_compute(run, loaded), run.outputs, run.explainer)
            if not part.schema.equals(schema):
                raise ValueError(
                    f"examples {loaded.ids[0]}…{loaded.ids[-1]} give columns {part.schema} unlike the first's {schema}"
                )
            parts.append(part)
        result.rows += len(loaded.ids)
        result.skipped += len(loaded.skipped)
        bar.update(len(loaded.ids) + len(loaded.skipped))
    if shard is not None:
        _write(store, shard, schema, parts, skipped, result)


def _write(
    store: OutputDir, shard: int, schema: Any, parts: list[Any], skipped: list[Skipped], result: PredictResult
) -> None:
    import pyarrow as pa

    store.write_shard(shard, pa.Table.from_batches(parts, schema=schema), skipped)
    result.shards_written += 1


def _schema(run: _Run, dataset: Dataset, examples: int) -> Any:
    """The columns' schema, from the first readable example (so a shard of unreadable ones has it too)."""
    first_error = None
    for index in range(examples):
        try:
            item, error = read_example(dataset, index)
        except LookupError as err:  # a dict keyed otherwise, a sequence shorter than it says
            raise TypeError(
                f"dataset[{index}] raised {type(err).__name__}: {err}; dataset must give its examples at 0 … "
                f"len(dataset) − 1 = {examples - 1}"
            ) from err
        if error is None:
            try:  # the item's form, before anything else reads it
                batch = torch.utils.data.default_collate([item])
                run.adapter.prepare(**parse_batch(batch, run.ground_truth_key).adapter_inputs())  # type: ignore[arg-type]
            except (TypeError, ValueError) as err:
                kind = TypeError if isinstance(err, TypeError) else ValueError
                raise kind(f"dataset[{index}] does not fit the model: {err}") from err
            predictions = _compute(run, LoadedBatch([index], [None], batch, []))
            return record_batch(predictions, run.outputs, run.explainer).schema
        first_error = first_error or f"example {index}: {error}"
    raise ValueError(f"no example of the dataset can be read ({first_error})")


def _settings(run: _Run) -> dict[str, Any]:
    """What, besides the weights and the data, decides the rows (the manifest compares it)."""
    sop = run.sop
    return {
        "outputs": list(run.outputs),
        "explainer": run.explainer,
        "explainer_options": run.explainer_options or None,
        "attribution_shape": "input" if run.input_shaped else "features",
        "mode": run.mode if sop is None else run.mode or sop.mode,
        "tau": None if sop is None else sop.tau,
        "num_groups": None if sop is None else sop.num_groups,
        "amp": run.amp,
        "seed": run.seed if run.explainer else None,
    }


def _describe(run: _Run) -> str:
    sop = run.sop
    backbone = type(run.adapter.backbone).__name__
    if sop is None:
        return f"the backbone {backbone}"
    return f"a SOP model over {backbone} ({sop.num_groups} groups, τ = {sop.tau}, mode {sop.mode})"


def _agreement(run: _Run) -> bool:
    """Whether the rows hold the backbone's own full-input prediction (``backbone_prediction``)."""
    return run.sop is not None and run.sop.task == "classification" and "backbone_prediction" in run.outputs


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _compute(run: _Run, loaded: LoadedBatch) -> BatchPredictions:
    """The predictions of one loaded batch (:class:`~sopfast.prediction.columns.BatchPredictions`)."""
    batch = parse_batch(loaded.batch, run.ground_truth_key).to(run.device)
    sop = run.sop
    # the adapter's view of the batch, for what needs it beyond SOP's forward (which prepares its own)
    inputs = None
    if sop is None or run.explainer or run.input_shaped or batch.ground_truth is not None or _agreement(run):
        inputs = run.adapter.prepare(**batch.adapter_inputs())  # type: ignore[arg-type]
    with torch.inference_mode(), run.autocast():
        out = None if sop is None else sop(**batch.model_inputs(), mode=run.mode)
        logits = (out.logits if out is not None else run.adapter.full_forward(inputs)[0]).float()  # type: ignore[arg-type]
        classification = sop is None or sop.task == "classification"
        target = logits.argmax(-1)
        labels = None if batch.labels is None else batch.labels.cpu().numpy()
        p = BatchPredictions(loaded.ids, loaded.sources, labels, _host(logits), classification)
        if "tokens" in run.outputs and run.tokenizer is not None and batch.input_ids is not None:
            p.tokens = _tokens(run.tokenizer, batch.input_ids, batch.attention_mask)
        if sop is not None and out is not None:
            _sop_columns(run, sop, out, inputs, batch.ground_truth, target if classification else 0, p)
    if run.explainer is not None and inputs is not None:
        values = explain(run.explainer, run.adapter, inputs, target, run.mode, run.seed, run.explainer_options)
        p.explanation = _host(_shaped(run, inputs, values))
    return p


def _sop_columns(
    run: _Run,
    sop: SOP,
    out: SOPOutput,
    inputs: FeatureInputs | None,
    ground_truth: torch.Tensor | None,
    target: torch.Tensor | int,
    p: BatchPredictions,
) -> None:
    """Fill ``p`` with the SOP columns that ``run.outputs`` asks for."""
    wanted = set(run.outputs)
    p.group_indices = out.group_indices.cpu().numpy() if "groups" in wanted else None
    p.lam = _host(out.lam) if "lam" in wanted else None
    p.group_scores = _host(out.group_scores) if wanted & {"group_scores", "used_groups"} else None
    p.group_logits = _host(out.group_logits) if "group_logits" in wanted else None
    if "backbone_prediction" in wanted and sop.task == "classification":
        if out.backbone_logits is not None:
            p.backbone_logits = _host(out.backbone_logits)
        elif inputs is not None:  # prepared for it (_agreement)
            p.backbone_logits = _host(sop.reference_logits(inputs))
    if "attributions" in wanted:
        p.attributions = _host(_shaped(run, inputs, out.feature_attributions(target)))
    if "object_fraction" in wanted and ground_truth is not None and inputs is not None:
        on_object = feature_ground_truth(sop, inputs, ground_truth).unsqueeze(1)
        p.object_fraction = _host((out.group_masks & on_object).sum(-1) / out.group_masks.sum(-1).clamp_min(1))


def _tokens(tokenizer: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[str | None]]:
    """Each example's token strings ``[B][T]`` (a feature's index is its position), ``None`` at padding."""
    shown = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    return [
        [token if keep else None for token, keep in zip(tokenizer.convert_ids_to_tokens(ids), kept)]
        for ids, kept in zip(input_ids.tolist(), shown.tolist())
    ]


def _shaped(run: _Run, inputs: FeatureInputs | None, values: torch.Tensor) -> torch.Tensor:
    return input_shaped(run.adapter, inputs, values) if run.input_shaped and inputs is not None else values
