"""Closed forms of multi-head latent attention (DeepSeek-V2/V3), per kernel, prefill and decode.

Pure Python. Letters: `kvjax.kernels` (A latent, P RoPE width, U = H - P, W value width, Q query
low rank; R = B*N rows; C = S - 1 cached positions in decode). Counted as `kvjax.nn.mla` runs
it, every product 2 * (output elements) * (contracted length), every operand read and every
output written once per operation (`kvjax.analytic.step` says why); the trace checks each kernel.

The cache holds (A + P) elements per token per layer, whatever N is: DeepSeek-V3's 61 layers x
(512 + 64) x 2 bytes = 70,272 B per token in bf16, against 61 x 128 x (192 + 128) x 2 = 4.997 MB
for the same attention as MHA.

Decode attention per cached position, per layer, FLOPs over cache bytes read:
- naive: the cached latents are expanded every step (`attn/kv_b_proj`: 2*A*N*(U + W) FLOPs a
  position), then scores and av run over N per-head keys (U, and the shared RoPE key P) and values
  (W) as MHA: 2*N*(H + W) FLOPs over N*(U + W) + P elements, 1.25 FLOP/byte in bf16 for V3's
  widths: MHA's N/K = 1, raised a little by the RoPE key read once for all heads;
- absorbed: the scores read the latent and the RoPE key once for all N heads (2*N*(A + P)) and
  av the latent (2*N*A): 2*N*(2A + P) / ((A + P) * bytes) = 1.89*N in bf16 for A=512, P=64
  (242 FLOP/byte at N=128: just under an H100's bf16 ridge of 295; fp8 caches or two query
  tokens a step, as multi-token prediction decodes, double it past the ridge).
"""

from __future__ import annotations

from kvjax import kernels
from kvjax.analytic.costs import EXTEND, SCORE_BYTES, KernelCost, Workload
from kvjax.analytic.primitives import (
    _act_bytes,
    _matmul,
    _rmsnorm,
    decode_softmax,
    extend_softmax,
    prefill_softmax,
    rope_cost,
)
from kvjax.model.config import ModelConfig

F32 = SCORE_BYTES


def mla_attention_kernels(cfg: ModelConfig, wl: Workload) -> list[KernelCost]:
    """MLA's attention kernels of one layer, projections to o_proj, in execution order."""
    D, N, H = cfg.d_model, cfg.num_heads, cfg.head_dim
    A, P, W, Q = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.q_lora_rank
    M = wl.tokens
    w, a, kv = cfg.weight_bytes_per_element, _act_bytes(cfg), cfg.kv_bytes_per_element
    widen = kv != a  # cache entries converted to the compute dtype before the products
    if Q:
        k = [
            _matmul(kernels.Q_A_PROJ, M, D, Q, w, a),
            _rmsnorm(kernels.NORM_Q_A, M, Q, w, a),
            _matmul(kernels.Q_B_PROJ, M, Q, N * H, w, a),
        ]
    else:
        k = [_matmul(kernels.Q_PROJ, M, D, N * H, w, a)]
    k += [
        _matmul(kernels.KV_A_PROJ, M, D, A + P, w, a),
        _rmsnorm(kernels.NORM_KV_A, M, A, w, a),
        # N query heads and the one shared key (DeepSeek-V3's YaRN frequencies are constants)
        rope_cost(
            M,
            N + 1,
            P,
            a,
            False,
            cfg.rope_table(False),
            cfg.rope_table(False) and cfg.rope_attention_factor != 1.0,
        ),
    ]
    if wl.phase == "prefill":
        k += _prefill(cfg, wl, widen)
    elif wl.phase == EXTEND and _absorbed_extend(cfg, wl):
        # a few queries a sequence (MTP, a verify step): absorbed, each query a decode row; the
        # fused kernel reads the latent once for all of them (`kvjax.analytic.flash`)
        k += _decode_absorbed(cfg, Workload("decode", wl.batch * wl.query_len, wl.context), widen)
    elif wl.phase == EXTEND:
        k += _extend(cfg, wl, widen)
    elif cfg.mla_decode == "naive":
        k += _decode_naive(cfg, wl, widen)
    else:
        k += _decode_absorbed(cfg, wl, widen)
    k.append(_matmul(kernels.O_PROJ, M, N * W, D, w, a))
    return k


def _absorbed_extend(cfg: ModelConfig, wl: Workload) -> bool:
    """An extend step the fused kernel runs as FlashMLA's absorbed decode: at most
    `flash.DECODE_FORM_MAX_QUERIES` queries a sequence; a longer chunk expands the latents."""
    from kvjax.analytic.flash import DECODE_FORM_MAX_QUERIES

    return (
        cfg.attention_kernel == "flash"
        and cfg.mla_decode == "absorbed"
        and wl.query_len <= DECODE_FORM_MAX_QUERIES
    )


def _write(cfg: ModelConfig, rows: int, decode: bool, B: int, a: int, kv: int) -> KernelCost:
    """The new latents and RoPE keys written (two updates per layer); decode's scatters wrap
    negative indices, 3 ops per index per scatter (6B for pos, 6B for b unless B = 1)."""
    elems = rows * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    index = (6 * B + (6 * B if B > 1 else 0)) if decode else 0
    return KernelCost(
        kernels.KV_WRITE,
        flops=index + (elems if kv != a else 0),
        bytes=elems * (a + kv),
        kv_bytes=elems * kv,
    )


def _prefill(cfg: ModelConfig, wl: Workload, widen: bool) -> list[KernelCost]:
    """MHA over keys and values expanded from the T new latents (DeepSeek's and vLLM's prefill).

    kv_b_proj: c @ W_uk and c @ W_uv (2*M*A*N*(U + W)); scores: q_nope . k_nope and
    q_rope . k_rope (2*E*U + 2*E*P, E = R*T*S f32 scores each) and their sum (E); av: 2*E*W.
    """
    B, T, S = wl.batch, wl.query_len, wl.context
    N, A, P, U, W = (
        cfg.num_heads,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
        cfg.qk_nope_head_dim,
        cfg.v_head_dim,
    )
    M, R = B * T, B * N
    w, a, kv = cfg.weight_bytes_per_element, _act_bytes(cfg), cfg.kv_bytes_per_element
    E = R * T * S
    kv_b = KernelCost(
        kernels.KV_B_PROJ,
        flops=2 * M * A * N * (U + W),
        bytes=N * (U + W) * A * w + 2 * M * A * a + M * N * (U + W) * a,
        weight_bytes=N * (U + W) * A * w,
    )
    scores = KernelCost(
        kernels.SCORES,
        flops=2 * E * U + 2 * E * P + E,
        bytes=M * N * U * a
        + B * S * N * U * a
        + E * F32  # q_nope . k_nope
        + M * N * P * a
        + B * S * P * a
        + E * F32  # q_rope . k_rope (one key for all heads)
        + 3 * E * F32,  # their sum
    )
    av = KernelCost(kernels.AV, flops=2 * E * W, bytes=E * a + B * S * N * W * a + M * N * W * a)
    return [_write(cfg, M, False, B, a, kv), kv_b, scores, prefill_softmax(R, T, S, a), av]


def _extend(cfg: ModelConfig, wl: Workload, widen: bool) -> list[KernelCost]:
    """An extend step (a chunk of a chunked prefill: T new tokens on S - T cached) as DeepSeek's
    and vLLM's MLA chunked prefill runs it: the T new latents and RoPE keys written (two
    scatters at pos .. pos + T - 1, their indices wrapped as GQA's extend), then all S cached
    latents expanded to per-head keys and values (kv_b_proj, reading each latent twice, as
    prefill does) and MHA of the T queries over them, each masked to the rows up to itself
    (`kvjax.analytic.primitives.extend_softmax`). Closed form only (the model's extend refuses
    MLA); at T = S it is prefill with the latents read back from the cache.
    """
    B, T, S = wl.batch, wl.query_len, wl.context
    N, A, P, U, W = (
        cfg.num_heads,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
        cfg.qk_nope_head_dim,
        cfg.v_head_dim,
    )
    M, R, E = B * T, B * N, B * N * T * S
    w, a, kv = cfg.weight_bytes_per_element, _act_bytes(cfg), cfg.kv_bytes_per_element
    elems = M * (A + P)
    write = KernelCost(
        kernels.KV_WRITE,
        flops=2 * (3 * M + (3 * B if B > 1 else 0)) + (elems if widen else 0),
        bytes=elems * (a + kv),
        kv_bytes=elems * kv,
    )
    latents, rope_keys = B * S * A, B * S * P  # cached elements read
    kv_b = KernelCost(
        kernels.KV_B_PROJ,
        flops=2 * B * S * A * N * (U + W) + (latents if widen else 0),
        bytes=N * (U + W) * A * w
        + 2 * latents * (a if widen else kv)
        + (latents * (kv + a) if widen else 0)
        + B * S * N * (U + W) * a,
        weight_bytes=N * (U + W) * A * w,
        kv_bytes=latents * kv,
    )
    scores = KernelCost(
        kernels.SCORES,
        flops=2 * E * U + 2 * E * P + E + (rope_keys if widen else 0),
        bytes=M * N * U * a
        + B * S * N * U * a
        + E * F32  # q_nope . k_nope
        + M * N * P * a
        + rope_keys * (a if widen else kv)
        + E * F32  # q_rope . k_rope
        + (rope_keys * (kv + a) if widen else 0)
        + 3 * E * F32,  # their sum
        kv_bytes=rope_keys * kv,
    )
    av = KernelCost(kernels.AV, flops=2 * E * W, bytes=E * a + B * S * N * W * a + M * N * W * a)
    return [write, kv_b, scores, extend_softmax(R, B, T, S, a), av]


def _decode_naive(cfg: ModelConfig, wl: Workload, widen: bool) -> list[KernelCost]:
    """Hugging Face's decode: every cached latent re-expanded to per-head keys and values.

    kv_b_proj: the C cached latents and the new one through W_uk and W_uv, 2*B*S*A*N*(U + W)
    FLOPs (each weight read twice: for the cache and for the new row; a fused kernel reads it
    once); scores over the expanded keys (2*R*C*U + 2*R*C*P + R*C, and 2*R*(U + P) + R for the
    new token's own); av over the expanded values (2*R*C*W, and 2*R*W + R*W for the new row).
    """
    B, S = wl.batch, wl.context
    C = S - 1
    N, H, A, P, U, W = (
        cfg.num_heads,
        cfg.head_dim,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
        cfg.qk_nope_head_dim,
        cfg.v_head_dim,
    )
    R = B * N
    w, a, kv = cfg.weight_bytes_per_element, _act_bytes(cfg), cfg.kv_bytes_per_element
    c_read = B * C * A * (a if widen else kv)
    kv_b = KernelCost(
        kernels.KV_B_PROJ,
        flops=2 * B * S * A * N * (U + W) + (B * C * A if widen else 0),
        bytes=2 * N * (U + W) * A * w  # W_uk, W_uv: for the cache and for the new latent
        + 2 * c_read
        + (B * C * A * (kv + a) if widen else 0)  # latents (converted)
        + 2 * B * A * a  # the new latent, twice
        + B * C * N * (U + W) * a
        + R * (U + W) * a,  # expanded keys and values
        weight_bytes=2 * N * (U + W) * A * w,
        kv_bytes=B * C * A * kv,
    )
    kr_read = B * C * P * (a if widen else kv)
    scores = KernelCost(
        kernels.SCORES,
        flops=2 * R * C * H + R * C + 2 * R * H + R + (B * C * P if widen else 0),
        bytes=R * U * a
        + B * C * N * U * a
        + R * C * F32  # q_nope . k_nope (cache)
        + R * P * a
        + kr_read
        + R * C * F32
        + (B * C * P * (kv + a) if widen else 0)
        + 3 * R * C * F32  # the sum of the two
        + 2 * R * U * a
        + R * F32
        + R * P * a
        + B * P * a
        + R * F32
        + 3 * R * F32,  # own
        kv_bytes=B * C * P * kv,
    )
    av = KernelCost(
        kernels.AV,
        flops=2 * R * C * W + 2 * R * W + R * W,
        bytes=R * C * a
        + B * C * N * W * a
        + R * W * a  # P . V (cache)
        + R * a
        + R * W * a
        + R * W * a  # p_self x v_new
        + 3 * R * W * a,  # the sum
    )
    return [_write(cfg, B, True, B, a, kv), kv_b, scores, decode_softmax(R, B, S, a), av]


def _decode_absorbed(cfg: ModelConfig, wl: Workload, widen: bool) -> list[KernelCost]:
    """DeepSeek's decode: attention MQA-like over the cached latents themselves.

    q_absorb: q_nope @ W_uk per head (2*R*U*A); scores: q_lat . c and q_rope . k_rope over the
    cache (2*R*C*(A + P) + R*C) and the new token's own (2*R*(A + P) + R); av: P . c
    (2*R*C*A, and 2*R*A + R*A for the new row), the output still in latent space; v_up: per head
    @ W_uv (2*R*A*W). The cache (A + P per position) is read by the scores and the latent again
    by av: 2*N*(2A + P) FLOPs over (A + P) cached elements.
    """
    B, S = wl.batch, wl.context
    C = S - 1
    N, A, P, U, W = (
        cfg.num_heads,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
        cfg.qk_nope_head_dim,
        cfg.v_head_dim,
    )
    R = B * N
    w, a, kv = cfg.weight_bytes_per_element, _act_bytes(cfg), cfg.kv_bytes_per_element
    absorb = KernelCost(
        kernels.Q_ABSORB,
        flops=2 * R * U * A,
        bytes=R * U * a + N * U * A * w + R * A * a,
        weight_bytes=N * U * A * w,
    )
    read = B * C * (A + P) * (a if widen else kv)
    scores = KernelCost(
        kernels.SCORES,
        flops=2 * R * C * (A + P) + R * C + 2 * R * (A + P) + R + (B * C * (A + P) if widen else 0),
        bytes=R * (A + P) * a
        + read
        + 2 * R * C * F32  # two products over the cache
        + (B * C * (A + P) * (kv + a) if widen else 0)  # converted first
        + 3 * R * C * F32  # their sum (then a layout change to [B, N, S]: free)
        + R * (A + P) * a
        + B * (A + P) * a
        + 2 * R * F32
        + 3 * R * F32,  # own score
        kv_bytes=B * C * (A + P) * kv,
    )
    av = KernelCost(
        kernels.AV,
        flops=2 * R * C * A + 2 * R * A + R * A,
        bytes=R * C * a
        + B * C * A * a
        + R * A * a  # P . c (the converted latents)
        + R * a
        + B * A * a
        + R * A * a  # p_self x c_new
        + 3 * R * A * a,  # the sum
        kv_bytes=B * C * A * kv,
    )
    v_up = KernelCost(
        kernels.V_UP,
        flops=2 * R * A * W,
        bytes=R * A * a + N * W * A * w + R * W * a,
        weight_bytes=N * W * A * w,
    )
    return [_write(cfg, B, True, B, a, kv), absorb, scores, decode_softmax(R, B, S, a), av, v_up]


def mla_attention_intensity(cfg: ModelConfig) -> float:
    """Decode attention FLOPs (scores + av) per byte of what they read, per cached position:
    absorbed 2N(2A + P) / ((A + P) * bytes); naive 2N(H + W) / (N(U + W) * a + P * bytes), the
    expanded keys and values (compute dtype, a bytes) and the shared RoPE key being what its
    scores and av read: 1.25 for DeepSeek-V3 in bf16, MHA's 1 but for the shared RoPE key."""
    N, H, A, P, W = (
        cfg.num_heads,
        cfg.head_dim,
        cfg.kv_lora_rank,
        cfg.qk_rope_head_dim,
        cfg.v_head_dim,
    )
    kv, U = cfg.kv_bytes_per_element, cfg.qk_nope_head_dim
    if cfg.mla_decode == "naive":
        return 2 * N * (H + W) / (N * (U + W) * _act_bytes(cfg) + P * kv)
    return 2 * N * (2 * A + P) / ((A + P) * kv)
