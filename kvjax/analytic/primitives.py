"""The closed form's primitives: one matmul, norm, residual add, soft cap, softmax and RoPE, as
XLA's lowered module counts them. `kvjax.analytic.step` (every kernel of a step) and
`kvjax.analytic.mla` (latent attention) both build on these. Pure Python; letters:
kvjax.kernels."""

from __future__ import annotations

from kvjax import kernels
from kvjax.analytic.costs import SCORE_BYTES, KernelCost
from kvjax.model.config import DTYPE_BYTES, ModelConfig


def _act_bytes(cfg: ModelConfig) -> int:
    return DTYPE_BYTES[cfg.compute_dtype]


def _matmul(
    name: str, m: int, k: int, n: int, w: int, a: int, bias: bool = False, out: int = 0
) -> KernelCost:
    """y[m, n] = x[m, k] @ W[k, n] (+ b[n]): 2mkn FLOPs; reads W and x, writes y.

    A bias is a broadcast of b to [m, n] and an add: m*n FLOPs, n*w + 4*m*n*a bytes, and the
    reshapes that lift b to [1, 1, n] before the broadcast: 6*n*a more (XLA's lowered count).
    """
    weight = k * n * w + (n * w if bias else 0)
    bias_bytes = 4 * m * n * a + 6 * n * a if bias else 0
    return KernelCost(
        name,
        flops=2 * m * k * n + (m * n if bias else 0),
        bytes=weight + m * k * a + m * n * (out or a) + bias_bytes,
        weight_bytes=weight,
    )


def _rmsnorm(
    name: str, m: int, d: int, w: int, a: int, plus_one: bool = False, weights: int = 1
) -> KernelCost:
    """x * rsqrt(mean(x^2) + eps) * scale, reduced in f32; `m` rows of width `d`.

    FLOPs: x*x (md), the sum (md - m), /d and +eps (2m), x*inv (md), *scale (md) = 4md + m, one
    rsqrt per row; a 2-byte model also converts x to f32 and back (2md). Gemma's (1 + w) adds
    d, and in a 2-byte model w's conversion to f32 (d). `weights`: scale vectors read (the q/k
    norms' two).
    """
    flops = 4 * m * d + m + (2 * m * d if a != 4 else 0)
    if plus_one:
        flops += weights * d * (2 if a != 4 else 1)
    d_w = weights * d
    return KernelCost(
        name, flops=flops, bytes=2 * m * d * a + d_w * w, transcendentals=m, weight_bytes=d_w * w
    )


def _layernorm(name: str, m: int, d: int, w: int, a: int, bias: bool = False) -> KernelCost:
    """(x - mean) * rsqrt(var + eps) * scale (+ bias), reduced in f32; `m` rows of width `d`.

    FLOPs: the mean (md - m sums, m divides), x - mean (md), its square (md), the variance (md - m
    sums, m divides), +eps (m), x*inv (md), *scale (md), +bias (md) = 6md + m (+ md); one rsqrt a
    row; a 2-byte model also converts x to f32 and back (2md).
    """
    flops = 6 * m * d + m + (m * d if bias else 0) + (2 * m * d if a != 4 else 0)
    d_w = (2 if bias else 1) * d
    return KernelCost(
        name, flops=flops, bytes=2 * m * d * a + d_w * w, transcendentals=m, weight_bytes=d_w * w
    )


def norm_cost(cfg, name: str, m: int, d: int, w: int, a: int) -> KernelCost:
    """A block's (or the final) norm as `cfg.norm_kind` says: RMSNorm or LayerNorm."""
    if cfg.norm_kind == "layer":
        return _layernorm(name, m, d, w, a, cfg.norm_bias)
    return _rmsnorm(name, m, d, w, a, cfg.norm_plus_one)


def act_cost(cfg, m: int, f: int, w: int, a: int) -> KernelCost:
    """The dense MLP's activation on `m` rows of width `f` (times up, gated), as the lowered
    module counts it.

    silu(x) = x / (1 + exp(-x)): negate, exp, add, divide, multiply = 4 FLOPs + 1 exp; gelu (tanh
    form): 8 FLOPs + 1 tanh; the gated form multiplies by `up` (1 more FLOP). xIELU (Apertus,
    Hugging Face's XIELUActivation): x > 0, beta x, alpha_p x x (2), + beta x, min(x, eps),
    expm1 (1 transcendental), - x, * alpha_n, + beta x, the select = 10 FLOPs an element; once
    a layer the learned alphas' softplus (6 FLOPs, an exp and a log1p each) and beta + it:
    13 FLOPs, 4 transcendentals; the two alphas are its weights.
    """
    if cfg.mlp_activation == "xielu":
        return KernelCost(
            kernels.ACT,
            flops=10 * m * f + 13,
            bytes=2 * m * f * a + 2 * w,
            transcendentals=m * f + 4,
            weight_bytes=2 * w,
        )
    gated = cfg.gated_mlp
    return KernelCost(
        kernels.ACT,
        flops=act_flops(cfg, m * f, a),
        bytes=(3 if gated else 2) * m * f * a,
        transcendentals=m * f,
    )


def act_flops(cfg, elements: int, a: int) -> int:
    """An activation's FLOPs over `elements` (times up when gated): silu 4 + 1, gelu 8 + 1;
    gpt-oss's clamped SwiGLU min(gate, l), clip(up) (2), alpha * g, sigmoid (3: XLA's logistic,
    and an exp), g * s, up + 1, the product: 10, and in a 2-byte model the limit and -limit
    converted once (2)."""
    if cfg.mlp_activation == "clamped_swiglu":
        return 10 * elements + (2 if a != 4 else 0)
    return ({"silu": 4, "gelu": 8}[cfg.mlp_activation] + (1 if cfg.gated_mlp else 0)) * elements


def sink_logits_cost(cfg, rows: int, decode: bool, w: int) -> KernelCost:
    """gpt-oss's sink logits in a layer's softmax over `rows` query rows: the N logits read and
    widened to f32 (N FLOPs unless stored in f32), then per row the max taken with the sink,
    exp(sink - max) (1 exp) added to the denominator: 2 FLOPs a row in the causal and extend
    softmax, 3 in decode's written-out one (its sink max is a pass of its own)."""
    N = cfg.num_heads
    return KernelCost(
        kernels.SOFTMAX,
        flops=(3 if decode else 2) * rows + (N if w != 4 else 0),
        bytes=N * w,
        transcendentals=rows,
        weight_bytes=N * w,
    )


def _residual(name: str, m: int, d: int, a: int, multiplier: float = 1.0) -> KernelCost:
    """x + branch (Granite: x + branch * r: the scalar broadcast to [m, d] and the multiply,
    then the add, each materialised in the lowered module: 6 m d a bytes)."""
    if multiplier == 1.0:
        return KernelCost(name, flops=m * d, bytes=3 * m * d * a)
    return KernelCost(name, flops=2 * m * d, bytes=6 * m * d * a)


def softcap_cost(name: str, elements: int, a: int = 0) -> KernelCost:
    """c * tanh(x / c) over `elements` (Gemma 2): a divide and a multiply, one tanh each;
    `a` > 0: a pass of its own over f32 values (the logits), else inside the softmax."""
    return KernelCost(name, flops=2 * elements, bytes=2 * elements * a, transcendentals=elements)


def decode_softmax(R: int, B: int, S: int, a: int) -> KernelCost:
    """One query row per head and sequence (R rows) over S positions: S - 1 cached and the new.

    mask (B*C compares), scale, where, max (R*C - R), subtract, exp, sum (R*C - R), and multiply
    by 1/sum: 6*R*C - 2R; per row: self scale, maximum, subtract, add, divide, multiply: 6R; a
    2-byte model converts the probabilities (R*C + R). exp of every position: R*S.
    """
    C = S - 1
    return KernelCost(
        kernels.SOFTMAX,
        flops=6 * R * C + 4 * R + B * C + (R * C + R if a != 4 else 0),
        bytes=R * S * SCORE_BYTES + R * S * a,
        transcendentals=R * S,
    )


def prefill_softmax(R: int, T: int, S: int, a: int) -> KernelCost:
    """The causal T x S softmax of R = B*N heads: E = R*T*S scores.

    causal mask (2*T*S), scale, where, max (E - R*T), its maximum with -inf (R*T), subtract, exp,
    sum (E - R*T), divide: 6E - R*T + 2*T*S; a 2-byte model converts the probabilities (E).
    """
    E = R * T * S
    return KernelCost(
        kernels.SOFTMAX,
        flops=6 * E - R * T + 2 * T * S + (E if a != 4 else 0),
        bytes=E * SCORE_BYTES + E * a,
        transcendentals=E,
    )


def extend_softmax(R: int, B: int, T: int, S: int, a: int) -> KernelCost:
    """T new queries of R = B*N heads over the S cache rows (E = R*T*S scores), each seeing the
    rows up to its own position: the last row each sees (pos + t: B*T adds) and the mask
    (B*T*S compares), then scale, where, max, its maximum with -inf, subtract, exp, sum, divide
    as in `prefill_softmax`: 6E - R*T + B*T*(S + 1); at T = 1 jax drops the add of arange(1)
    (a constant zero); a 2-byte model converts the probabilities."""
    E = R * T * S
    last = B * T if T > 1 else 0
    return KernelCost(
        kernels.SOFTMAX,
        flops=6 * E - R * T + B * T * S + last + (E if a != 4 else 0),
        bytes=E * SCORE_BYTES + E * a,
        transcendentals=E,
    )


def rope_cost(
    M: int,
    heads: int,
    H: int,
    a: int,
    scaled: bool = False,
    table: bool = False,
    attention_factor: bool = False,
) -> KernelCost:
    """RoPE over `heads` rotated vectors of H per token (q's and k's): x1*cos - x2*sin,
    x2*cos + x1*sin, 3 FLOPs an element. Tables: angles = position * inv_freq (M*H/2), inv_freq =
    1/theta^(2i/H) (3*H/2 incl. one power each), positions to f32 (M); cos and sin: M*H
    transcendentals. A 2-byte model converts the tables for q and for k (2*M*H). `scaled`:
    linear scaling divides inv_freq by the factor (H/2). `table`: a long-context scaling's
    frequencies are constants (`kvjax.model.rope`), so inv_freq costs nothing; `attention_factor`:
    YaRN's cos and sin times it (M*H)."""
    elems = M * heads * H
    freq_flops = 0 if table else 3 * (H // 2) + (H // 2 if scaled else 0)
    return KernelCost(
        kernels.ROPE,
        flops=3 * elems
        + M * H // 2
        + M
        + freq_flops
        + (2 * M * H if a != 4 else 0)
        + (M * H if attention_factor else 0),
        bytes=2 * elems * a + M * H * a,
        transcendentals=M * H + (0 if table else H // 2),
    )


def l2_norm_cost(m: int, d: int, a: int) -> KernelCost:
    """Llama 4's unscaled q/k norm of `m` rows of `d`, in f32: x*x (md), the sum (md - m), /d
    and +eps (2m), x*inv (md) = 3md + m, one rsqrt a row; a 2-byte model converts x to f32 and
    back (2md)."""
    flops = 3 * m * d + m + (2 * m * d if a != 4 else 0)
    return KernelCost(kernels.QK_NORM, flops=flops, bytes=2 * m * d * a, transcendentals=m)


def temperature_cost(M: int, width: int, a: int) -> KernelCost:
    """Llama 4's temperature tuning of M tokens' queries (`width` = N*H each): per token the
    position to f32, + 1, / floor_scale, floor, * scale, + 1 (6, and log1p a transcendental);
    q times it in f32 (width), widened and narrowed again in a 2-byte model (2 width)."""
    flops = 6 * M + M * width + (2 * M * width if a != 4 else 0)
    return KernelCost(kernels.TEMPERATURE, flops=flops, bytes=2 * M * width * a, transcendentals=M)
