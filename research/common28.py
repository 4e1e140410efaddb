"""Research helpers for issue #28 (not committed as is)."""
import os, sys, time, json
import torch
import torch.nn.functional as F
from sopfast.data import builtin as data
from sopfast.demo.backbones import small_vit, accuracy
from sopfast.masking import masked_forward
from sopfast.ops import num_kept

CACHE = "/work/cache28"
os.makedirs(CACHE, exist_ok=True)


def fmnist():
    return data.load_fashion_mnist("train", 60000), data.load_fashion_mnist("test", 1000)


def train_plain(model, x, y, epochs=4, batch_size=128, lr=2e-3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for s in range(0, len(x), batch_size):
            idx = order[s:s + batch_size]
            loss = F.cross_entropy(model(pixel_values=x[idx]).logits, y[idx])
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
    return model.eval()


def plain_backbone(n=48000, epochs=4, seed=0, name=None):
    from transformers import ViTForImageClassification
    name = name or f"vit-plain-{n}-{epochs}-{seed}"
    path = os.path.join(CACHE, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        tr, te = fmnist()
        torch.manual_seed(seed)
        m = small_vit(28, 4, 1, 10)
        t = time.time()
        train_plain(m, tr.x[:n], tr.y[:n], epochs=epochs, seed=seed)
        print(f"trained {name} in {time.time()-t:.0f}s; acc {accuracy(m, te.x, te.y):.3f}", flush=True)
        m.config.id2label = {i: c for i, c in enumerate(data.FASHION_MNIST_CLASSES)}
        m.config.label2id = {c: i for i, c in enumerate(data.FASHION_MNIST_CLASSES)}
        m.save_pretrained(path)
    return ViTForImageClassification.from_pretrained(path).eval()


@torch.no_grad()
def random_group_stats(backbone, x, y, tau, m=20, mode="exact", seed=0, batch=100):
    d = 49
    k = num_kept(tau, d)
    g = torch.Generator().manual_seed(seed)
    one = mean = best = 0
    for s in range(0, len(x), batch):
        xb, yb = x[s:s+batch], y[s:s+batch]
        b = len(xb)
        order = torch.rand(b, m, d, generator=g).argsort(-1)[..., :k]
        masks = torch.zeros(b, m, d, dtype=torch.bool).scatter(-1, order, True)
        logits = masked_forward(backbone, xb, masks, mode=mode)  # [b, m, C]
        pred = logits.argmax(-1)
        corr = pred == yb[:, None]
        one += corr.float().mean(1).sum().item()
        mean += (logits.softmax(-1).mean(1).argmax(-1) == yb).sum().item()
        best += corr.any(1).sum().item()
    n = len(x)
    return dict(one=one/n, mean_of_m=mean/n, best_of_m=best/n)
