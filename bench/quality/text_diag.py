"""Why text groups collapse: how often each group holds [CLS] / [SEP], attention mass on them, and the
distinct groups once [CLS]/[SEP] are ignored — on a saved text sweep model (.cache/sweep/<row>-s0)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CACHE, text_backbone, text_data

from sopfast.evaluation import metrics as M
from sopfast.model.sop import SOP

torch.set_num_threads(1)
name = sys.argv[1]
bb, te = text_backbone(), text_data()[1]
model = SOP.from_pretrained(os.path.join(CACHE, "sweep", name), bb).eval()
enc = te.encoded
inputs = model.prepare(enc["input_ids"][:300], enc["attention_mask"][:300], enc["token_type_ids"][:300])
with torch.no_grad():
    g = model.make_groups(inputs)
special = model.adapter.special_tokens(inputs)  # position 0 and the last token of segment 0
cls = special.clone()
cls[:, 1:] = False
sep = special & ~cls
mask = g.mask
print(name)
print("groups holding [CLS]:", float((mask & cls[:, None]).any(-1).float().mean()))
print("groups holding [SEP]:", float((mask & sep[:, None]).any(-1).float().mean()))
print("attention mass on [CLS]+[SEP]:", float((g.attention * special[:, None]).sum(-1).mean()))
k = mask.sum(-1).float().mean()
print("mean group size k:", float(k))
valid = model.adapter.candidate_mask(inputs)
print("distinct groups:", float(M.group_diversity(mask, valid)["distinct_groups"].mean()))
words = mask & ~special[:, None]
print("distinct groups on words only:", float(M.group_diversity(words, valid & ~special)["distinct_groups"].mean()))
