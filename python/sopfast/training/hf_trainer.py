"""Training an SOP model with Hugging Face ``transformers.Trainer``: the model works unchanged (its
forward takes ``labels=`` and returns the loss first; ``compute_metrics`` gets the logits), and
:class:`SOPCheckpointCallback` makes every checkpoint the Trainer writes a sopfast checkpoint too,
so ``SOP.from_pretrained("out/checkpoint-500")`` loads it.

    trainer = Trainer(model=sop, args=args, train_dataset=data, callbacks=[SOPCheckpointCallback()])
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback


class SOPCheckpointCallback(TrainerCallback):
    """Writes ``sop_config.json`` and ``sop_model.safetensors`` (:meth:`sopfast.SOP.save_pretrained`,
    the trainable parts only) into each ``checkpoint-N`` folder the Trainer saves, and into
    ``output_dir`` when training ends."""

    def on_save(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and model is not None:
            model.save_pretrained(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.is_world_process_zero and model is not None:
            model.save_pretrained(args.output_dir)
