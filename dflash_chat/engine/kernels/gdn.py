"""Gated DeltaNet's recurrence, from the conv output and the raw gate projections, the state updated in
place (or left alone).

Per token t and value head h, with state S [k_dim, v_dim]:
    S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
q and k are the conv output's L2-normalised key-head slices (q scaled by k_dim^-1/2), shared by
value_heads / key_heads value heads; g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b).

Decode runs it for one token and writes the state; a speculative verify runs it for the block and
keeps the state as it was (its outputs only); the commit runs it again over the block's stored
inputs for the first `keep` tokens (a device tensor), writing the state: tokens past `keep` are
masked to a no-op (decay 1, beta 0), so the shapes never depend on how many were accepted (on the CPU,
the torch path instead finishes the verify's one-chunk solve, kept for it: `Chunks.commit`). Each pass
reads the state once (and writes it once when it updates it). On CUDA one Triton program owns one
value head and a slice of the value dimension: it normalises its q and k, computes its gates and keeps
the state tile in registers for all the tokens, so a layer's recurrence is one launch. Elsewhere the
same arithmetic runs as torch ops: token by token for a few tokens, a chunk at a time (a triangular
solve per chunk, the chunk no longer than the tokens need) for a verify, its commit and prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash_chat.engine.kernels import lazy
from dflash_chat.engine.kernels.switches import kernel_wanted

V_BLOCK = 32  # value columns per program


def available(state: torch.Tensor) -> bool:
    return kernel_wanted(state, "GDN")


CHUNK = 64  # tokens per triangular solve
# below this many tokens, the token-by-token recurrence beats a solve; not in a speculative block whose solve is
# kept (`solved`): its commit then takes the state from the solve instead of running the recurrence again, which
# costs more than the solve saves (a 2-token verify and its commit on the demo at 1 thread 9.6 -> 9.1 ms, 3 tokens
# 10.8 -> 9.9 ms)
STEPWISE = 4
PREFILL_TOKENS = 128  # from this many tokens on, CUDA too runs the chunked form (its scan a Triton kernel)


@dataclass(frozen=True)
class Heads:
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    @property
    def key_total(self) -> int:
        return self.key_heads * self.key_dim


def mix(
    qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    heads: Heads,
    *,
    update: bool,
    outputs: bool = True,
    keep: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    solved: list[Chunks] | None = None,
) -> torch.Tensor | None:
    """The recurrence over T tokens from the conv output qkv [T, 2*key_total + value_heads*value_dim] and
    the raw b, a projections [T, value_heads]; state [H, K, V] float32. `update`: write the state after the
    tokens (after the first `keep`, a 0-d device tensor >= 1, when given). Returns the outputs [T, H, V]
    when `outputs`: float32, or rounded to `out_dtype` by the kernel when it runs (the caller casts otherwise).
    `solved`: a speculative block (no `update`) whose torch path solved one chunk on the CPU appends its
    `Chunks` there, for a commit without a second solve (`Chunks.commit`)."""
    T = qkv.shape[0]
    if available(state) and (T < PREFILL_TOKENS or keep is not None):
        return _triton(qkv, b, a, A_log, dt_bias, state, heads, update, outputs, keep, out_dtype)
    q, k, v, g, beta = prepare(qkv, b, a, A_log, dt_bias, heads)
    H = g.shape[1]
    if T < STEPWISE and (solved is None or T == 1 or state.device.type != "cpu"):
        return reference(q, k, v, g, beta, state, update=update, outputs=outputs, keep=keep)
    if keep is not None:  # tokens past `keep` change nothing: decay 1, no write
        g, beta = masked_gates(g, beta, keep)
    q, k = per_value_head(q, H), per_value_head(k, H)
    chunks = Chunks.of(q, k, v, g, beta, chunk=min(CHUNK, 1 << (T - 1).bit_length()))
    if solved is not None and not update and chunks.u.shape[1] == 1 and state.device.type == "cpu":
        solved.append(chunks)
    if not update and chunks.u.shape[1] == 1 and not available(state):
        out = chunks.first(state)  # a verify's block: its outputs, and no state after it to compute
    else:
        out = chunks.scan(state if update else state.clone())
    return out if outputs else None


def masked_gates(g: torch.Tensor, beta: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g and beta [T, H] with the tokens from `keep` on made no-ops (decay 1, beta 0)."""
    live = _rows(g.shape[0], g.device)[:, None] < keep
    return torch.where(live, g.float(), 0.0), torch.where(live, beta.float(), 0.0)


def prepare(
    qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, heads: Heads
):
    """(q, k [T, key_heads, K] float32, normalised; v [T, value_heads, V]; g, beta [T, value_heads] float32)."""
    T = qkv.shape[0]
    q, k, v = torch.split(qkv, [heads.key_total, heads.key_total, heads.value_heads * heads.value_dim], dim=-1)
    q = _float(q.reshape(T, heads.key_heads, heads.key_dim))
    k = _float(k.reshape(T, heads.key_heads, heads.key_dim))
    v = v.reshape(T, heads.value_heads, heads.value_dim)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * heads.key_dim**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    beta = torch.sigmoid(_float(b))
    g = -_float(A_log).exp() * F.softplus(_float(a) + _float(dt_bias))
    return q, k, v, g, beta


def per_value_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k [T, key_heads, K] -> [T, heads, K]: value head h reads key head h // (heads / key_heads)."""
    rep = heads // x.shape[1]
    return x.repeat_interleave(rep, dim=1) if rep > 1 else x


@dataclass
class Chunks:
    """A sequence split into chunks of C tokens, with everything that does not depend on the state before
    each chunk computed for all chunks at once ([H, N chunks, C, *], float32; the last chunk padded with
    tokens that change nothing: decay 1, beta 0).

    Derivation (the UT transform): inside a chunk, with G_i the cumulative log decay up to token i and
    A = tril(beta_i k_i . k_j exp(G_i - G_j), -1), the corrected values for a chunk starting from state S are
    v' = u - w S with u = (I + A)^-1 beta v and w = (I + A)^-1 beta exp(G) k; the outputs are
    o = exp(G) q S + tril(q k^T exp(G_i - G_j)) v', and the state after the chunk is
    exp(G_last) S + (k exp(G_last - G))^T v'. Only the last two depend on S: `scan` runs them chunk by chunk.
    """

    q: torch.Tensor  # q * exp(G)
    k: torch.Tensor  # k * exp(G_last - G)
    w: torch.Tensor
    u: torch.Tensor
    attn: torch.Tensor  # [H, N, C, C]: tril(q k^T exp(G_i - G_j))
    decay: torch.Tensor  # [H, N]: exp(G_last)
    tokens: int
    G: torch.Tensor | None = None  # [H, N, C]: the cumulative log decay (what `commit` reads)
    keys: torch.Tensor | None = None  # [H, N, C, K]: k itself

    @classmethod
    def of(cls, q, k, v, g, beta, chunk: int = CHUNK) -> Chunks:
        """q, k [T, H, K] (per value head); v [T, H, V]; g, beta [T, H]."""
        T, H = g.shape
        pad = -T % chunk
        # a verify's block is one whole chunk: nothing to pad
        q, k, v, g, beta = (_float(x) if not pad else _padded(x.float(), pad) for x in (q, k, v, g, beta))
        n = (T + pad) // chunk

        def split(x):  # [T', H, *] -> [H, N, C, *]
            return x.reshape(n, chunk, H, *x.shape[2:]).movedim(2, 0)

        q, k, v, g, beta = (split(x) for x in (q, k, v, g, beta))
        G = g.cumsum(-1)  # [H, N, C]
        decay_ij = (G[..., :, None] - G[..., None, :]).masked_fill_(_above(chunk, q.device), float("-inf")).exp()
        # the strictly lower triangle of I + A: the solve is unitriangular, it reads no other entry
        a = ((beta[..., None] * k) @ k.transpose(-1, -2) * decay_ij).tril_(-1)
        exp_G = G.exp()
        solve = torch.linalg.solve_triangular(
            a,
            torch.cat((beta[..., None] * v, (beta * exp_G)[..., None] * k), dim=-1),
            upper=False,
            unitriangular=True,
        )
        u, w = solve.split([v.shape[-1], k.shape[-1]], dim=-1)
        last = G[..., -1:]
        return cls(
            q * exp_G[..., None],
            k * (last - G).exp()[..., None],
            w.contiguous(),
            u.contiguous(),
            (q @ k.transpose(-1, -2)) * decay_ij,
            last[..., 0].exp(),
            T,
            G,
            k,
        )

    def commit(self, state: torch.Tensor, keep: torch.Tensor) -> None:
        """`state` [H, K, V] to after the first `keep` tokens of a one-chunk sequence (a 0-d device tensor; 0
        leaves it), in place, from this solve. Masking the tokens from `keep` on (beta 0, decay 1) zeroes
        their rows of u and w and leaves the earlier rows as they were (row i of the triangular system reads
        rows j < i only), so
            S_keep = exp(G_{keep-1}) S + sum_{j < keep} (k_j exp(G_{keep-1} - G_j))^T (u_j - w_j S)."""
        assert self.G is not None and self.keys is not None and self.u.shape[1] == 1, "one chunk, from Chunks.of"
        G, k, u, w = self.G[:, 0], self.keys[:, 0], self.u[:, 0], self.w[:, 0]
        last = torch.where(keep > 0, G.index_select(1, (keep - 1).clamp(min=0).reshape(1)), 0.0)  # [H, 1]
        live = _rows(G.shape[1], state.device) < keep
        weight = torch.where(live, last - G, float("-inf")).exp()  # [H, C]: 0 from `keep` on
        fresh = u - w @ state  # before the state decays in place
        state.mul_(last.exp()[..., None]).add_((k * weight[..., None]).transpose(-1, -2) @ fresh)

    def first(self, state: torch.Tensor) -> torch.Tensor:
        """Outputs [T, H, V] (float32) of the first chunk from `state` [H, K, V], which is left as it is: what
        `scan` gives a one-chunk sequence, without carrying the state through it."""
        fresh = self.u[:, 0] - self.w[:, 0] @ state
        out = self.q[:, 0] @ state + self.attn[:, 0] @ fresh
        return out[:, : self.tokens].transpose(0, 1)

    def scan(self, state: torch.Tensor) -> torch.Tensor:
        """Outputs [T, H, V] (float32), taking `state` [H, K, V] through every chunk in place."""
        if available(state):
            out = _triton_scan(self, state)
        else:
            H, N, C, V = self.u.shape
            out = torch.empty(H, N, C, V, device=state.device)
            for i in range(N):
                fresh = self.u[:, i] - self.w[:, i] @ state
                out[:, i] = self.q[:, i] @ state + self.attn[:, i] @ fresh
                state.mul_(self.decay[:, i, None, None]).add_(self.k[:, i].transpose(-1, -2) @ fresh)
        return out.reshape(out.shape[0], -1, out.shape[-1])[:, : self.tokens].transpose(0, 1)


def _float(x: torch.Tensor) -> torch.Tensor:
    """x as float32: `.float()` on a float32 tensor returns it too, but through the dispatcher, several times a
    layer per step (issue 49's host time)."""
    return x if x.dtype == torch.float32 else x.float()


def _padded(x: torch.Tensor, pad: int) -> torch.Tensor:
    """x [T, H, *] with `pad` rows of zeros after it (tokens that change nothing once their gates are 0)."""
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, 0, 0, pad))


_CONSTANTS: dict[tuple, torch.Tensor] = {}  # the masks and indices every chunk of a size reads, made once per device


def _above(chunk: int, device: torch.device) -> torch.Tensor:
    """[C, C] bool: True above the diagonal (j > i)."""
    key = ("above", chunk, device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.ones(chunk, chunk, dtype=torch.bool, device=device).triu(1)
    return _CONSTANTS[key]


def _rows(n: int, device: torch.device) -> torch.Tensor:
    """[n] int64: 0 .. n - 1."""
    key = ("rows", n, device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.arange(n, device=device)
    return _CONSTANTS[key]


def chunked(q, k, v, g, beta, state: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """The same recurrence, a chunk at a time (prefill, a verify's outputs): the triangular systems of all
    chunks are solved at once, then one pass over the chunks carries the state (see `Chunks`)."""
    return Chunks.of(q, k, v, g, beta, chunk).scan(state)


def reference(q, k, v, g, beta, state, *, update: bool, outputs: bool = True, keep=None):
    """The recurrence token by token on prepared inputs (q, k at key heads), as `mix` specifies it."""
    T, H = g.shape
    q, k = per_value_head(q, H), per_value_head(k, H)
    g, beta = _float(g), _float(beta)
    if keep is not None:
        g, beta = masked_gates(g, beta, keep)
    s = state if update else state.clone()
    out = torch.empty(T, H, v.shape[2], dtype=torch.float32, device=v.device) if outputs else None
    decay = g.exp()
    for t in range(T):
        s.mul_(decay[t][:, None, None])
        kt = _float(k[t])
        delta = (_float(v[t]) - torch.einsum("hkv,hk->hv", s, kt)) * beta[t][:, None]
        s.add_(kt[:, :, None] * delta[:, None, :])
        if out is not None:
            out[t] = torch.einsum("hkv,hk->hv", s, _float(q[t]))
    return out


def _triton_scan(chunks: Chunks, state: torch.Tensor) -> torch.Tensor:
    H, N, C, V = chunks.u.shape
    K = chunks.w.shape[-1]
    out = torch.empty(H, N, C, V, device=state.device)
    vb = min(V_BLOCK, V)
    kernels = lazy.gdn()
    parts = (chunks.q, chunks.k, chunks.w, chunks.u, chunks.attn, chunks.decay)
    kernels._launch(
        kernels.scan_kernel,
        (H, V // vb),
        *(x.contiguous() for x in parts),
        state,
        out,
        N,
        C=C,
        K=K,
        V=V,
        VB=vb,
        num_warps=4,
    )
    return out


def _triton(qkv, b, a, A_log, dt_bias, state, heads: Heads, update, outputs, keep, out_dtype=torch.float32):
    T, H = b.shape
    K, V = heads.key_dim, heads.value_dim
    qkv = qkv.contiguous()
    if b.stride() != a.stride() or b.stride(-1) != 1:  # b and a usually are columns of one fused projection
        b, a = b.contiguous(), a.contiguous()
    out = torch.empty(T, H, V, dtype=out_dtype, device=qkv.device) if outputs else state  # state: unused
    vb = min(V_BLOCK, V)
    kernels = lazy.gdn()
    kernels._launch(
        kernels.recurrent_kernel,
        (H, V // vb),
        qkv,
        b,
        a,
        A_log,
        dt_bias,
        state,
        out,
        keep if keep is not None else state,
        T,
        H // heads.key_heads,
        qkv.stride(0),
        heads.key_total,
        b.stride(0),
        K=K,
        V=V,
        VB=vb,
        UPDATE=update,
        OUTPUTS=outputs,
        MASKED=keep is not None,
    )
    return out if outputs else None
