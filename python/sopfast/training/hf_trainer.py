"""Training an SOP model with Hugging Face ``transformers.Trainer``: the model works unchanged (its
forward takes ``labels=`` and returns the loss first; ``compute_metrics`` gets the logits), and
:class:`SOPCheckpointCallback` makes every checkpoint the Trainer writes a sopfast checkpoint too,
so ``SOP.from_pretrained("out/checkpoint-500")`` loads it.

    trainer = Trainer(model=sop, args=args, train_dataset=data, callbacks=[SOPCheckpointCallback()])
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..adapters.sources import source_folders
from ..checks import check_path
from ..integrity import atomic_write_bytes
from ..model.checkpoint import sop_files
from ..model.state_files import same_folder


def save_beside(model: Any, directory: str | os.PathLike) -> Path:
    """Write the weights file, then the config of ``model`` (each atomically) into ``directory`` beside what
    it holds — a ``transformers.Trainer`` checkpoint's own files, which stay; never into the backbone's own
    folder."""
    directory = Path(check_path("directory", directory, directory=True))
    sources = source_folders(model.provenance.get("backbone"), model.backbone)
    if any(same_folder(directory, source) for source in sources):
        raise ValueError(f"directory {directory} is the backbone's own folder: sopfast never writes there")
    for name, data in sop_files(model).items():
        atomic_write_bytes(directory / name, data)
    return directory


class SOPCheckpointCallback(TrainerCallback):
    """Writes ``sop_model.safetensors`` and ``sop_config.json`` (the trainable parts only, :func:`save_beside`)
    into each ``checkpoint-N`` folder the Trainer saves, beside the Trainer's own files, and into
    ``output_dir`` when training ends."""

    def on_save(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and model is not None:
            save_beside(model, os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and model is not None:
            save_beside(model, args.output_dir)
