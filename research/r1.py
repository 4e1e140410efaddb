import sys; sys.path.insert(0, "/work/wt-28/research")
from common28 import *
tr, te = fmnist()
for n, ep in [(48000, 4), (12000, 4)]:
    bb = plain_backbone(n, ep)
    print(n, ep, "full acc", accuracy(bb, te.x, te.y), flush=True)
    for mode in ("exact", "drop"):
        for tau in (0.1, 0.2, 0.4):
            print(mode, tau, random_group_stats(bb, te.x[:500], te.y[:500], tau, mode=mode), flush=True)
