"""``sopfast.train``: train an SOP model (AMP, checkpoints, exact resume, DDP under torchrun).

Only the trainable parts (projection copy, generator, selector) are optimised, with AdamW.
Runs are deterministic given ``seed``: the data order of epoch ``e`` comes from a sampler
seeded with ``seed + e``, and a resumed run restores weights, optimizer, scheduler, scaler,
RNG states and the position inside the epoch, so it ends with the same weights as a run that
was never interrupted.  See ``docs/training.md``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from itertools import islice
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..data.batches import to_device
from ..devices import resolve_device
from ..masking.diagnose import diagnose_run, saved_diagnosis
from ..masking.verdicts import below_the_bar
from ..model.checkpoint import (
    STATE_NAME,
    load_trainable_state_dict,
    load_training_state,
    remove_stale_temp_files,
    save_training_state,
    trainable_state_dict,
)
from ..model.group_counts import distinct_rows
from ..model.numerics import flush_denormal
from ..model.sop import SOP
from .callbacks import LegacyCallback, TrainerCallback, as_callbacks, emit
from .collapse import collapsed_groups
from .config import AMP_DTYPES, METRICS, STATE_FORMAT, TrainConfig, TrainResult, resolve_metric
from .distributed import (
    ResumableSampler,
    all_reduce_sum,
    barrier,
    cleanup,
    init_distributed,
    make_eval_loader,
    make_train_loader,
    no_sync,
    num_train_batches,
    wrap_ddp,
)
from .guards import NonFiniteLossError, check_savable, step_error
from .optimizer import build_optimization
from .records import RunRecords, write_run_config
from .resume import check_resumable, fingerprint, resume_message, resume_path, run_identity
from .state import capture_rng, restore_rng, seed_everything
from .step_values import StepValues
from .stopping import Stopping
from .validation import forward_batch, has_unused_parameters, validate

Callback = TrainerCallback | LegacyCallback
logger = logging.getLogger("sopfast.training")


class Trainer:
    """Trains ``model`` on ``train_data`` (see :class:`TrainConfig` for ``options``).

    ``callbacks`` are :class:`~sopfast.training.callbacks.TrainerCallback` s (``on_step_end``, ``on_log``,
    ``on_evaluate``, ``on_save``, ``on_train_end`` …); set ``trainer.should_stop = True`` in one to stop
    after the current step (state is saved).
    """

    def __init__(
        self,
        model: SOP,
        train_data: Dataset | DataLoader,
        val_data: Dataset | DataLoader | None = None,
        *,
        callbacks: Sequence[Callback] | None = None,
        run_config: Mapping[str, Any] | None = None,
        **options: Any,
    ):
        if not isinstance(model, SOP):
            raise TypeError(f"model must be a sopfast.SOP, got {type(model).__name__}")
        self.config = TrainConfig(**options).resolved(model.recipe, model.adapter.modality)
        self.run_config = dict(run_config or {})
        for data, name in ((train_data, "train_data"), (val_data, "val_data")):
            if data is not None and not isinstance(data, DataLoader) and self.config.batch_size is None:
                raise ValueError(f"{name} is a Dataset: give batch_size= (or pass a DataLoader)")
        self.callbacks = as_callbacks(callbacks)
        self.model = model
        self.train_data, self.val_data = train_data, val_data
        self.metric = resolve_metric(self.config.metric, model.task)
        self.step = self.epoch = self.batches_done = 0
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.metrics: dict[str, float] = {}
        self.should_stop = False
        self.stopping = Stopping(None)
        self.diagnosis: dict[str, Any] | None = None
        self._backbone_sha256: str | None = None
        self._pending_rng: dict[str, Any] | None = None
        self._eval_step: int | None = None
        self.pbar: tqdm | None = None

    # -- public -------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train until the planned epochs are done, ``max_steps`` is reached, the validation metric stops
        improving (``patience``) or a callback stops it."""
        cfg = self.config
        self.info = init_distributed(torch.device(cfg.device).type if cfg.device is not None else None)
        main = self.info.is_main
        self.log = RunRecords(cfg.log_file if main else None, cfg.output_dir if main else None)
        try:
            self._setup()
            self._emit("begin", {"step": self.step, "total_steps": self.total_steps})
            while self.epoch < self.epochs and not self._done():
                self._run_epoch()
            result = self._finish()
        finally:
            self.log.close()
            if self.pbar is not None:
                self.pbar.close()
            cleanup(self.info)
        return result

    def evaluate(self) -> dict[str, float]:
        """The validation metrics over all ranks (:func:`sopfast.training.validation.validate`)."""
        if self.val_loader is None:
            raise TypeError("evaluate() needs val_data (and runs inside fit())")
        return validate(self.model, self.val_loader, self.device, self.info, self._autocast)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs (weights of the trainable parts included)."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            **self.stopping.state_dict(),
            "fingerprint": self._fingerprint,
            "backbone_sha256": self.backbone_sha256,
            "model": trainable_state_dict(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": capture_rng(),
        }

    def save_state(self) -> None:
        """Write ``output_dir/training_state.pt`` atomically, with its checksum (rank 0 only)."""
        output_dir = self.config._output_path
        if self.info.is_main and output_dir is not None:
            check_savable(self)
            save_training_state(self.state_dict(), output_dir / STATE_NAME)
            self._emit("save", {"step": self.step, "what": "state", "path": str(output_dir / STATE_NAME)})

    @property
    def backbone_sha256(self) -> str:
        if self._backbone_sha256 is None:
            self._backbone_sha256 = self.model.backbone_sha256()
        return self._backbone_sha256

    # -- setup ------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg, info = self.config, self.info
        self.device = resolve_device(cfg.device, local_rank=info.local_rank if info.enabled else None)
        if info.is_main and cfg.output_dir is not None:
            remove_stale_temp_files(cfg.output_dir)
            self.log.describe_run(*write_run_config(cfg, self.model, self.run_config), self.metric)
        self.model.to(self.device)
        seed_everything(cfg.seed)
        self.train_loader = make_train_loader(self.train_data, cfg.batch_size, info, cfg.seed)
        self.val_loader = None if self.val_data is None else make_eval_loader(self.val_data, cfg.batch_size, info)
        self.batches_per_epoch = num_train_batches(self.train_loader)
        self.steps_per_epoch = math.ceil(self.batches_per_epoch / cfg.grad_accum)
        self.epochs = cfg.planned_epochs(self.steps_per_epoch)
        self.total_steps = self.epochs * self.steps_per_epoch
        self.eval_every = cfg.eval_interval(self.steps_per_epoch)
        self.stopping.patience = cfg.early_stopping_patience(self.val_loader is not None)
        self.stopping.min_steps = self.total_steps // 2 if cfg.epochs is None else 0
        optimization = build_optimization(self.model, cfg, self.total_steps)
        self.optimizer, self.scheduler = optimization.optimizer, optimization.scheduler
        self.warmup_steps, self.head_phase = optimization.warmup_steps, optimization.head_phase
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.amp == "fp16" and self.device.type == "cuda")
        self._resume()
        if cfg.diagnose and self.model.task == "classification":
            self._diagnose()
        find_unused = cfg.find_unused_parameters
        if find_unused is None and info.enabled:
            find_unused = has_unused_parameters(self.model, next(iter(self.train_loader)), self.device, self._autocast)
        self.ddp_model = wrap_ddp(self.model, self.device, info, bool(find_unused))
        last = self.total_steps if cfg.max_steps is None else min(cfg.max_steps, self.total_steps)
        self.pbar = tqdm(
            total=last,
            initial=min(self.step, last),
            desc="sopfast train",
            disable=not (cfg.progress and info.is_main),
            dynamic_ncols=True,
        )
        self.steps = StepValues()  # the losses by term and gradient norms, on the device until written
        # the first optimizer step whose loss or gradient was not finite (-1: none), tracked on the
        # device and read only where the run logs or writes (no host sync per step)
        self._first_bad_step = torch.full((), -1, dtype=torch.long, device=self.device)
        self._start_time = time.time()

    def _diagnose(self) -> None:
        """The backbone diagnostic on the validation data (else the training data), on a fresh run (rank
        0); a resumed run reads the one its folder saved."""
        output_dir = self.config._output_path
        if self.step > 0:
            self.diagnosis = saved_diagnosis(output_dir, self.log.records)
        elif self.info.is_main:
            data = self.val_data if self.val_data is not None else self.train_data
            self.diagnosis = diagnose_run(self.model, data, self.config, self.device, self.log.write)
        self.model.provenance["diagnosis"] = self.diagnosis  # saved with the model: its card shows it

    @cached_property
    def _fingerprint(self) -> dict[str, Any]:
        saved = fingerprint(
            self.config,
            world_size=self.info.world_size,
            batch_size=self.train_loader.batch_size,
            batches_per_epoch=self.batches_per_epoch,
            warmup_steps=self.warmup_steps,
            num_heads=self.model.generator.num_heads,
        )
        # the model's options, the data's identity, the planned epochs (epochs=None: set by the data)
        return {**saved, **run_identity(self.model, self.train_data), "epochs": self.epochs}

    def _resume(self) -> None:
        path = resume_path(self.config)
        if path is None:
            return
        state = load_training_state(path)
        check_resumable(path, state, self._fingerprint, self.batches_per_epoch)
        if state["backbone_sha256"] != self.backbone_sha256:
            raise ValueError(f"cannot resume from {path}: the backbone differs from the one it was trained with")
        load_trainable_state_dict(self.model, state["model"], source=str(path))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.batches_done = state["step"], state["epoch"], state["batches_done"]
        self.best_metric, self.best_step = state["best_metric"], state["best_step"]
        self.stopping.load_state_dict(state)
        self._pending_rng = state["rng"]
        logger.info(resume_message(path, self.step, self.total_steps, self.config.max_steps))

    # -- the loop ---------------------------------------------------------------------------
    def _done(self) -> bool:
        if self.config.max_steps is not None and self.step >= self.config.max_steps and not self.should_stop:
            self.stopping.reason = "max_steps"
            return True
        if self.should_stop and self.stopping.reason == "epochs":
            self.stopping.reason = "callback"
        return self.should_stop

    def _restore_pending_rng(self) -> None:
        if self._pending_rng is not None:
            restore_rng(self._pending_rng)
            self._pending_rng = None

    def _epoch_batches(self) -> Iterator[Any]:
        """This epoch's remaining batches, in the seeded order."""
        loader = self.train_loader
        sampler = loader.sampler
        if isinstance(sampler, ResumableSampler):
            sampler.set_epoch(self.epoch)
            if loader.batch_size is None:
                raise TypeError("a train loader with a ResumableSampler must have a batch_size")
            sampler.start = self.batches_done * loader.batch_size
            loader.generator.manual_seed(self.config.seed + self.epoch)
            return iter(loader)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        return islice(iter(loader), self.batches_done, None)

    def _run_epoch(self) -> None:
        self.model.train()
        # A state saved mid-epoch was captured after this epoch's iterator drew its seeds.
        if self.batches_done == 0:
            self._restore_pending_rng()
        batches = self._epoch_batches()
        self._restore_pending_rng()
        for batch in batches:
            try:
                self._micro_step(batch)
            except ValueError as err:
                if isinstance(err, NonFiniteLossError):
                    raise
                raise step_error(self, err) from err
            if self._done():
                break

    def _autocast(self) -> AbstractContextManager:
        amp = self.config.amp
        dtype = None if amp is None else AMP_DTYPES.get(amp)
        return torch.autocast(self.device.type, dtype=dtype, enabled=amp is not None)

    def _micro_step(self, batch: Any) -> None:
        accum, index = self.config.grad_accum, self.batches_done
        group_start = index - index % accum
        group_size = min(accum, self.batches_per_epoch - group_start)
        last = index + 1 == group_start + group_size
        self.model.epoch = self.epoch if self.head_phase is None else self.step // self.head_phase
        with no_sync(self.ddp_model, skip=not last):
            with self._autocast():
                out, labels = forward_batch(self.ddp_model, to_device(batch, self.device))
                distinct = {"distinct_groups": distinct_rows(out.group_masks).float().mean()}
                loss = self.steps.add(out.loss_terms(labels), group_size, distinct)
            with flush_denormal(self.device.type == "cpu"):  # subnormal gradients: sopfast.model.numerics
                self.scaler.scale(loss).backward()
        self._flag_non_finite(loss.detach())
        self.batches_done += 1
        if last:
            self._optimizer_step()

    def _optimizer_step(self) -> None:
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.trainable_parameters(), self.config.grad_clip or math.inf)
        if not self.scaler.is_enabled():  # a gradient scaler skips such steps itself
            self._flag_non_finite(norm.detach())
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        info = {"step": self.step, "epoch": round(self.step / self.steps_per_epoch, 4)}
        info["lr"] = float(self.scheduler.get_last_lr()[0])
        self.steps.end_step(info, norm, lambda sums: all_reduce_sum(sums, self.info) / self.info.world_size)
        epoch_end = self.batches_done == self.batches_per_epoch
        if epoch_end:
            self.epoch, self.batches_done = self.epoch + 1, 0
        self._after_step(epoch_end)

    def _flag_non_finite(self, value: torch.Tensor) -> None:
        """Remember the current step (1-based) if ``value`` is NaN or infinite and no step was before."""
        first = (~torch.isfinite(value)) & (self._first_bad_step < 0)
        self._first_bad_step = torch.where(first, self.step + 1, self._first_bad_step)

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteLossError` if a step's loss or gradient was NaN or infinite (one host
        read); called before every log record, evaluation and save, so no such weights are written."""
        step = int(self._first_bad_step)
        if step >= 0:
            raise NonFiniteLossError(
                f"training stopped: the loss or its gradient became NaN or infinite at step {step} (lr "
                f"{self.config.lr:g}); nothing after step {step - 1} was saved (best/ and the training state "
                "hold finite weights). Lower lr, turn on grad_clip, or check the data for NaN/inf values"
            )

    def _after_step(self, epoch_end: bool) -> None:
        cfg = self.config
        self._progress.update(1)
        if self.step % cfg.log_every == 0:
            self._log_train()
        if self.val_loader is not None and (
            (self.eval_every is not None and self.step % self.eval_every == 0)
            or (self.eval_every is None and epoch_end)
        ):
            self._evaluate_and_track()
        if (cfg.save_every is not None and self.step % cfg.save_every == 0) or epoch_end:
            self.save_state()
        if self.callbacks:
            self._emit("step", {"step": self.step, "epoch": self.epoch, "lr": self.scheduler.get_last_lr()[0]})

    @property
    def _progress(self) -> tqdm:
        """The progress bar, which :meth:`fit` makes before the first step."""
        if self.pbar is None:
            raise RuntimeError("the progress bar exists only while fit() runs")
        return self.pbar

    # -- logging, evaluation, the end ----------------------------------------------------------
    def _emit(self, event: str, record: dict[str, Any]) -> None:
        emit(self.callbacks, self, event, record)

    def _record(self, event: str, **values: Any) -> dict[str, Any]:
        record = {
            "event": event,
            "step": self.step,
            "epoch": round(self.step / self.steps_per_epoch, 4),
            **values,
            "time": round(time.time() - self._start_time, 3),
        }
        self.log.write(record)
        return record

    def _log_train(self) -> None:
        """Write the pending per-step train records (one transfer from the device for all of them)."""
        self.check_finite()
        records = self.steps.flush(round(time.time() - self._start_time, 3))
        for record in records:
            self.log.write(record)
        if records:
            self._progress.set_postfix(loss=f"{records[-1]['loss']:.4f}", **self._postfix())
            self._emit("log", records[-1])

    def _postfix(self) -> dict[str, str]:
        key = f"val_{self.metric}"
        return {key: f"{self.metrics[key]:.4f}"} if key in self.metrics else {}

    def _improves(self, value: float) -> bool:
        if self.best_metric is None:
            return True
        return value > self.best_metric if METRICS[self.metric] == "max" else value < self.best_metric

    def _evaluate_and_track(self) -> None:
        self._log_train()  # the train records of this step come first
        self.metrics = self.evaluate()
        self._eval_step = self.step
        self.model.provenance["validation"] = {"step": self.step, **self.metrics}  # saved with best/ and last/
        value = self.metrics[f"val_{self.metric}"]
        improved = self._improves(value)
        if improved:
            self.best_metric, self.best_step = value, self.step
            output_dir = self.config._output_path
            if self.info.is_main and output_dir is not None:
                check_savable(self)
                self.model.save_pretrained(output_dir / "best", backbone_sha256=self.backbone_sha256)
                self._emit("save", {"step": self.step, "what": "best", "path": str(output_dir / "best")})
        record = self._record("eval", **self.metrics, best=self.best_metric, best_step=self.best_step)
        larger_is_better = METRICS[self.metric] == "max"
        if self.stopping.evaluated(value, larger_is_better, self.step, self.step < self.total_steps):
            self.should_stop = True
        self.log.plot()
        self._progress.set_postfix(self._postfix())
        self._emit("eval", record)

    def _finish(self) -> TrainResult:
        output_dir = self.config._output_path
        self._log_train()
        if self.val_loader is not None and self._eval_step != self.step:
            self._evaluate_and_track()
        self.save_state()
        if self.info.is_main and output_dir is not None:
            self.model.save_pretrained(output_dir / "last", backbone_sha256=self.backbone_sha256)
            self._emit("save", {"step": self.step, "what": "last", "path": str(output_dir / "last")})
        record = self._record(
            "end",
            best=self.best_metric,
            best_step=self.best_step,
            stop_reason=self.stopping.reason,
            stopped=self._stopped(),
        )
        logger.info(self._stopped())
        best = self.best_metric if self.metric == "accuracy" else None
        if self.info.is_main and (verdict := below_the_bar(self.diagnosis, best, self.model.provenance)):
            logger.warning(verdict)
        collapse = collapsed_groups(self.log.records, self.model.num_groups, self.model.diversity_weight)
        if self.info.is_main and collapse:
            logger.warning(collapse)
        self.log.plot()
        self._emit("end", record)
        barrier(self.info)
        return TrainResult(
            self.step,
            self.epoch,
            self.best_metric,
            self.best_step,
            self.metrics,
            output_dir,
            stop_reason=self.stopping.reason,
            diagnosis=self.diagnosis,
        )

    def _stopped(self) -> str:
        best = (self.best_metric, self.best_step)
        return self.stopping.describe(
            self.step, self.total_steps, self.epochs, self.metric, best, self.config.max_steps
        )


def train(
    model: SOP,
    train_data: Dataset | DataLoader,
    val_data: Dataset | DataLoader | None = None,
    *,
    callbacks: Sequence[Callback] | None = None,
    run_config: Mapping[str, Any] | None = None,
    **options: Any,
) -> TrainResult:
    """Train ``model`` in place; ``options`` are :class:`TrainConfig` fields (``epochs``, ``lr``, ...).

    Batches are ``(images, labels)`` pairs or dicts with ``input_ids``, ``attention_mask``,
    optional ``token_type_ids`` (or ``pixel_values``) and ``labels``.  Under ``torchrun`` the
    same call trains with DistributedDataParallel; only rank 0 writes files.  With ``output_dir``
    the run folder holds ``best/`` and ``last/`` (loadable with ``SOP.from_pretrained(output_dir)``),
    ``training_state.pt``, ``config.yaml`` (the resolved options, plus ``run_config``'s entries),
    ``log.jsonl``, ``metrics.csv``, TensorBoard events and ``training_curves.png``.
    """
    return Trainer(model, train_data, val_data, callbacks=callbacks, run_config=run_config, **options).fit()
