"""The Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU (or GeGLU / plain) MLP.

Layers are an `nnx.List` iterated by a Python loop, so XLA's cost analysis of a step counts every
layer (a scanned body would be counted once). Every kernel runs under its `kvjax.kernels` name,
inside `layer{i}` for layer kernels: `embed`, `layer0/norm/attn`, ..., `norm/final`, `lm_head`.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvjax import kernels
from kvjax.errors import KvjaxError
from kvjax.model.checks import check_extend
from kvjax.model.config import ModelConfig
from kvjax.nn.attend import soft_cap
from kvjax.nn.block import Block
from kvjax.nn.fake_quant import cache_view
from kvjax.nn.kv_cache import KVCache
from kvjax.nn.latent_cache import LatentCache
from kvjax.nn.layers import act_dtype, block_norm, kv_dtype, linear, param, read, shapes_only
from kvjax.nn.sharding import DATA, MODEL, constrain
from kvjax.nn.state_cache import HybridCache


class Transformer(nnx.Module):
    """A decoder for any `num_kv_heads` dividing `num_heads` (MHA, GQA, MQA), or with multi-head
    latent attention (MLA, `cfg.kv_lora_rank > 0`; `kvjax.nn.mla`)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if not isinstance(cfg, ModelConfig):
            raise KvjaxError(f"Transformer needs a ModelConfig, got {type(cfg).__name__}")
        if cfg.kv_packed:
            raise KvjaxError(
                f"kv_dtype={cfg.kv_dtype!r} (a packed 4/2-bit cache) is modelled in the closed "
                f"form only (kvjax calc, the explorer); the model's cache holds int8, fp8 or wider"
            )
        if cfg.expert_weight_dtype:
            raise KvjaxError(
                f"expert_weight_dtype={cfg.expert_weight_dtype!r} is modelled in the closed form "
                f"only (kvjax calc, the explorer, the trace's closed form); kvjax's model runs "
                f"experts in weight_dtype={cfg.weight_dtype!r}, as its checkpoint loader "
                f"dequantizes them: use expert_weight_dtype=''"
            )
        self.cfg = cfg
        self.embed = param(rngs, (cfg.vocab_size, cfg.d_model), 1, cfg)
        self.layers = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.num_layers)])
        self.final_norm = block_norm(cfg)
        self.lm_head = (
            None
            if cfg.tied_embeddings
            else param(rngs, (cfg.vocab_size, cfg.d_model), cfg.d_model, cfg)
        )

    # -- pieces shared by every path ---------------------------------------------------------
    def _embed(self, tokens_BT: jax.Array) -> jax.Array:
        with jax.named_scope(kernels.EMBED):
            w_VD = read(self.embed, self.cfg)
            x_BTD = jnp.take(w_VD, tokens_BT, axis=0)
            if self.cfg.scale_embeddings:  # Gemma: sqrt(D), rounded to the weights' dtype
                x_BTD = x_BTD * jnp.asarray(self.cfg.d_model**0.5, w_VD.dtype)
            elif self.cfg.embedding_multiplier != 1.0:  # Granite
                x_BTD = x_BTD * jnp.asarray(self.cfg.embedding_multiplier, w_VD.dtype)
        return constrain(x_BTD, DATA, None, None)

    def _head(self, x_BTD: jax.Array) -> jax.Array:
        with jax.named_scope(kernels.NORM_FINAL):
            x_BTD = self.final_norm(x_BTD)
        with jax.named_scope(kernels.LM_HEAD):
            w_VD = read(self.embed if self.lm_head is None else self.lm_head, self.cfg)
            # computed in vocab shards, then the logits (not the weight) gathered
            logits_BTV = constrain(linear(x_BTD, w_VD, out_dtype=jnp.float32), DATA, None, MODEL)
        if self.cfg.logits_scaling != 1.0:  # Granite
            with jax.named_scope(kernels.LOGIT_SCALE):
                logits_BTV = logits_BTV / self.cfg.logits_scaling
        if self.cfg.final_softcap:
            with jax.named_scope(kernels.LOGIT_SOFTCAP):
                logits_BTV = soft_cap(logits_BTV, self.cfg.final_softcap)
        return constrain(logits_BTV, DATA, None, None)

    def _check_tokens(self, tokens: jax.Array, ndim: int, name: str) -> None:
        if tokens.ndim != ndim:
            raise KvjaxError(f"{name} must have {ndim} dimensions, got shape {tuple(tokens.shape)}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise KvjaxError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
        values = _concrete(tokens)
        if (
            values is not None
            and values.size
            and (values.min() < 0 or values.max() >= self.cfg.vocab_size)
        ):
            raise KvjaxError(
                f"{name} holds ids in [{values.min()}, {values.max()}]; "
                f"allowed: 0 .. vocab_size-1 = {self.cfg.vocab_size - 1}"
            )

    # -- public API ----------------------------------------------------------------------------
    def __call__(self, tokens_BT: jax.Array, kv_dtype: str | None = None) -> jax.Array:
        """The full causal forward, no cache: logits [B, T, V] in f32.

        `kv_dtype` ("int8", "fp8", "int4", "int2"): attend keys and values as decoding from a
        cache of that dtype would read them (its default scales; `kvjax.nn.fake_quant`): the
        quality of a quantized cache, measured on a trained model.
        """
        self._check_tokens(tokens_BT, 2, "tokens_BT")
        logits_BTV, _, _ = self._forward(tokens_BT, kv_dtype)
        return logits_BTV

    def _forward(self, tokens_BT, kv_dtype: str | None = None, valid_BT=None):
        """Logits, each attention layer's (layer, cache rows) and each state layer's (layer,
        conv cache, state) after the prompt (`valid_BT`: the real tokens of right-padded
        prompts, which the state layers' states stop at)."""
        B, T = tokens_BT.shape
        positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        x_BTD = self._embed(tokens_BT)
        kvs, states = [], []

        cfg = self.cfg
        view = None if kv_dtype is None else cache_view(kv_dtype, cfg)
        for i, layer in enumerate(self.layers):

            def attend(attn, proj, i=i):
                kvs.append((i, attn.cache_rows(proj)))
                window = cfg.sliding_window if cfg.layer_is_sliding(i) else 0
                if view is not None:
                    return attn.causal(proj, window, cached=view(proj[1], proj[2]))
                return attn.causal(proj, window)

            def mix(mixer, h_BTD, i=i):
                y_BTD, conv_BWX, state = mixer(h_BTD, valid_BT)
                states.append((i, conv_BWX, state))
                return y_BTD

            with jax.named_scope(kernels.layer_scope(i)):
                x_BTD = layer(x_BTD, positions_BT, attend, mix)
        return self._head(x_BTD), kvs, states

    def init_cache(self, batch_size: int, max_len: int) -> KVCache | LatentCache:
        """An empty cache: per layer K [B, K, H, max_len] and V [B, K, max_len, H] (MLA: latents
        [B, max_len, A] and RoPE keys [B, max_len, P]) in the KV dtype, positions 0."""
        cfg = self.cfg
        if cfg.is_mla:
            return LatentCache.zeros(cfg, batch_size, max_len, kv_dtype(cfg))
        if cfg.is_hybrid:  # the attention layers' KV and the state layers' flat states
            return HybridCache.zeros(cfg, batch_size, max_len)
        windows = tuple(
            cfg.sliding_window if cfg.layer_is_sliding(i) else 0 for i in range(cfg.num_layers)
        )
        return KVCache.zeros(
            cfg.num_layers,
            batch_size,
            cfg.num_kv_heads,
            max_len,
            cfg.head_dim,
            kv_dtype(cfg),
            windows,
            cfg.kv_scale_kind,
            cfg.sink_tokens,
        )

    def prefill(self, tokens_BT: jax.Array, cache: KVCache, lengths_B: jax.Array | None = None):
        """Run the prompt into an empty cache: (logits [B, T, V], cache).

        Prompts of different lengths are right-padded to T and given as `lengths_B`; each
        sequence's position becomes its length, so decode overwrites the padding.
        """
        self._check_tokens(tokens_BT, 2, "tokens_BT")
        B, T = tokens_BT.shape
        if B != cache.batch_size:
            raise KvjaxError(
                f"tokens_BT has batch {B} but the cache was made for batch_size={cache.batch_size}"
            )
        if T > cache.max_len:
            raise KvjaxError(
                f"a prompt of T={T} tokens does not fit the cache's max_len={cache.max_len}; "
                f"make the cache with max_len >= {T}"
            )
        valid_BT = None
        if lengths_B is None:
            lengths_B = jnp.full((B,), T, jnp.int32)
        else:
            lengths_B = jnp.asarray(lengths_B, jnp.int32)
            if lengths_B.shape != (B,):
                raise KvjaxError(f"lengths_B must have shape ({B},), got {tuple(lengths_B.shape)}")
            lens = _concrete(lengths_B)
            if lens is not None and (lens.min() < 1 or lens.max() > T):
                raise KvjaxError(f"lengths_B must lie in 1 .. T={T}, got {lens.tolist()}")
            if self.cfg.is_hybrid:  # the state layers stop at each prompt's last real token
                valid_BT = jnp.arange(T, dtype=jnp.int32)[None, :] < lengths_B[:, None]
        logits_BTV, kvs, states = self._forward(tokens_BT, valid_BT=valid_BT)
        for i, rows in kvs:
            cache = cache.write_prefix(i, *rows, lengths_B=lengths_B)
        for i, conv_BWX, state in states:
            cache = cache.write_state(i, conv_BWX, state)
        return logits_BTV, cache.with_positions(lengths_B)

    def decode_logits(self, tokens_B: jax.Array, cache: KVCache):
        """Attend one new token per sequence over the cache, which is only read.

        Returns (logits [B, V], new k rows, new v rows) with rows [B, K, H] per layer (MLA: new
        latents [B, A] and RoPE keys [B, P]; a hybrid's state layers: their new conv caches and
        states, `kvjax.nn.state_cache`), to be written by `cache.append`. Jitting this and
        the append separately (the cache donated to the append) keeps XLA:CPU from copying the
        cache; `decode` does both.
        """
        self._check_tokens(tokens_B, 1, "tokens_B")
        B = tokens_B.shape[0]
        if B != cache.batch_size:
            raise KvjaxError(
                f"tokens_B has batch {B} but the cache was made for batch_size={cache.batch_size}"
            )
        pos = _concrete(cache.pos)
        if pos is not None and pos.max() >= cache.max_len:
            seq = int(pos.argmax())
            raise KvjaxError(
                f"cannot decode past max_len={cache.max_len}: sequence {seq} is at position "
                f"{int(pos[seq])}; make the cache with a larger max_len"
            )
        positions_BT = cache.pos[:, None]
        x_BTD = self._embed(tokens_B[:, None])
        new_k, new_v = [None] * len(self.layers), [None] * len(self.layers)
        for i, layer in enumerate(self.layers):

            def attend(attn, proj, i=i):
                row_a, row_b = attn.cache_rows(proj)
                if new_k[i] is None:
                    new_k[i], new_v[i] = row_a[:, 0], row_b[:, 0]
                else:  # H: the Mamba-2 half wrote first (the closed form's order)
                    new_k[i], new_v[i] = (row_a[:, 0], new_k[i]), (row_b[:, 0], new_v[i])
                return attn.over_cache(proj, cache.layer(i), cache.pos, cache.layer_window(i))

            def mix(mixer, h_BTD, i=i):
                y_BTD, new_k[i], new_v[i] = mixer.step(h_BTD, *cache.state_layer(i))
                return y_BTD

            with jax.named_scope(kernels.layer_scope(i)):
                x_BTD = layer(x_BTD, positions_BT, attend, mix)
        return self._head(x_BTD)[:, 0], tuple(new_k), tuple(new_v)

    def extend(self, tokens_BT: jax.Array, cache: KVCache):
        """T new tokens per sequence appended to a cache that holds `cache.pos` of them: a chunk
        of a chunked prefill, or a speculative verify step (T = k + 1). Each layer writes the T
        rows at pos .. pos + T - 1, then the T queries attend the cache causally (query t sees
        the positions up to pos + t). A hybrid's state layers run their chunked scans from the
        cached conv inputs and states (`HybridCache.snapshot` keeps what a rejected draft rolls
        back to). Returns (logits [B, T, V], cache advanced by T)."""
        check_extend(self.cfg, model=True)
        self._check_tokens(tokens_BT, 2, "tokens_BT")
        B, T = tokens_BT.shape
        if B != cache.batch_size:
            raise KvjaxError(
                f"tokens_BT has batch {B} but the cache was made for batch_size={cache.batch_size}"
            )
        pos = _concrete(cache.pos)
        if pos is not None and pos.max() + T > cache.max_len:
            seq = int(pos.argmax())
            held = int(pos[seq])
            raise KvjaxError(
                f"cannot extend by T={T}: sequence {seq} holds {held} positions of the cache's "
                f"max_len={cache.max_len}; make the cache with max_len >= {held + T}"
            )
        positions_BT = cache.pos[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
        x_BTD = self._embed(tokens_BT)
        for i, layer in enumerate(self.layers):

            def attend(attn, proj, i=i):
                nonlocal cache
                cache = cache.write_rows(i, *attn.cache_rows(proj))
                return attn.over_written_cache(proj, cache.layer(i), cache.pos)

            def mix(mixer, h_BTD, i=i):  # a state layer: its chunked scan from the cached state
                nonlocal cache
                y_BTD, conv, state = mixer(h_BTD, None, *cache.state_layer(i))
                cache = cache.write_state(i, conv, state)
                return y_BTD

            with jax.named_scope(kernels.layer_scope(i)):
                x_BTD = layer(x_BTD, positions_BT, attend, mix)
        return self._head(x_BTD), cache.with_positions(cache.pos + T)

    def decode(self, tokens_B: jax.Array, cache: KVCache):
        """One new token per sequence: (logits [B, V], cache advanced by one position)."""
        logits_BV, new_k, new_v = self.decode_logits(tokens_B, cache)
        if self.cfg.attention_kernel == "flash":
            # The fused kernels are custom calls XLA cannot order against the in-place write of
            # the donated cache; without this it may schedule the write first and copy the
            # whole cache to keep the old one for the kernel (XLA:GPU did, for MLA's latent).
            logits_BV, cache = jax.lax.optimization_barrier((logits_BV, cache))
        return logits_BV, cache.append(new_k, new_v)


def _concrete(x) -> np.ndarray | None:
    """The value of `x` if it is concrete (not a tracer), for checks before any computation."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


# The kernel each parameter (and cache array) is read by. Compiled ops that lost their named
# scope (XLA:CPU drops the metadata of matrix-vector products) are attributed through the
# parameters they read (`kvjax.traced.compiled`).
PARAM_KERNELS = {
    "q_proj": kernels.Q_PROJ,
    "q_bias": kernels.Q_PROJ,
    "k_proj": kernels.K_PROJ,
    "k_bias": kernels.K_PROJ,
    "v_proj": kernels.V_PROJ,
    "v_bias": kernels.V_PROJ,
    "o_proj": kernels.O_PROJ,
    "gate_up": kernels.GATE_UP,
    "up": kernels.UP,
    "down": kernels.DOWN,
    "alpha_p": kernels.ACT,
    "alpha_n": kernels.ACT,  # xIELU's learned scalars (Apertus)
    "attn_norm": kernels.NORM_ATTN,
    "mlp_norm": kernels.NORM_MLP,
    "q_norm": kernels.QK_NORM,
    "k_norm": kernels.QK_NORM,
    "post_attn_norm": kernels.NORM_POST_ATTN,
    "post_mlp_norm": kernels.NORM_POST_MLP,
    "final_norm": kernels.NORM_FINAL,
    "embed": kernels.EMBED,
    "lm_head": kernels.LM_HEAD,
    "k": kernels.SCORES,
    "v": kernels.AV,  # the KV cache: cache.k[i], cache.v[i]
    # MLA: the latent cache is read first by the scores (absorbed) or kv_b_proj (naive, which
    # the consumer rule in `kvjax.traced.compiled` finds); its up-projections and norms
    "latent": kernels.SCORES,
    "k_rope": kernels.SCORES,
    "q_a_proj": kernels.Q_A_PROJ,
    "q_a_norm": kernels.NORM_Q_A,
    "q_b_proj": kernels.Q_B_PROJ,
    "kv_a_proj": kernels.KV_A_PROJ,
    "kv_a_norm": kernels.NORM_KV_A,
    "k_up": kernels.Q_ABSORB,
    "v_up": kernels.V_UP,
    "router": kernels.MOE_ROUTER,
    "router_bias": kernels.MOE_TOPK,
    "expert_gate_up": kernels.MOE_GATE_UP,
    "expert_down": kernels.MOE_DOWN,
    # the state layers (`kvjax.nn.deltanet`, `mamba2`, `shortconv`)
    "in_proj_qkvz": kernels.LINEAR_IN_PROJ,
    "in_proj_ba": kernels.LINEAR_IN_PROJ,
    "linear_conv": kernels.LINEAR_CONV,
    "dt_bias": kernels.LINEAR_GATES,
    "A_log": kernels.LINEAR_GATES,
    "linear_norm": kernels.LINEAR_NORM,
    "linear_out_proj": kernels.LINEAR_OUT_PROJ,
    "ssm_in_proj": kernels.SSM_IN_PROJ,
    "ssm_conv": kernels.SSM_CONV,
    "ssm_conv_bias": kernels.SSM_CONV,
    "ssm_dt_bias": kernels.SSM_DT,
    "ssm_A_log": kernels.SSM_DT,
    "ssm_D": kernels.SSM_SCAN,
    "ssm_norm": kernels.SSM_NORM,
    "ssm_out_proj": kernels.SSM_OUT_PROJ,
    "conv_in_proj": kernels.CONV_IN_PROJ,
    "conv_in_bias": kernels.CONV_IN_PROJ,
    "short_conv": kernels.CONV_CONV,
    "short_conv_bias": kernels.CONV_CONV,
    "conv_out_proj": kernels.CONV_OUT_PROJ,
    "conv_out_bias": kernels.CONV_OUT_PROJ,
}
_PATH_PART = re.compile(r"\['(\w+)'\]|\[(\d+)\]|\.(\w+)")


def param_kernel(op_name: str, is_product: bool = False) -> tuple[int | None, str] | None:
    """(layer, kernel) of the parameter or cache array a jit argument's `op_name` names:
    `state['layers'][0]['attn']['q_proj'].value` -> (0, attn/q_proj); `cache.k[1]` -> (1,
    attn/scores). A tied embedding read by a product is the LM head."""
    parts = [a or b or c for a, b, c in _PATH_PART.findall(op_name.replace("\\", ""))]
    layer = next((int(x) for x in parts if x.isdigit()), None)
    for part in reversed(parts):
        if part in PARAM_KERNELS:
            kernel = PARAM_KERNELS[part]
            if kernel == kernels.EMBED and is_product:
                kernel = kernels.LM_HEAD
            return layer, kernel
    return None


def abstract_model(cfg: ModelConfig) -> Transformer:
    """The model with `ShapeDtypeStruct` leaves: no weights allocated, so 70B costs nothing."""
    with shapes_only():
        return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def param_count(model: Transformer) -> int:
    """Parameters of a real or abstract model."""
    state = nnx.state(model, nnx.Param)
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state))


__all__ = ["Transformer", "abstract_model", "param_count", "act_dtype"]
