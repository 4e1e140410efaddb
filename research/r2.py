import sys; sys.path.insert(0, "/work/wt-28/research")
from common28 import *
import sopfast
from sopfast.evaluation.evaluate import evaluate
n_train = int(sys.argv[1]); epochs = int(sys.argv[2]); tag = sys.argv[3]
bbname = sys.argv[4] if len(sys.argv) > 4 else None
tr, te = fmnist()
bb = plain_backbone() if bbname is None else plain_backbone(name=bbname)
torch.manual_seed(0)
model = sopfast.SOP(bb, num_groups=20, tau=0.2, mode="drop")
ds = torch.utils.data.TensorDataset(tr.x[-n_train:], tr.y[-n_train:])
val = torch.utils.data.TensorDataset(te.x[:500], te.y[:500])
t = time.time()
res = sopfast.train(model, ds, val, epochs=epochs, batch_size=32, output_dir=f"/work/cache28/run-{tag}", resume=False,
                    eval_every=max(1, (epochs * n_train // 32) // 10), progress=False)
print("train s", time.time() - t, res, flush=True)
for line in open(f"/work/cache28/run-{tag}/log.jsonl"):
    if '"eval"' in line: print(line.strip()[:200])
loader = torch.utils.data.DataLoader(val, batch_size=100)
r = evaluate(model, loader, metrics=["accuracy", "diversity", "curves"], baselines=["random", "ig-f", "occlusion-f"], progress=False,
             curve_taus=(0.1, 0.2, 0.4), curve_counts=(1, 20))
for k, v in r.items():
    print(k, {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in v.items() if kk in ("accuracy", "distinct_groups", "curves")})
