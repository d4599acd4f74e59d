"""Closed forms of the layers whose state does not grow: Gated DeltaNet (Qwen3-Next's
linear attention), Mamba-2 heads beside attention (Falcon-H1) and LFM2's short gated
convolution: parameters, the state a sequence holds, and every kernel's FLOPs and bytes.

Pure Python. Letters (`kvjax.kernels` and, for the state layers): J = state_heads (DeltaNet's
value heads, Mamba's heads), Y = state_groups (DeltaNet's q/k heads, Mamba's B/C groups),
dk = state_key_dim (Mamba's state size N), dv = state_value_dim (Mamba's head dim P),
w_c = conv_kernel, X = the conv's channels, Z = scan_chunk, T' = T rounded up to whole chunks,
n_c = T' / Z. Counts follow Hugging Face's reference code in transformers 5.24
(`torch_recurrent_gated_delta_rule` / `torch_chunk_gated_delta_rule` with chunk_size=64,
`mamba2_selective_state_update` / `mamba2_chunk_scan` with chunk_size = scan_chunk): products
2mnk, elementwise steps one per element, exp / log / rsqrt as transcendentals. Where kvjax's
formulation differs (q and k of DeltaNet, B and C of Mamba kept on their Y groups instead of
repeated to the J heads; DeltaNet's chunk system inverted as FLA does), `deltanet_scan` and
`mamba_scan` say so and count kvjax's. The state is held in `state_dtype` (f32 there); a conv
cache keeps the last w_c - 1 inputs of each channel in the compute dtype (what the causal-conv1d
update needs; HF's DynamicCache keeps w_c).
Falcon-H1's muP multipliers (scalars and the in_proj's mup_vector) are not counted: elementwise.
"""

from __future__ import annotations

from kvjax import kernels
from kvjax.analytic.costs import KernelCost, Workload
from kvjax.analytic.primitives import _act_bytes, _matmul, _rmsnorm
from kvjax.model.config import DTYPE_BYTES, ModelConfig
from kvjax.model.hybrid import STATE_KINDS, conv_channels

SILU = 4  # negate, exp, add, divide (one exp: a transcendental)
SIGMOID = 3


def state_layer_bytes(cfg: ModelConfig, kind: str) -> dict[str, int]:
    """One sequence's state in one layer of `kind`: the recurrent state (J x dk x dv in
    state_dtype; none in a C layer) and the conv cache ((w_c - 1) x X in the compute dtype)."""
    if kind == "A":
        return {"recurrent": 0, "conv": 0}
    recurrent = 0
    if kind in STATE_KINDS:
        recurrent = cfg.state_heads * cfg.state_key_dim * cfg.state_value_dim
        recurrent *= DTYPE_BYTES[cfg.state_dtype]
    conv = (cfg.conv_kernel - 1) * conv_channels(cfg, kind) * _act_bytes(cfg)
    return {"recurrent": recurrent, "conv": conv}


def state_bytes(cfg: ModelConfig, batch: int = 1) -> int:
    """The states of `batch` sequences over all layers: flat in S."""
    per = {k: sum(state_layer_bytes(cfg, k).values()) for k in set(cfg.layer_kinds)}
    return batch * sum(per[cfg.layer_kind(i)] for i in range(cfg.num_layers))


def mixer_param_counts(cfg: ModelConfig, kind: str) -> dict[str, int]:
    """A state layer's mixer parameters by kernel (H: the Mamba-2 half; its attention is the
    usual attn/ kernels). As Hugging Face builds them: DeltaNet in_proj_qkvz (2*Y*dk + 2*J*dv)
    and in_proj_ba (2J), conv (X * w_c, no bias), dt_bias and A_log (J each), the gated norm
    (dv), out_proj; Mamba-2 in_proj (J*P for z, X, J for dt), conv (+ bias), dt_bias, A_log, D
    (J each), the gated norm (J*P, state_norm), out_proj; LFM2 in_proj (3D), conv, out_proj (and
    their biases with conv_bias)."""
    D, J, dv, w = cfg.d_model, cfg.state_heads, cfg.state_value_dim, cfg.conv_kernel
    X, b = conv_channels(cfg, kind), cfg.conv_bias
    if kind == "D":
        return {
            kernels.LINEAR_IN_PROJ: D * (X + J * dv + 2 * J),
            kernels.LINEAR_CONV: X * w,
            kernels.LINEAR_GATES: 2 * J,
            kernels.LINEAR_NORM: dv,
            kernels.LINEAR_OUT_PROJ: J * dv * D,
        }
    if kind == "H":
        out = {
            kernels.SSM_IN_PROJ: D * (J * dv + X + J),
            kernels.SSM_CONV: X * w + (X if b else 0),
            kernels.SSM_DT: 2 * J,
            kernels.SSM_SCAN: J,  # D, the skip
            kernels.SSM_OUT_PROJ: J * dv * D,
        }
        if cfg.state_norm:
            out[kernels.SSM_NORM] = J * dv
        return out
    return {
        kernels.CONV_IN_PROJ: 3 * D * D + (3 * D if b else 0),
        kernels.CONV_CONV: D * w + (D if b else 0),
        kernels.CONV_OUT_PROJ: D * D + (D if b else 0),
    }


def _conv(cfg: ModelConfig, wl: Workload, name: str, X: int, act: bool) -> KernelCost:
    """Causal depthwise conv of X channels over w_c positions (+ bias, + silu with `act`):
    (2w_c - 1) FLOPs an output element (w_c products, w_c - 1 sums). Decode reads the conv
    cache's w_c - 1 rows and the new one and writes the cache shifted (w_c - 1 rows); prefill
    convolves the prompt (zero-padded) and writes its last w_c - 1 rows as the cache."""
    B, M, w = wl.batch, wl.tokens, cfg.conv_kernel
    a, wb = _act_bytes(cfg), cfg.weight_bytes_per_element
    per = 2 * w - 1 + (1 if cfg.conv_bias else 0) + (SILU if act else 0)
    weights = X * w * wb + (X * wb if cfg.conv_bias else 0)
    cache = (w - 1) * X * a * B
    traffic = 2 * cache if wl.phase == "decode" else cache  # read and written / written
    return KernelCost(
        name,
        flops=M * X * per,
        bytes=2 * M * X * a + weights + traffic,
        transcendentals=M * X if act else 0,
        weight_bytes=weights,
        kv_bytes=traffic,
    )


def _gated_norm(cfg: ModelConfig, name: str, rows: int, d: int) -> KernelCost:
    """RMSNorm of `rows` rows of d (in f32) times silu(z): the norm's cost and 5 FLOPs, one exp
    and z's read an element."""
    a, w = _act_bytes(cfg), cfg.weight_bytes_per_element
    norm = _rmsnorm(name, rows, d, w, a)
    n = rows * d
    return norm + KernelCost(name, flops=(SILU + 1) * n, bytes=n * a, transcendentals=n)


DELTANET_CHUNK = 64  # torch_chunk_gated_delta_rule's chunk_size (kvjax.nn.delta_rule.CHUNK)


def _doubling_inverse_flops(Z: int) -> int:
    """(I - N)^-1 of a unit-lower Z x Z block by doubling (`kvjax.nn.delta_rule.
    unit_lower_inverse`): at block size s = 1, 2, .., Z/2, Z/(2s) pairs of s x s blocks each
    take two s x s x s products (B C A): 2Z s^2 FLOPs a level."""
    flops, s = 0, 1
    while s < Z:
        flops += 2 * Z * s * s
        s *= 2
    return flops


def deltanet_scan(cfg: ModelConfig, wl: Workload) -> KernelCost:
    """The gated delta rule of B*J heads as kvjax computes it (`kvjax.nn.delta_rule`): q and k
    stay on their Y heads (q arrives scaled: `linear_attn/qk_norm`), v, beta, g per value head.
    Decode, per head (Hugging Face's `torch_recurrent_gated_delta_rule`): S * exp(g) (dk dv, one
    exp), k^T S (a product, 2dk dv), delta = (v - kv) * beta (2dv), S + k delta^T (2dk dv), q^T S
    (2dk dv): 7dk dv + 2dv; the state read and written. Prefill, in chunks of Z = 64 (its
    `torch_chunk_gated_delta_rule`), per chunk and value head: the decays' cumsum (Z(Z-1), as XLA
    costs a reduce-window), the pairwise decays (subtract, mask, exp: Z^2 exps), beta times them,
    k k^T times that, q k^T times them (5Z^2); the right-hand sides v beta, beta exp(cum), k times
    it (Z(dv + 1 + dk)); the unit-lower system's inverse by doubling (-beta: Z; then
    `_doubling_inverse_flops`, as FLA's solve_tril) and [u, w] as its product with them
    (2Z^2 (dk + dv)); q exp(cum), last - cum and its exp, k times it (Z(2dk + 1)); then the scan
    over chunks: v_new = u - w S, out = q S + A v_new, S decayed plus k^T v_new (6Z dk dv +
    2Z^2 dv + 2Z dv + 2dk dv). Per chunk and q/k head: k k^T and q k^T (4Z^2 dk). A 2-byte
    model converts v to f32 and the output back (2dv a token and value head). Transcendentals
    per value head: exp(cum) and exp(last - cum) (2T'), the pairwise n_c Z^2. Hugging Face
    repeats q and k to the J heads (k k^T, q k^T and q's scale J/Y times over) and solves the
    system (Z(Z-1)(dk + dv) a chunk) with torch.linalg.solve_triangular, where XLA's
    triangular-solve is an uncounted LAPACK call on CPU and a forward substitution unrolls Z
    dependent steps; the inverse costs 2.2x the solve's FLOPs at dk = dv = 128 (n_c J 2.3M
    against 1.0M), as products."""
    B, T = wl.batch, wl.query_len
    J, Y, dk, dv = cfg.state_heads, cfg.state_groups, cfg.state_key_dim, cfg.state_value_dim
    a, s = _act_bytes(cfg), DTYPE_BYTES[cfg.state_dtype]
    state = B * J * dk * dv * s
    converts = 0 if a == 4 else 2 * B * T * J * dv
    io = B * T * (Y * 2 * dk * 4 + J * (dv * a + 2 * 4 + dv * a))  # q, k (f32), v, beta, g; out
    if wl.phase == "decode":
        return KernelCost(
            kernels.LINEAR_SCAN,
            flops=B * J * (7 * dk * dv + 2 * dv) + converts,
            bytes=2 * state + io,
            transcendentals=B * J,
            kv_bytes=2 * state,
        )
    Z = DELTANET_CHUNK
    Tp = -(-T // Z) * Z
    nc = Tp // Z
    per_chunk = (
        Z * (Z - 1)  # cumsum of the decays
        + 5 * Z * Z  # pairwise decays: subtract, mask; * beta, * k k^T; q k^T * decay
        + Z * (dv + 1 + dk)  # v * beta, beta * exp(cum), k * that
        + Z
        + _doubling_inverse_flops(Z)
        + 2 * Z * Z * (dk + dv)  # -beta, the inverse, [u, w]
        + Z * (2 * dk + 1)  # q * exp(cum), last - cum, k * exp(last - cum)
        + 6 * Z * dk * dv
        + 2 * Z * Z * dv
        + 2 * Z * dv
        + 2 * dk * dv  # the scan over chunks
    )
    flops = B * nc * (J * per_chunk + Y * 4 * Z * Z * dk) + converts
    chunks = B * J * (4 * 2 * nc * Z * Z * 4 + 2 * 2 * Tp * (dk + dv) * 4)  # 4 Z x Z; u, w
    return KernelCost(
        kernels.LINEAR_SCAN,
        flops=flops,
        bytes=io + chunks + state,
        transcendentals=B * J * (nc * Z * Z + 2 * Tp),
        kv_bytes=state,
    )


def mamba_scan(cfg: ModelConfig, wl: Workload) -> KernelCost:
    """Mamba-2 over B*J heads of P = dv, state N = dk, in Y groups, as `kvjax.nn.mamba2` runs it
    (HF's `mamba2_selective_state_update` / `mamba2_chunk_scan`, two changes: B and C keep their
    group axis, not repeated to the J heads; dt and exp(dt A) per head, not expanded to P x N).
    Decode, per head: exp(dt A) (1 product, 1 exp), dt x (P), its outer product with B (PN),
    S exp(dt A) + dtBx (2PN), S C (2PN), + D x (2P): 5PN + 3P + 1; the state read and written.
    Prefill (Z = scan_chunk), per head: products n_c (2Z^2 P + 4ZNP) (M x, the chunk states, C
    times them) and the inter-chunk recurrence 2(n_c+1)^2 PN as that code computes it (a product
    over all chunk pairs), per group n_c 2Z^2 N (C B^T); the elementwise steps below, the
    cumulative sums of A dt (in each chunk, and of the chunks' totals) as XLA lowers jnp.cumsum
    (a reduce-window: length - 1 adds an output); the decays exp(cs_l - cs_s) with their causal
    mask a select; the final state written. The scan runs in f32: a 2-byte model converts x, B, C
    (B T X) and D (J) first."""
    B, T = wl.batch, wl.query_len
    J, Y, N, P = cfg.state_heads, cfg.state_groups, cfg.state_key_dim, cfg.state_value_dim
    a, s, w = _act_bytes(cfg), DTYPE_BYTES[cfg.state_dtype], cfg.weight_bytes_per_element
    state = B * J * P * N * s
    widen = B * T * (J * P + 2 * Y * N) + J if a != 4 else 0
    if wl.phase == "decode":
        return KernelCost(
            kernels.SSM_SCAN,
            flops=B * J * (5 * P * N + 3 * P + 1) + widen,
            bytes=2 * state + B * (2 * J * P * a + 2 * Y * N * a + J * 4) + J * w,
            transcendentals=B * J,
            kv_bytes=2 * state,
        )
    Z = cfg.scan_chunk
    Tp = -(-T // Z) * Z
    nc = Tp // Z
    products = nc * (2 * Z * Z * P + 4 * Z * N * P) + 2 * (nc + 1) ** 2 * P * N
    elementwise = (
        T * P
        + T  # x * dt, A * dt
        + Tp * (Z - 1)  # cumsum of A dt in each chunk
        + 3 * nc * Z * Z  # cs_l - cs_s, the causal mask, C B^T times the decays
        + Tp
        + Tp * N  # last - cs, B * decay
        + nc * (nc + 1)  # cumsum of the chunks' totals (a zero first)
        + 2 * (nc + 1) ** 2  # their differences, the mask
        + 2 * Tp * P  # C S * exp(cs), Y_diag + Y_off
        + 2 * T * P  # D * x, its add
    )
    per_group = nc * 2 * Z * Z * N
    chunks = B * (2 * J + Y) * 2 * nc * Z * Z * 4 + B * J * 3 * (nc + 1) * P * N * 4  # L, G, M
    io = B * T * (2 * Y * N * 4 + J * P * a + J * 4 + J * P * 4)  # B, C, x (f32), dt; y
    return KernelCost(
        kernels.SSM_SCAN,
        flops=B * J * (products + elementwise) + B * Y * per_group + widen,
        bytes=io + chunks + state,
        transcendentals=B * J * (nc * Z * Z + 2 * Tp + (nc + 1) ** 2),
        kv_bytes=state,
    )


def mixer_kernels(cfg: ModelConfig, wl: Workload, kind: str) -> list[KernelCost]:
    """The mixer of a D, C or H layer (H: the Mamba-2 half, the attention beside it is the usual
    attn/ kernels), in execution order."""
    M, D, J, dv = wl.tokens, cfg.d_model, cfg.state_heads, cfg.state_value_dim
    w, a = cfg.weight_bytes_per_element, _act_bytes(cfg)
    X = conv_channels(cfg, kind)
    if kind == "C":
        return [
            _matmul(kernels.CONV_IN_PROJ, M, D, 3 * D, w, a, bias=cfg.conv_bias),
            KernelCost(kernels.CONV_GATE, flops=2 * M * D, bytes=6 * M * D * a),
            _conv(cfg, wl, kernels.CONV_CONV, X, act=False),
            _matmul(kernels.CONV_OUT_PROJ, M, D, D, w, a, bias=cfg.conv_bias),
        ]
    Y, dk = cfg.state_groups, cfg.state_key_dim
    if kind == "D":
        # beta: sigmoid (3, one exp); g: + dt_bias, softplus as torch's (threshold compare and
        # select: 2; exp and log1p), * -exp(A_log) (1; exp(A_log) and its negation once, J); in
        # f32: a 2-byte model converts b and a (2 a token and head) and dt_bias, A_log (2J)
        cv = 0 if a == 4 else 1
        gates = KernelCost(
            kernels.LINEAR_GATES,
            flops=(7 + 2 * cv) * M * J + (1 + 2 * cv) * J,
            bytes=2 * M * J * (a + 4) + 2 * J * w,
            transcendentals=3 * M * J + J,
            weight_bytes=2 * J * w,
        )
        # q and k L2-normalised in f32 on their Y heads (3dk a row, one rsqrt), q's d_k^-0.5
        # folded into its inverse norm (one product a row); a 2-byte model converts them first
        rows = 2 * M * Y
        qk_norm = KernelCost(
            kernels.LINEAR_QK_NORM,
            flops=rows * (3 + cv) * dk + M * Y,
            bytes=rows * dk * (a + 4),
            transcendentals=rows,
        )
        # Qwen3NextRMSNormGated in a 2-byte model also converts z, the product's promotion and
        # the result: 3 more converts an element than the norm's own two
        norm = _gated_norm(cfg, kernels.LINEAR_NORM, M * J, dv)
        norm = norm + KernelCost(kernels.LINEAR_NORM, flops=3 * cv * M * J * dv, bytes=0)
        return [
            # in_proj_qkvz and in_proj_ba: two products, each reading x (as HF runs them)
            _matmul(kernels.LINEAR_IN_PROJ, M, D, X + J * dv, w, a)
            + _matmul(kernels.LINEAR_IN_PROJ, M, D, 2 * J, w, a),
            _conv(cfg, wl, kernels.LINEAR_CONV, X, act=True),
            gates,
            qk_norm,
            deltanet_scan(cfg, wl),
            norm,
            _matmul(kernels.LINEAR_OUT_PROJ, M, J * dv, D, w, a),
        ]
    # Mamba-2, per head (HF's decode expands dt to the head dim first; kvjax.nn.mamba2 does not):
    # dt + dt_bias, softplus (torch's threshold: a compare and a select; exp and log1p), clamp
    # to time_step_limit (1); A = -exp(A_log) (J); in f32 (a 2-byte model converts dt, dt_bias
    # and A_log)
    widen = M * J + 2 * J if a != 4 else 0
    dt = KernelCost(
        kernels.SSM_DT,
        flops=M * J * 4 + J + widen,
        bytes=2 * M * J * a + 2 * J * w,
        transcendentals=2 * M * J + J,
        weight_bytes=2 * J * w,
    )
    # in f32 (y is f32 from the scan): a 2-byte model converts z and the result (2n), the norm's
    # weight (J*P; _gated_norm's 2n are z's and the result's here)
    n = M * J * dv
    if cfg.state_norm:  # Falcon-H1's gated RMSNorm over Y groups of J*P / Y
        norm = _gated_norm(cfg, kernels.SSM_NORM, M * Y, J * dv // Y)
        norm += KernelCost(kernels.SSM_NORM, J * dv if a != 4 else 0, 0)
    else:  # y * silu(z)
        flops = (SILU + 1) * n + (2 * n if a != 4 else 0)
        norm = KernelCost(kernels.SSM_NORM, flops, 3 * n * a, transcendentals=n)
    return [
        _matmul(kernels.SSM_IN_PROJ, M, D, J * dv + X + J, w, a),
        _conv(cfg, wl, kernels.SSM_CONV, X, act=True),
        dt,
        mamba_scan(cfg, wl),
        norm,
        _matmul(kernels.SSM_OUT_PROJ, M, J * dv, D, w, a),
    ]


def attn_gate_cost(cfg: ModelConfig, M: int) -> KernelCost:
    """Qwen3-Next's output gate: attention output * sigmoid(gate), M*N*H elements (4 FLOPs and
    one exp each); reads both, writes the product."""
    n = M * cfg.num_heads * cfg.head_dim
    return KernelCost(kernels.ATTN_GATE, 4 * n, 3 * n * _act_bytes(cfg), transcendentals=n)


def combine_cost(cfg: ModelConfig, M: int) -> KernelCost:
    """Falcon-H1 adds its Mamba-2 and attention outputs (M*D) before the residual."""
    return KernelCost(kernels.SSM_COMBINE, M * cfg.d_model, 3 * M * cfg.d_model * _act_bytes(cfg))
