"""Training-loop conventions: ``model(x, labels=y).loss``, ModelOutput-style indexing, one step of
Hugging Face ``transformers.Trainer`` and a Lightning-style loop, and the one batch parser."""

from __future__ import annotations

import pytest
import torch

import sopfast
from sopfast.data.batches import Batch, parse_batch
from sopfast.testing import make_bert, make_hf_vit, text_batch
from sopfast.training.validation import forward_batch


@pytest.fixture
def model():
    torch.manual_seed(0)
    return sopfast.SOP(make_hf_vit(), num_groups=4, tau=0.25)


def test_labels_give_the_loss_as_a_tensor_and_first_item(model):
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 2])
    torch.manual_seed(1)
    out = model(x, labels=y)
    assert isinstance(out.loss, torch.Tensor) and out.loss.dim() == 0
    torch.testing.assert_close(out.loss, out.compute_loss(y))
    assert out[0] is out.loss and out["loss"] is out.loss and out["logits"] is out.logits
    assert out.to_tuple() == (out.loss, out.logits) and out["group_masks"] is out.group_masks
    plain = model(x)
    torch.testing.assert_close(plain.loss(y), plain.compute_loss(y))
    assert plain[0] is plain.logits
    with pytest.raises(KeyError):
        plain["loss"]
    with pytest.raises(KeyError):
        out["nope"]
    with pytest.raises(ValueError):
        model(x, labels=torch.tensor([0, 1, 2]))


def test_lightning_style_training_step(model):
    """``loss = model(x, labels=y).loss`` as a LightningModule's ``training_step`` would return it."""
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.trainable_parameters()]
    backbone = [p.detach().clone() for p in model.backbone.parameters()]
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    model.train()
    loss = model(x, labels=y).loss
    loss.backward()
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.trainable_parameters()))
    assert all(torch.equal(a, p) for a, p in zip(backbone, model.backbone.parameters()))


class _ImageDicts(torch.utils.data.Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def test_transformers_trainer_trains_saves_sopfast_checkpoints_and_gets_logits(model, tmp_path):
    from transformers import Trainer, TrainingArguments

    from sopfast.training.hf_trainer import SOPCheckpointCallback

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=2,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
        dataloader_num_workers=0,
    )
    seen = []

    def compute_metrics(prediction):
        seen.append(prediction.predictions)
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_ImageDicts(8),
        eval_dataset=_ImageDicts(4),
        compute_metrics=compute_metrics,
        callbacks=[SOPCheckpointCallback()],
    )
    result = trainer.train()
    assert trainer.state.global_step == 2 and result.training_loss > 0
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(before[n], p)]
    assert changed and all(n.startswith(("projection", "generator", "selector")) for n in changed)
    assert all(torch.equal(frozen[n], p) for n, p in model.backbone.named_parameters())
    assert seen and seen[0].shape == (4, model.num_classes)  # the logits, not a tuple of explanation tensors
    loaded = sopfast.SOP.from_pretrained(tmp_path / "checkpoint-2", model.backbone).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, model.eval()(x).logits)


def test_a_trainer_checkpoint_without_the_callback_says_how_to_get_one(tmp_path):
    (tmp_path / "trainer_state.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="SOPCheckpointCallback"):
        sopfast.SOP.from_pretrained(tmp_path, sopfast.testing.make_hf_vit())


# -- one batch parser ---------------------------------------------------------------------------
X = torch.randn(2, 3, 32, 32)
Y = torch.tensor([1, 0])
GT = torch.zeros(2, 16, dtype=torch.bool)


@pytest.mark.parametrize(
    "batch",
    [
        (X, Y),
        [X, Y, GT],
        {"pixel_values": X, "labels": Y},
        {"x": X, "label": Y, "gt_mask": GT},
        {"images": X, "y": [1, 0], "evidence_mask": GT},
    ],
)
def test_every_image_form_parses_to_one_batch(batch):
    parsed = parse_batch(batch)
    assert torch.equal(parsed.x, X) and torch.equal(parsed.labels, Y) and not parsed.is_text and len(parsed) == 2
    assert parsed.ground_truth is None or torch.equal(parsed.ground_truth, GT)
    assert parsed.model_inputs() == {"x": X}


def test_bare_tensors_text_dicts_and_ground_truth_positions():
    assert parse_batch(X).labels is None and parse_batch((X,)).x is X
    ids, mask, types = text_batch()
    text = parse_batch({"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": Y[:1].repeat(3)})
    assert (
        text.is_text
        and len(text) == 3
        and set(text.model_inputs()) == {"input_ids", "attention_mask", "token_type_ids"}
    )
    moved = parse_batch((X, GT, Y), ground_truth_key=1)
    assert moved.labels is None and torch.equal(moved.ground_truth, GT)
    assert torch.equal(parse_batch({"x": X, "mask": GT}, ground_truth_key="mask").ground_truth, GT)
    assert parse_batch((X, Y)).to("cpu").x.device.type == "cpu"


@pytest.mark.parametrize(
    ("batch", "key", "match"),
    [
        ("text", None, "a batch must be"),
        ({"pixels": X}, None, r"got a dict with keys \['pixels'\]"),
        ({"x": X, "input_ids": Y}, None, "either images or token ids"),
        ((X, Y), "gt", "names a dict key but the batch is a tuple"),
        ({"x": X}, 2, "is a tuple position but the batch is a dict"),
        ((X, Y), 5, "out of range"),
        ({"x": X}, "gt", "'gt' is not in the batch"),
        ({"x": "pixels"}, None, "batch entry 'x' must be a tensor"),
        ((X, Y, GT, GT), None, "tuple of length 4"),
    ],
)
def test_bad_batches_name_what_is_allowed(batch, key, match):
    with pytest.raises((TypeError, ValueError), match=match):
        parse_batch(batch, ground_truth_key=key)


def test_forward_batch_accepts_every_form_and_needs_labels():
    torch.manual_seed(0)
    bert = sopfast.SOP(make_bert(), num_groups=3)
    ids, mask, types = text_batch()
    labels = torch.tensor([0, 1, 1])
    for batch in (
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "label": labels},
        {"input_ids": ids, "attention_mask": mask, "y": labels},
    ):
        out, got = forward_batch(bert, batch)
        assert out.logits.shape == (3, 2) and torch.equal(got, labels)
    with pytest.raises(ValueError, match="training batches need labels"):
        forward_batch(bert, {"input_ids": ids, "attention_mask": mask})
    assert isinstance(parse_batch({"input_ids": ids}), Batch)
