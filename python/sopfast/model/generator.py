"""The group generator (docs/method.md, steps 1–7): attention over features, binarised to top-τ groups."""

from __future__ import annotations

import torch
from torch import nn

from ..checks import NonFiniteError, check_values
from ..ops import top_tau
from ..ops.top_tau import TIES
from ..types import Groups


def candidate_positions(valid: torch.Tensor) -> torch.Tensor:
    """``[B, d]``: the positions of each row's valid features first, in order."""
    d = valid.shape[1]
    pos = torch.arange(d, device=valid.device).expand_as(valid)
    return torch.sort(torch.where(valid, pos, pos + d), dim=1).values.remainder(d)


def query_rows(
    counts: torch.Tensor, num_groups: int, num_heads: int, head: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which attention rows become groups (docs/method.md, step 5).

    ``counts [B]`` candidate features per example.  Training (``head`` given): rows
    ``floor(j·d/m)`` of that head.  Evaluation (``head=None``): the heads' rows stacked,
    ``H·d`` candidates, rows ``floor(j·H·d/m)``.  With more groups than candidates the rows
    repeat, as in the authors' code.  Returns ``(head [B, m], candidate [B, m])``.
    """
    j = torch.arange(num_groups, device=counts.device).view(1, -1)
    d = counts.view(-1, 1).long()
    if head is not None:
        return torch.full_like(j * d, head), (j * d) // num_groups
    rows = (j * num_heads * d) // num_groups
    return rows // d, rows % d


QUERIES = ("fixed", "diverse")


def masked_mean(emb: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B, 1, E]``: the mean of ``emb [B, d, E]`` over each row's ``valid [B, d]`` features."""
    w = valid.unsqueeze(-1).to(emb.dtype)
    return (emb * w).sum(dim=1, keepdim=True) / w.sum(dim=1, keepdim=True).clamp_min(1)


def diverse_positions(emb: torch.Tensor, valid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[B, m]`` query positions by farthest-point sampling over ``emb [B, d, E]``.

    The first is the valid feature farthest from the mean embedding; each next one the valid
    feature farthest (L2) from all taken so far (ties to the lower index).  Once every valid
    feature is taken, taken ones repeat (distance 0).
    """
    with torch.no_grad():
        x = emb.detach().float()
        outside = torch.full_like(x[..., 0], -1.0)
        far = torch.where(valid, (x - masked_mean(x, valid)).norm(dim=-1), outside)
        rows = torch.arange(x.shape[0], device=x.device)
        taken = []
        for i in range(num_groups):
            pos = far.argmax(dim=1)
            taken.append(pos)
            dist = (x - x[rows, pos].unsqueeze(1)).norm(dim=-1)
            far = torch.where(valid, dist if i == 0 else torch.minimum(far, dist), outside)
        return torch.stack(taken, dim=1)


def standardize_rows(s: torch.Tensor, valid: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``s [B, m, d]`` with each row shifted and scaled to mean 0, variance 1 over ``valid [B, d]``."""
    w = valid.unsqueeze(1).to(s.dtype)
    count = w.sum(dim=-1, keepdim=True).clamp_min(1)
    mean = (s * w).sum(dim=-1, keepdim=True) / count
    var = ((s - mean).pow(2) * w).sum(dim=-1, keepdim=True) / count
    return (s - mean) / (var + eps).sqrt()


def demote_features(s: torch.Tensor, valid: torch.Tensor, demote: torch.Tensor) -> torch.Tensor:
    """``s [B, m, d]`` with the ``demote [B, d]`` features of each row set to 2 below the row's lowest
    other ``valid [B, d]`` logit (a constant: no gradient reaches them); every row needs one such."""
    rows = demote.unsqueeze(1).expand_as(s)
    others = (valid & ~demote).unsqueeze(1).expand_as(s)
    low = torch.where(others, s, torch.full_like(s, float("inf"))).amin(dim=-1, keepdim=True)
    return torch.where(rows, low.detach() - 2.0, s)


class GroupGenerator(nn.Module):
    """Attention logits for the ``m`` kept query rows, then :func:`sopfast.ops.top_tau`.

    ``heads``: ``H`` full-width weights ``[3E, E]`` (the authors'
    ``multihead_attns[h].input_weights``), separate parameters so that a head that does not
    train gets no gradient, each without bias and Xavier-uniform over its whole matrix; keys
    use rows ``E:2E``, queries rows ``2E:3E``; logits ``s = scale · Q_h K_hᵀ`` (no 1/√E).
    ``ties`` is the top-τ tie rule (:func:`sopfast.ops.top_tau`).

    Opt-in changes beyond the authors' algorithm (all off by default; ``docs/quality.md``):

    * ``center=True`` subtracts each example's mean candidate embedding before the projections,
      so a direction shared by every feature (``μ``) cannot rank the keys alike for every query
      (the term ``μ W_Qᵀ W_K e_j`` is the same in each row);
    * ``queries="diverse"`` takes the query rows by farthest-point sampling over the (centred)
      embeddings — the feature farthest from the mean first, then each time the one farthest
      from those already taken — instead of the fixed rows ``floor(j·d/m)``, which on images
      with plain background often land on near-identical patches;
    * ``normalize_logits=True`` standardises each logit row over its candidate features (zero
      mean, unit variance) before the scale ``γ``, so ``γ`` alone sets how sharp the attention
      is: training cannot raise λ by inflating the logits (which saturates the softmax and stops
      the generator learning), only by choosing which features a group keeps;
    * ``key_score=True`` adds a query-independent score ``v·e_j`` (``v`` :attr:`key_score` ``[E]``,
      zero at init, so an untrained generator is unchanged) to every row before any
      standardisation: with centred embeddings and queries pointing every way the bilinear term
      alone cannot rank one feature high in every row, so nothing could teach it usefulness;
    * ``demote [B, d]`` (:meth:`logits`) ranks the given features last in every row and leaves them
      out of the query rows (``SOP(demote_blank=True)``).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int = 1,
        scale: float = 1.0,
        blur_kernel_size: int = 0,
        blur_sigma: float = 1.0,
        ties: str = "authors",
        center: bool = False,
        queries: str = "fixed",
        normalize_logits: bool = False,
        key_score: bool = False,
    ):
        super().__init__()
        if ties not in TIES:
            raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
        if queries not in QUERIES:
            raise ValueError(f"queries must be one of {QUERIES}, got {queries!r}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.scale = scale
        self.blur_kernel_size = blur_kernel_size
        self.blur_sigma = blur_sigma
        self.ties = ties
        self.center = bool(center)
        self.queries = queries
        self.normalize_logits = bool(normalize_logits)
        self.heads = nn.ParameterList(
            nn.Parameter(nn.init.xavier_uniform_(torch.empty(3 * embed_dim, embed_dim))) for _ in range(num_heads)
        )
        self.key_score = nn.Parameter(torch.zeros(embed_dim)) if key_score else None

    def logits(
        self,
        emb: torch.Tensor,
        valid: torch.Tensor,
        num_groups: int,
        head: int | None,
        demote: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention logits ``[B, m, d]`` of the kept query rows (fp32) from ``emb [B, d, E]``.

        ``head`` picks one head for every row (training); ``None`` stacks the heads (evaluation).
        ``demote [B, d]`` bool: valid features whose logit is set 2 below the lowest other valid logit
        of the row (after any standardisation, before ``γ``) and that no query row is taken from; an
        example whose valid features are all demoted is left as it is.
        """
        b, _, e = emb.shape
        emb = emb.float()
        if self.center:
            emb = emb - masked_mean(emb, valid)
        if demote is not None:
            demote = demote & valid
            demote = demote & (valid & ~demote).any(dim=1, keepdim=True)
        qvalid = valid if demote is None else valid & ~demote
        head_idx, cand = query_rows(qvalid.sum(dim=1), num_groups, self.num_heads, head)
        if self.queries == "diverse":
            qpos = diverse_positions(emb, qvalid, num_groups)
            if head is None:
                head_idx = (torch.arange(num_groups, device=emb.device) * self.num_heads // num_groups).expand_as(qpos)
        else:
            qpos = candidate_positions(qvalid).gather(1, cand)
        q_emb = emb.gather(1, qpos.unsqueeze(-1).expand(b, num_groups, e))

        def head_logits(h: int) -> torch.Tensor:
            w = self.heads[h].float()
            return (q_emb @ w[2 * e :].t()) @ (emb @ w[e : 2 * e].t()).transpose(1, 2)

        heads = list(range(self.num_heads)) if head is None else [head]
        out = head_logits(heads[0])
        for h in heads[1:]:
            out = torch.where((head_idx == h).unsqueeze(-1), head_logits(h), out)
        if self.key_score is not None:
            out = out + (emb @ self.key_score.float()).unsqueeze(1)
        if self.normalize_logits:
            out = standardize_rows(out, valid)
        if demote is not None:
            out = demote_features(out, valid, demote)
        return self.scale * out

    def binarise(
        self,
        logits: torch.Tensor,
        valid: torch.Tensor | None,
        tau: float,
        deletion: bool = False,
        grid: tuple[int, int] | None = None,
    ) -> Groups:
        """Top-τ groups (with λ and attention) from attention ``logits [B, m, d]`` over the ``valid [B, d]``
        features (``None``: all)."""
        b, m, d = logits.shape
        result = top_tau(
            logits.reshape(b * m, d),
            tau,
            valid=None if valid is None else valid.unsqueeze(1).expand(b, m, d).reshape(b * m, d),
            largest=not deletion,
            ties=self.ties,
            blur_kernel_size=self.blur_kernel_size,
            blur_sigma=self.blur_sigma,
            grid=grid,
        )
        attention = result.attention
        assert attention is not None  # top_tau returns it by default (attention=True)
        return Groups(
            mask=result.mask.view(b, m, d),
            indices=result.indices.view(b, m, -1),
            lam=result.lam.view(b, m),
            attention=attention.view(b, m, d),
        )

    def forward(
        self,
        emb: torch.Tensor,
        valid: torch.Tensor | None,
        num_groups: int,
        tau: float,
        head: int | None = None,
        deletion: bool = False,
        grid: tuple[int, int] | None = None,
        demote: torch.Tensor | None = None,
        explore: float = 0.0,
    ) -> Groups:
        """Groups from feature embeddings ``emb [B, d, E]`` (``valid [B, d]`` bool or ``None``; ``demote``
        see :meth:`logits`).  ``explore > 0`` adds ``explore ·`` standard Gumbel noise to the logits before
        the top τ (and λ, the attention) are taken: each group is then a draw near the generator's choice
        (at 1, a Plackett–Luce draw from its attention), so that a reward on λ can find better groups
        (``SOP(explore=...)``, in training only)."""
        b, d, _ = emb.shape
        every = torch.ones(b, d, dtype=torch.bool, device=emb.device) if valid is None else valid
        with torch.autocast(device_type=emb.device.type, enabled=False):
            s = self.logits(emb, every, num_groups, head, demote)
        if explore > 0:
            s = s + explore * gumbel_noise(s)
        return self.binarise(s, valid, tau, deletion, grid)


def gumbel_noise(like: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel samples ``−log(−log U)`` (``U`` uniform in (0, 1), from torch's global generator) shaped
    and typed like ``like``."""
    u = torch.rand_like(like).clamp(1e-10, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def check_finite_lam(lam: torch.Tensor) -> None:
    """Raise ValueError when the generator's λ is not finite (its attention logits overflow or hold NaN; on a
    GPU a device-side assertion)."""
    check_values(
        torch.isfinite(lam).all(),
        "the generator's attention is not finite (NaN or infinite λ: its logits overflow or hold NaN): the "
        "inputs lie outside what the model can represent (check their scale and normalisation), or its "
        "weights are not finite",
        error=NonFiniteError,
    )


def check_candidates(valid: torch.Tensor) -> None:
    """Every example of ``valid [B, d]`` (the candidate features) has one (ValueError naming the others;
    on a GPU a device-side assertion)."""
    found = valid.any(dim=1)
    check_values(
        found.all(),
        "examples of the batch have no candidate features (every token is padding or in the always-kept "
        "second segment); SOP needs at least one",
        lambda: f": examples {(~found).nonzero().flatten().tolist()[:5]}",
    )


def no_groups(m: int, d: int, k: int, device: torch.device) -> Groups:
    """The groups of an empty batch (``m`` groups of ``k`` of ``d`` features): every tensor with a batch
    dimension of 0."""
    return Groups(
        mask=torch.zeros(0, m, d, dtype=torch.bool, device=device),
        indices=torch.zeros(0, m, k, dtype=torch.long, device=device),
        lam=torch.zeros(0, m, device=device),
        attention=torch.zeros(0, m, d, device=device),
    )
