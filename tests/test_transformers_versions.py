"""The Hugging Face adapters on the installed transformers generation (CI runs this file, with
``test_exact_vs_reference.py``, on transformers 5.x and again in a 4.x environment: ``.ci/run``).

transformers 5.x keeps the ViT blocks in ``vit.layers``, 4.x in ``vit.encoder.layer``; BERT layers
take 5.x's ``create_bidirectional_mask`` or 4.x's additive extended mask."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import sopfast
from sopfast.adapters.hf_vit import vit_layers
from sopfast.model.reference import reference_forward
from sopfast.testing import make_bert, make_hf_vit, text_batch

MAJOR = int(transformers.__version__.split(".")[0])


def test_vit_blocks_are_found_in_the_installed_layout():
    vit = make_hf_vit().vit
    blocks = vit_layers(vit)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == 2
    assert blocks is (vit.layers if MAJOR >= 5 else vit.encoder.layer)


def test_vit_blocks_are_found_in_the_other_layout_too():
    blocks = nn.ModuleList([nn.Identity(), nn.Identity()])
    old = nn.Module()
    old.encoder = nn.Module()
    old.encoder.layer = blocks
    new = nn.Module()
    new.layers = blocks
    assert vit_layers(old) is blocks and vit_layers(new) is blocks


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_hf_vit_sop_runs_and_exact_equals_the_reference(mode):
    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), recipe="paper", num_groups=4, tau=0.25, mode=mode).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model(x)
        if mode == "exact":
            torch.testing.assert_close(out.logits, reference_forward(model, x).logits, atol=1e-5, rtol=0)
    assert out.logits.shape == (2, 3) and torch.isfinite(out.logits).all()
    loss = model(x, labels=torch.tensor([0, 1])).loss
    loss.backward()
    assert any(p.grad is not None for p in model.projection.parameters())


def test_hf_vit_drop_runs_the_backbone_on_the_kept_tokens():
    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), recipe="paper", num_groups=3, tau=0.25, mode="drop").eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = model(x)
        vit = model.backbone.vit
        for g in range(3):
            keep = out.group_indices[0, g]
            h = vit.embeddings(x)[:, torch.cat([torch.zeros(1, dtype=torch.long), keep + 1])]
            for layer in vit_layers(vit):
                h = layer(h, None)
                h = h[0] if isinstance(h, tuple) else h
            logits = model.backbone.classifier(vit.layernorm(h[:, 0]))[0]
            torch.testing.assert_close(out.group_logits[0, g], logits, atol=1e-5, rtol=0)


def test_bert_generator_embedding_is_the_second_to_last_hidden_state():
    torch.manual_seed(0)
    model = sopfast.SOP(make_bert(), recipe="paper", num_groups=3).eval()
    ids, mask, types = text_batch()
    inputs = model.prepare(ids, mask, types)
    with torch.no_grad():
        ours = model.adapter.embed(model.projection, inputs)
        hidden = model.projection(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    real = mask.bool()
    torch.testing.assert_close(ours[real], hidden.hidden_states[-2][real], atol=1e-5, rtol=0)


def test_bert_drop_equals_exact_and_the_reference():
    torch.manual_seed(0)
    model = sopfast.SOP(make_bert(), recipe="paper", num_groups=4, tau=0.3).eval()
    ids, mask, types = text_batch()
    with torch.no_grad():
        exact = model(ids, mask, types, mode="exact")
        drop = model(ids, mask, types, mode="drop")
        ref = reference_forward(model, ids, mask, types)
    torch.testing.assert_close(drop.logits, exact.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(exact.logits, ref.logits, atol=1e-5, rtol=0)


# -- Hugging Face Trainer with every logger the installed transformers offers (issue #32) ----------------
class _Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"pixel_values": torch.randn(3, 32, 32, generator=g), "labels": torch.tensor(i % 3)}


def _trainer(tmp_path, report_to):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = sopfast.SOP(make_hf_vit(), num_groups=3, tau=0.25)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=1,
        report_to=report_to,
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return Trainer(model=model, args=args, train_dataset=_Images())


def test_hf_trainer_logs_to_tensorboard_with_the_model_config(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = _trainer(tmp_path, ["tensorboard"])
    trainer.train()
    events = [p.parent for p in tmp_path.rglob("events.out.tfevents.*")]
    assert events
    accumulator = EventAccumulator(str(events[0]))
    accumulator.Reload()
    texts = accumulator.Tags()["tensors"]
    assert any("model_config" in t for t in texts), texts
    assert any("train/loss" in t for t in accumulator.Tags()["scalars"] + texts)


def test_hf_trainer_runs_with_report_to_all_and_none(tmp_path):
    for report_to in ("all", "none"):
        assert _trainer(tmp_path / report_to, report_to).train().global_step == 1


def test_the_model_config_offers_what_every_reporting_integration_reads():
    """Every ``model.config.<method>`` the installed transformers' reporting integrations call (MLflow,
    Weights & Biases, Comet, ClearML, …: most cannot run offline) exists on SOP's config and works."""
    import inspect
    import re

    from transformers.integrations import integration_utils

    called = set(re.findall(r"model\.config\.(\w+)\(", inspect.getsource(integration_utils)))
    assert {"to_dict", "to_json_string"} <= called
    config = sopfast.SOP(make_hf_vit(), num_groups=3, tau=0.25).config
    config.use_cache = False  # set by training loops; not part of the saved options
    for name in called:
        assert callable(getattr(config, name, None)), name
    assert config.to_dict()["num_groups"] == 3 and "use_cache" not in config.to_dict()
    assert '"num_groups": 3' in config.to_json_string()
    assert type(config).from_dict(config.to_dict()) == config
