"""first-user: ordinary ViT trained on N images; SOP default recipe on a 600-image set, long run, curve."""
import sys; sys.path.insert(0, "/work/wt-28/research")
from common28 import *
import sopfast
from sopfast.evaluation.evaluate import evaluate
bb_n = int(sys.argv[1]); n_sop = int(sys.argv[2]); steps = int(sys.argv[3]); tag = sys.argv[4]
lr = float(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] != "-" else None
import json as _j
sop_kw = _j.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
tr, te = fmnist()
bb = plain_backbone(bb_n, 4 if bb_n >= 12000 else 20)
print("backbone acc", accuracy(bb, te.x, te.y), flush=True)
g = torch.Generator().manual_seed(1)
idx = torch.randperm(60000, generator=g)[:n_sop]
x, y = tr.x[idx], tr.y[idx]
nval = max(1, n_sop // 10)
train = torch.utils.data.TensorDataset(x[nval:], y[nval:])
val = torch.utils.data.TensorDataset(x[:nval], y[:nval])
test = torch.utils.data.TensorDataset(te.x, te.y)
torch.manual_seed(0)
model = sopfast.SOP(bb, num_groups=20, tau=0.2, mode="drop", **sop_kw)
spe = -(-len(train) // 32)
epochs = -(-steps // spe)
t = time.time()
kw = {} if lr is None else {"lr": lr}
res = sopfast.train(model, train, val, epochs=epochs, batch_size=32, output_dir=f"/work/cache28/run-{tag}", resume=False,
                    eval_every=max(1, steps // 30), progress=False, diagnose=False, **kw)
print("train s", time.time() - t, res.best_metric, res.best_step, flush=True)
import json
evals = [json.loads(l) for l in open(f"/work/cache28/run-{tag}/log.jsonl") if '"eval"' in l]
print("curve", [(e["step"], round(e["val_accuracy"], 3)) for e in evals], flush=True)
for which in ("last", "best"):
    m = sopfast.SOP.from_pretrained(f"/work/cache28/run-{tag}/{which}", backbone=bb) if which == "best" else model
    r = evaluate(m, torch.utils.data.DataLoader(test, batch_size=100), metrics=["accuracy", "diversity"], baselines=["random"], progress=False, backbone_row=False)
    print(which, {k: {kk: round(vv, 3) for kk, vv in v.items() if kk in ("accuracy", "distinct_groups")} for k, v in r.items()}, flush=True)
