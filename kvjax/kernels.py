"""The kernel registry: every named piece of a decoder step, and the letters kvjax writes them in.

Each kernel is defined here once, by name and kind, and the three views key their numbers by
that name: `kvjax.analytic` (closed form), `kvjax.nn` (the model's `jax.named_scope`s, which
`kvjax.traced` attributes XLA's cost to) and `kvjax.measured` (timings). A kernel's three views:

    grep -rn "kernels.SCORES" kvjax/    # closed form, model scope, trace, bench

Letters (the seed's and the scaling book's). Formulas, einsum strings and array-name suffixes
(`q_BTKGH`) everywhere in kvjax use these and point here instead of restating them:

    B batch             T query length (tokens per sequence in this step)
    S key/context length (positions attended)      C cached positions read (S - 1 in decode)
    D d_model           F d_ff              E the output width of a fused projection (2F, N*H)
    N query heads       K kv heads          G = N / K query heads per kv head
    H head dim          L layers            V vocabulary
    M = B * T tokens    R = B * N attention rows    O, I a linear's output and input widths
MLA (multi-head latent attention, DeepSeek-V2/V3) adds:
    A kv_lora_rank (latent width)    P qk_rope_head_dim    U qk_nope_head_dim (H = U + P)
    W v_head_dim        Q q_lora_rank
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjax.errors import unknown_name_error

LETTERS = {
    "B": "batch",
    "T": "query length (tokens per sequence in this step)",
    "S": "key/context length (positions attended)",
    "C": "cached positions read by a decode step (S - 1)",
    "D": "d_model",
    "F": "d_ff",
    "E": "output width of a fused projection (2F for gate_up, N*H for q)",
    "N": "query heads",
    "K": "kv heads",
    "G": "query heads per kv head, N / K",
    "H": "head dim",
    "L": "layers",
    "V": "vocabulary",
    "M": "tokens of the step, B * T",
    "R": "attention rows, B * N",
    "O": "a linear's output width",
    "I": "a linear's input width",
    "A": "MLA latent width, kv_lora_rank",
    "P": "MLA RoPE key/query width, qk_rope_head_dim",
    "U": "MLA key/query width without RoPE, qk_nope_head_dim (H = U + P)",
    "W": "MLA value head width, v_head_dim",
    "Q": "MLA query low rank, q_lora_rank",
    "k": "MoE experts per token, experts_per_token",
}
# MoE formulas (`kvjax.analytic.moe`) write E routed experts, k per token, F_e = moe_d_ff; array
# suffixes keep the letters above (w_MkED: M tokens, k picks, E = 2F_e rows, D).

# Kinds: how the closed form counts a kernel and how its traced bytes compare.
MATMUL = "matmul"  # 2*M*K*N FLOPs; weights + input + output bytes, compared strictly
ELEMENTWISE = "elementwise"  # one pass over its tensors in the closed form; unfused when lowered
GATHER = "gather"
SCATTER = "scatter"
FUSED = "fused"  # several kernels timed or reported as one
STEP = "step"  # the whole step
GLUE = "glue"  # traced instructions outside every kernel


@dataclass(frozen=True)
class Kernel:
    name: str
    kind: str
    per_layer: bool  # one per decoder layer (else once per step)
    summary: str
    bytes_note: str | None = None  # why the lowered trace's bytes differ from the closed form
    members: tuple[str, ...] = ()  # the kernels a FUSED kernel stands for


REGISTRY: dict[str, Kernel] = {}


def _k(
    name: str,
    kind: str,
    per_layer: bool,
    summary: str,
    bytes_note: str | None = None,
    members: tuple[str, ...] = (),
) -> str:
    REGISTRY[name] = Kernel(name, kind, per_layer, summary, bytes_note, members)
    return name


_NORM_NOTE = (
    "unfused elementwise: the lowered module materialises every step (square, sum, rsqrt, two "
    "multiplies, broadcasts); the closed form counts one fused read and write"
)

EMBED = _k(
    "embed", GATHER, False, "token ids to rows of the embedding table",
    "gather: XLA counts twice the gathered rows plus the ids and the index arithmetic",
)  # fmt: skip
NORM_ATTN = _k("norm/attn", ELEMENTWISE, True, "RMSNorm before attention", _NORM_NOTE)
Q_PROJ = _k("attn/q_proj", MATMUL, True, "x @ W_q: N*H query features")
K_PROJ = _k("attn/k_proj", MATMUL, True, "x @ W_k: K*H key features")
V_PROJ = _k("attn/v_proj", MATMUL, True, "x @ W_v: K*H value features")
QK_NORM = _k(
    "attn/qk_norm", ELEMENTWISE, True, "Qwen3 / Gemma 3: RMSNorm of every q and k head", _NORM_NOTE
)
ROPE = _k(
    "attn/rope", ELEMENTWISE, True, "rotary position embedding of q and k",
    "unfused elementwise: cos/sin tables, halves, four multiplies and two adds each materialised "
    "in the lowered module; the closed form counts one fused pass over q and k",
)  # fmt: skip
TEMPERATURE = _k(
    "attn/temperature", ELEMENTWISE, True,
    "Llama 4's NoPE layers: q times log(floor((t + 1) / floor_scale) + 1) * scale + 1",
    "unfused elementwise: the position's scale steps and q's widening, multiply and narrowing "
    "each materialised in the lowered module",
)  # fmt: skip
KV_WRITE = _k(
    "kv_cache/write", SCATTER, True, "the new k, v rows written into the cache",
    "scatter: XLA counts the updated region read, the update read and the write (3x the row) "
    "plus index arithmetic; the closed form counts reading the new row and writing it",
)  # fmt: skip
SCORES = _k("attn/scores", MATMUL, True, "q . K over the attended positions (f32 scores)")
SOFTMAX = _k(
    "attn/softmax", ELEMENTWISE, True, "scale, mask and softmax of the scores",
    "unfused elementwise: scale, mask, max, subtract, exp, sum and divide each read and write the "
    "score tensor in the lowered module; the closed form counts one read of the scores and one "
    "write of the probabilities",
)  # fmt: skip
AV = _k("attn/av", MATMUL, True, "probabilities . V")
O_PROJ = _k("attn/o_proj", MATMUL, True, "attention output @ W_o")
NORM_POST_ATTN = _k(
    "norm/post_attn", ELEMENTWISE, True, "Gemma 2/3: RMSNorm of the attention output", _NORM_NOTE
)
RESIDUAL_ATTN = _k("residual/attn", ELEMENTWISE, True, "x + attention output")
NORM_MLP = _k("norm/mlp", ELEMENTWISE, True, "RMSNorm before the MLP", _NORM_NOTE)
GATE_UP = _k("mlp/gate_up", MATMUL, True, "x @ [W_gate; W_up] (gated MLP)")
UP = _k("mlp/up", MATMUL, True, "x @ W_up (plain MLP)")
ACT = _k(
    "mlp/act", ELEMENTWISE, True, "silu / gelu / xIELU (times up, gated)",
    "unfused elementwise: the activation's steps (negate, exp, add, divide, multiply) each "
    "materialised in the lowered module; the closed form counts one fused pass",
)  # fmt: skip
DOWN = _k("mlp/down", MATMUL, True, "h @ W_down")
NORM_POST_MLP = _k(
    "norm/post_mlp", ELEMENTWISE, True, "Gemma 2/3: RMSNorm of the MLP output", _NORM_NOTE
)
RESIDUAL_MLP = _k("residual/mlp", ELEMENTWISE, True, "x + MLP output")
NORM_FINAL = _k("norm/final", ELEMENTWISE, False, "RMSNorm before the LM head", _NORM_NOTE)
LM_HEAD = _k("lm_head", MATMUL, False, "x @ W_vocab: f32 logits")
LOGIT_SCALE = _k(
    "lm_head/scale", ELEMENTWISE, False, "Granite: logits / logits_scaling",
    "unfused elementwise: the division materialised in the lowered module",
)  # fmt: skip
LOGIT_SOFTCAP = _k(
    "lm_head/softcap", ELEMENTWISE, False, "Gemma 2: logits = c * tanh(logits / c)",
    "unfused elementwise: divide, tanh and multiply each materialised in the lowered module",
)  # fmt: skip

# Multi-head latent attention (MLA). The cache holds the latent c (A wide, normed) and the shared
# RoPE key (P wide) of every position; `kvjax.analytic.step` derives each kernel's cost.
Q_A_PROJ = _k("attn/q_a_proj", MATMUL, True, "MLA: x @ W_qa: the query's low-rank latent (Q)")
NORM_Q_A = _k("norm/q_a", ELEMENTWISE, True, "MLA: RMSNorm of the query latent", _NORM_NOTE)
Q_B_PROJ = _k("attn/q_b_proj", MATMUL, True, "MLA: query latent @ W_qb: N*(U+P) query features")
KV_A_PROJ = _k(
    "attn/kv_a_proj", MATMUL, True, "MLA: x @ W_kva: the latent c (A) and the shared RoPE key (P)"
)
NORM_KV_A = _k("norm/kv_a", ELEMENTWISE, True, "MLA: RMSNorm of the latent", _NORM_NOTE)
KV_B_PROJ = _k(
    "attn/kv_b_proj", MATMUL, True,
    "MLA naive/prefill: latents @ W_kvb: per-head keys (U) and values (W) of every position",
)  # fmt: skip
Q_ABSORB = _k(
    "attn/q_absorb", MATMUL, True, "MLA absorbed: q_nope @ W_uk per head: the query in latent space"
)
V_UP = _k(
    "attn/v_up", MATMUL, True, "MLA absorbed: latent attention output @ W_uv per head: values (W)"
)

# Mixture of experts (E routed experts of width F_e, k per token; `kvjax.analytic.moe`). The
# shared experts and a dense layer's MLP are the mlp/ kernels.
_GATHER_NOTE = (
    "gathered experts: the lowered module writes the M*k picked experts' matrices and the product "
    "reads them again (and widens them in a 2-byte model); the closed form counts the touched "
    "experts read once"
)
MOE_ROUTER = _k("moe/router", MATMUL, True, "MoE: f32 router logits x @ W_r (one per expert)")
MOE_TOPK = _k(
    "moe/topk", ELEMENTWISE, True, "MoE: the experts' scores (softmax / sigmoid), top-k, weights",
    "unfused elementwise: the softmax or sigmoid, the top-k and the renormalisation each "
    "materialised in the lowered module",
)  # fmt: skip
MOE_GATE_UP = _k("moe/gate_up", GATHER, True, "MoE: x @ [W_gate; W_up] of its k experts",
                 _GATHER_NOTE)  # fmt: skip
MOE_ACT = _k(
    "moe/act", ELEMENTWISE, True, "MoE: silu(gate) * up of the k experts' rows",
    "unfused elementwise: the activation's steps and the gate/up slices each materialised in "
    "the lowered module; the closed form counts one fused pass",
)  # fmt: skip
MOE_DOWN = _k("moe/down", GATHER, True, "MoE: h @ W_down of its k experts", _GATHER_NOTE)
MOE_SHARED_GATE = _k(
    "moe/shared_gate", MATMUL, True,
    "Qwen2-MoE: the shared experts' output times sigmoid(x @ w_g), one gate a token",
)  # fmt: skip
MOE_COMBINE = _k(
    "moe/combine", ELEMENTWISE, True, "MoE: the k outputs weighted and summed (+ shared experts)",
    "a small product and reshapes: the lowered module counts the broadcast weights and the "
    "reshaped output again",
)  # fmt: skip

# Layers whose state does not grow (closed forms: `kvjax.analytic.hybrid`). Their
# recurrent states and conv caches are counted as the kernels' kv_bytes (the cache traffic).
_STATE_NOTE = (
    "unfused elementwise ops: the lowered module counts every intermediate's bytes (the convs' "
    "padded and shifted inputs, the scans' chunked intermediates and masks)"
)
ATTN_GATE = _k(
    "attn/gate", ELEMENTWISE, True,
    "Qwen3-Next: the attention output times sigmoid(q_proj's gate)", _STATE_NOTE,
)  # fmt: skip
LINEAR_IN_PROJ = _k(
    "linear_attn/in_proj", MATMUL, True,
    "Gated DeltaNet: x @ [W_qkvz; W_ba]: q, k, v, the output gate z, beta's and decay's logits",
)  # fmt: skip
LINEAR_CONV = _k(
    "linear_attn/conv", ELEMENTWISE, True,
    "Gated DeltaNet: short causal depthwise conv of q, k, v and silu; its conv cache", _STATE_NOTE,
)  # fmt: skip
LINEAR_GATES = _k(
    "linear_attn/gates", ELEMENTWISE, True,
    "Gated DeltaNet: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)", _STATE_NOTE,
)  # fmt: skip
LINEAR_QK_NORM = _k(
    "linear_attn/qk_norm", ELEMENTWISE, True,
    "Gated DeltaNet: L2 norm of every q and k head (on the q/k heads; q's d_k^-0.5 folded in)",
    _STATE_NOTE,
)  # fmt: skip
LINEAR_SCAN = _k(
    "linear_attn/scan", ELEMENTWISE, True,
    "Gated DeltaNet: the delta rule on the d_k x d_v state per value head (decode: one step, "
    "the state read and written; prefill: the chunked algorithm, chunks of 64, the state carried "
    "chunk to chunk by one scan)", _STATE_NOTE,
)  # fmt: skip
LINEAR_NORM = _k(
    "linear_attn/norm", ELEMENTWISE, True,
    "Gated DeltaNet: RMSNorm of each head's output times silu(z)", _STATE_NOTE,
)  # fmt: skip
LINEAR_OUT_PROJ = _k("linear_attn/out_proj", MATMUL, True, "Gated DeltaNet: output @ W_out")
SSM_IN_PROJ = _k(
    "ssm/in_proj", MATMUL, True, "Mamba-2: x @ W_in: the gate z, x, B, C and dt of every head"
)
SSM_CONV = _k(
    "ssm/conv", ELEMENTWISE, True,
    "Mamba-2: short causal depthwise conv of x, B, C and silu; its conv cache", _STATE_NOTE,
)  # fmt: skip
SSM_DT = _k(
    "ssm/dt", ELEMENTWISE, True, "Mamba-2: softplus(dt + dt_bias), clamped; A = -exp(A_log)",
    _STATE_NOTE,
)  # fmt: skip
SSM_SCAN = _k(
    "ssm/scan", ELEMENTWISE, True,
    "Mamba-2 SSD on the N x P state per head, D skip (decode: one step, the state read and "
    "written; prefill: HF's chunked scan, chunks of scan_chunk)", _STATE_NOTE,
)  # fmt: skip
SSM_NORM = _k(
    "ssm/norm", ELEMENTWISE, True, "Mamba-2: y * silu(z), or a gated RMSNorm (state_norm)",
    _STATE_NOTE,
)  # fmt: skip
SSM_OUT_PROJ = _k("ssm/out_proj", MATMUL, True, "Mamba-2: y @ W_out")
SSM_COMBINE = _k(
    "ssm/combine", ELEMENTWISE, True, "Falcon-H1: Mamba-2 output + attention output", _STATE_NOTE
)
CONV_IN_PROJ = _k("conv/in_proj", MATMUL, True, "LFM2 short conv: x @ W_in: B, C and x")
CONV_GATE = _k(
    "conv/gate", ELEMENTWISE, True, "LFM2 short conv: B * x before the conv, C * y after",
    _STATE_NOTE,
)  # fmt: skip
CONV_CONV = _k(
    "conv/conv", ELEMENTWISE, True,
    "LFM2 short conv: causal depthwise conv over conv_kernel positions; its conv cache",
    _STATE_NOTE,
)  # fmt: skip
CONV_OUT_PROJ = _k("conv/out_proj", MATMUL, True, "LFM2 short conv: y @ W_out")

ATTENTION = _k("attention", FUSED, True, "scores, softmax and av as one kernel",
               members=(SCORES, SOFTMAX, AV))  # fmt: skip
ATTN_COMBINE = _k(
    "attn/combine", ELEMENTWISE, True,
    "flash-decoding: the splits' partial outputs rescaled by their softmax maxima and summed",
)  # fmt: skip
STEP_KERNEL = _k("step", STEP, False, "the whole step")
OTHER = _k(
    "other", GLUE, False, "traced instructions outside every kernel",
    "glue outside every kernel: reshapes, transposes and index arithmetic between kernels "
    "(bitcasts or fused once compiled)",
)  # fmt: skip

ATTENTION_PARTS = REGISTRY[ATTENTION].members


def get(name: str) -> Kernel:
    if name not in REGISTRY:
        raise unknown_name_error("kernel", name, REGISTRY)
    return REGISTRY[name]


def layer_scope(layer: int) -> str:
    """The named scope of decoder layer `layer`, above its kernels: `layer3/attn/scores`."""
    return f"layer{layer}"


def bytes_note(name: str) -> str | None:
    return REGISTRY[name].bytes_note if name in REGISTRY else None
