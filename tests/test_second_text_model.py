"""bench/quality/second_text_model.py's backbone (issue #34): a RoBERTa classifier trained from scratch,
frozen, that SOP runs on — checked on a tiny config and a separable toy text set."""

import os
import sys

import torch

import sopfast
from sopfast.data.datasets import TextDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "quality"))
from second_text_model import RobertaSize, roberta_classifier, train_text_classifier

PAD, CLS, SEP, GOOD, BAD, VOCAB, LENGTH = 3, 1, 2, 10, 11, 40, 12


def toy_texts(n: int, seed: int) -> TextDataset:
    """``n`` texts of 6–10 random words padded to LENGTH with a non-zero [PAD]; class 1 holds GOOD, 0 BAD."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=gen)
    ids = torch.full((n, LENGTH), PAD)
    mask = torch.zeros(n, LENGTH, dtype=torch.long)
    for i in range(n):
        words = int(torch.randint(6, 11, (1,), generator=gen))
        body = torch.randint(12, VOCAB, (words,), generator=gen)
        body[int(torch.randint(0, words, (1,), generator=gen))] = GOOD if labels[i] else BAD
        ids[i, : words + 2] = torch.cat([torch.tensor([CLS]), body, torch.tensor([SEP])])
        mask[i, : words + 2] = 1
    return TextDataset({"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}, labels)


def test_roberta_trained_from_scratch_learns_a_separable_set_is_frozen_and_sop_runs_on_it():
    from transformers import RobertaForSequenceClassification

    size = RobertaSize(layers=1, hidden=32, heads=2, mlp=64, epochs=6, lr=3e-3, batch_size=16)
    model = roberta_classifier(VOCAB, PAD, CLS, SEP, LENGTH, size, seed=0)
    assert isinstance(model, RobertaForSequenceClassification)
    assert model.config.max_position_embeddings == LENGTH + PAD + 2  # positions run up to PAD + LENGTH
    train, test = toy_texts(192, seed=0), toy_texts(64, seed=1)
    with torch.no_grad():
        before = (model.eval()(**test.encoded).logits.argmax(-1) == test.labels).float().mean()
    trained = train_text_classifier(model, train, size, seed=0)
    assert not trained.training and not any(p.requires_grad for p in trained.parameters())
    with torch.no_grad():
        after = (trained(**test.encoded).logits.argmax(-1) == test.labels).float().mean()
    assert after >= 0.9 > before, f"the trained model should separate GOOD from BAD: {before:.2f} -> {after:.2f}"

    sop = sopfast.SOP(trained, num_groups=3, tau=0.3, mode="drop").eval()
    assert sop.adapter.family == "Hugging Face RobertaForSequenceClassification"
    with torch.no_grad():
        out = sop(**test.subset(torch.arange(8)).encoded)
    assert out.logits.shape == (8, 2) and torch.isfinite(out.logits).all()
