import sys; sys.path.insert(0, "/work/wt-28/research")
from common28 import *
from sopfast.training.adapt import adapt_backbone
lr = float(sys.argv[1]); steps = int(sys.argv[2]); tw = float(sys.argv[3]); tag = sys.argv[4]; lw = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
tr, te = fmnist()
bb = plain_backbone()
ds = torch.utils.data.TensorDataset(tr.x[:12000], tr.y[:12000])
val = torch.utils.data.TensorDataset(te.x[:500], te.y[:500])
t = time.time()
r = adapt_backbone(bb, ds, val, steps=steps, lr=lr, teacher_weight=tw, label_weight=lw, progress=False, output_dir=f"/work/cache28/adapt-{tag}")
print(tag, "seconds", time.time() - t)
print(r.before); print(r.after)
print("full acc 1000:", accuracy(r.backbone, te.x, te.y))
