"""first-user with adaptation on the same 600 images."""
import sys; sys.path.insert(0, "/work/wt-28/research")
from common28 import *
import sopfast
from sopfast.evaluation.evaluate import evaluate
tag = sys.argv[1]
tr, te = fmnist()
bb = plain_backbone(12000, 4)
g = torch.Generator().manual_seed(1)
idx = torch.randperm(60000, generator=g)[:600]
x, y = tr.x[idx], tr.y[idx]
train = torch.utils.data.TensorDataset(x[60:], y[60:])
val = torch.utils.data.TensorDataset(x[:60], y[:60])
test = torch.utils.data.TensorDataset(te.x, te.y)
t = time.time()
ad = sopfast.adapt_backbone(bb, train, val, progress=False)
print("adapt s", time.time() - t, flush=True)
print(ad, flush=True)
print("adapted test acc", accuracy(ad.backbone, te.x, te.y), "original", accuracy(bb, te.x, te.y), flush=True)
torch.manual_seed(0)
model = sopfast.SOP(ad.backbone, num_groups=20, tau=0.2, mode="drop")
t = time.time()
res = sopfast.train(model, train, val, batch_size=32, output_dir=f"/work/cache28/run-{tag}", resume=False, progress=False)
print("train s", time.time() - t, res.step, res.stop_reason, res.best_metric, flush=True)
r = evaluate(model, torch.utils.data.DataLoader(test, batch_size=100), metrics=["accuracy", "diversity"], baselines=["random"], progress=False, backbone_row=False)
print("last", {k: {kk: round(vv, 3) for kk, vv in v.items() if kk in ("accuracy", "distinct_groups")} for k, v in r.items()}, flush=True)
