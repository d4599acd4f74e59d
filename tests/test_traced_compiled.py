"""The compiled module per instruction: costs equal to XLA's own totals, and every executed op
mapped to the kernels it computes."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from kvjax import get_model_config, kernels
from kvjax.nn import CompiledSteps, Transformer
from kvjax.nn.transformer import param_kernel
from kvjax.traced.compiled import UNNAMED, compiled_ops, module_cost

NAMES = tuple(kernels.REGISTRY)


def _served_modules(preset, batch):
    cfg = get_model_config(preset)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    steps = CompiledSteps(model)
    cache = model.init_cache(batch, 16)
    tokens = jnp.arange(batch, dtype=jnp.int32)
    _, new_k, new_v = steps.attend(steps.state, tokens, cache)
    prompt = jnp.zeros((batch, 8), jnp.int32)
    lengths = jnp.full((batch,), 8, jnp.int32)
    return {
        "attend": steps.attend.lower(steps.state, tokens, cache).compile(),
        "append": steps.append.lower(cache, new_k, new_v).compile(),
        "prefill": steps.prefill.lower(steps.state, prompt, cache, lengths).compile(),
    }


@pytest.mark.parametrize("preset,batch", [("tiny-gqa", 2), ("tiny-mqa", 1), ("tiny-mha", 3)])
def test_costs_equal_xla_compiled_totals(preset, batch):
    for name, compiled in _served_modules(preset, batch).items():
        ours, xla = module_cost(compiled.as_text()), compiled.cost_analysis()
        assert ours.flops == xla["flops"], name
        assert ours.bytes == xla["bytes accessed"], name
        assert ours.transcendentals == xla.get("transcendentals", 0.0), name


def test_every_served_kernel_has_executed_ops_at_batch_one():
    """At B=1 XLA:CPU drops the metadata of matrix-vector products: they are attributed by the
    weights they read, so every kernel of the step still has its ops."""
    cfg = get_model_config("tiny-gqa")
    found = set()
    for name, compiled in _served_modules("tiny-gqa", 1).items():
        if name == "prefill":
            continue
        for op in compiled_ops(compiled.as_text(), NAMES, param_kernel):
            found |= set(op.kernels)
    wanted = {kernels.EMBED, kernels.Q_PROJ, kernels.K_PROJ, kernels.V_PROJ, kernels.ROPE,
              kernels.KV_WRITE, kernels.SCORES, kernels.SOFTMAX, kernels.AV, kernels.O_PROJ,
              kernels.GATE_UP, kernels.ACT, kernels.DOWN, kernels.NORM_ATTN, kernels.NORM_MLP,
              kernels.NORM_FINAL, kernels.LM_HEAD, kernels.RESIDUAL_MLP}  # fmt: skip
    assert wanted <= found, wanted - found
    assert cfg.gated_mlp


HAND_BUILT = """HloModule jit_step, entry_computation_layout={(f32[4,8]{1,0}, f32[8,16]{1,0})->f32[4,8]{1,0}}

%sm (param_0: f32[4,16], param_1: f32[64]) -> f32[4,16] {
  %param_0 = f32[4,16]{1,0} parameter(0)
  %param_1 = f32[64]{0} parameter(1)
  %slice.1 = f32[16]{0} slice(%param_1), slice={[0:16]}
  %bitcast.1 = f32[4,16]{1,0} bitcast(%param_0), metadata={op_name="jit(step)/layer0/attn/q_proj/dot"}
  %broadcast.1 = f32[4,16]{1,0} broadcast(%slice.1), dimensions={1}
  %subtract.1 = f32[4,16]{1,0} subtract(%bitcast.1, %broadcast.1), metadata={op_name="jit(step)/layer0/attn/softmax/sub"}
  ROOT %exponential.1 = f32[4,16]{1,0} exponential(%subtract.1), metadata={op_name="jit(step)/layer0/attn/softmax/exp"}
}

%res_norm (param_0.2: f32[4,8], param_1.2: f32[4,8]) -> f32[4,8] {
  %param_0.2 = f32[4,8]{1,0} parameter(0)
  %param_1.2 = f32[4,8]{1,0} parameter(1)
  %add.2 = f32[4,8]{1,0} add(%param_0.2, %param_1.2), metadata={op_name="jit(step)/layer0/residual/mlp/add"}
  ROOT %multiply.2 = f32[4,8]{1,0} multiply(%add.2, %add.2), metadata={op_name="jit(step)/layer1/norm/attn/mul"}
}

ENTRY %main (x: f32[4,8], w: f32[8,16], t: f32[64], o: f32[16,8]) -> f32[4,8] {
  %x = f32[4,8]{1,0} parameter(0), metadata={op_name="x"}
  %w = f32[8,16]{1,0} parameter(1), metadata={op_name="state['layers'][0]['attn']['q_proj'].value"}
  %t = f32[64]{0} parameter(2), metadata={op_name="t"}
  %o = f32[16,8]{1,0} parameter(3), metadata={op_name="state['layers'][0]['attn']['o_proj'].value"}
  %dot.1 = f32[4,16]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/layer0/attn/q_proj/dot_general"}
  %copy.1 = f32[4,16]{1,0} copy(%dot.1)
  %fusion.1 = f32[4,16]{1,0} fusion(%copy.1, %t), kind=kLoop, calls=%sm, metadata={op_name="jit(step)/layer0/attn/softmax/exp"}
  %dot.2 = f32[4,8]{1,0} dot(%fusion.1, %o), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %fusion.2 = f32[4,8]{1,0} fusion(%dot.2, %x), kind=kLoop, calls=%res_norm, metadata={op_name="jit(step)/layer1/norm/attn/mul"}
}
"""


def test_hand_built_module_ops_are_attributed_and_costed():
    """A compiled module written by hand, every instruction known: a scoped product, a copy XLA
    made without metadata, a softmax fusion holding a bitcast of the product (its producer's
    name, ignored) and a sliced operand, a product that lost its scope, and a fusion spanning
    two kernels of two layers."""
    ops = {op.name: op for op in compiled_ops(HAND_BUILT, NAMES, param_kernel)}
    assert list(ops) == ["dot.1", "copy.1", "fusion.1", "dot.2", "fusion.2"]
    assert ops["dot.1"].kernels == (kernels.Q_PROJ,)
    assert ops["copy.1"].kernels == (kernels.SOFTMAX,)  # no metadata: its consumer's kernel
    assert ops["fusion.1"].kernels == (kernels.SOFTMAX,)
    assert ops["dot.2"].kernels == (kernels.O_PROJ,)  # no metadata: the weight it reads
    assert ops["fusion.2"].kernels == (kernels.NORM_ATTN, kernels.RESIDUAL_MLP)
    assert ops["fusion.2"].layers == (0, 1)
    # costs by hand (4-byte elements)
    assert (ops["dot.1"].cost.flops, ops["dot.1"].cost.bytes) == (
        2 * 4 * 16 * 8,
        4 * (32 + 128 + 64),
    )
    assert ops["copy.1"].cost.bytes == 4 * (64 + 64)
    # fusion.1: subtract 64 FLOPs, 64 exps; reads its first operand whole and 16 of the 64
    # elements of the second (a slice), writes 64
    softmax = ops["fusion.1"].cost
    assert (softmax.flops, softmax.transcendentals) == (64, 64)
    assert softmax.bytes == 4 * (64 + 16 + 64)
    assert ops["fusion.2"].cost.flops == 2 * 32 and ops["fusion.2"].cost.bytes == 4 * 3 * 32


def test_a_fusion_spanning_scopes_names_every_member():
    """A real jitted function: XLA:CPU fuses a product, a softmax and a product-sum into one
    library call: one op naming the three kernels, never given to one of them."""

    def f(x, w):
        with jax.named_scope(kernels.Q_PROJ):
            y = x @ w
        with jax.named_scope(kernels.SOFTMAX):
            z = jnp.exp(y - y.max(axis=-1, keepdims=True))
        with jax.named_scope(kernels.AV):
            return (z @ w.T).sum()

    x, w = jnp.ones((64, 128), jnp.float32), jnp.ones((128, 256), jnp.float32)
    compiled = jax.jit(f).lower(x, w).compile()
    ops = compiled_ops(compiled.as_text(), NAMES)
    assert {k for op in ops for k in op.kernels} == {kernels.Q_PROJ, kernels.SOFTMAX, kernels.AV}
    assert any(len(op.kernels) > 1 for op in ops)
    assert sum(op.cost.flops for op in ops) == compiled.cost_analysis()["flops"]


def test_param_kernel_reads_jit_argument_names():
    assert param_kernel("state['layers'][3]['mlp']['down'].value") == (3, kernels.DOWN)
    assert param_kernel("state[\\'layers\\'][0][\\'attn\\'][\\'q_proj\\'].value") == (
        0,
        kernels.Q_PROJ,
    )
    assert param_kernel("cache.k[1]") == (1, kernels.SCORES)
    assert param_kernel("cache.v[0]") == (0, kernels.AV)
    assert param_kernel("state['embed'].value") == (None, kernels.EMBED)
    assert param_kernel("state['embed'].value", is_product=True) == (None, kernels.LM_HEAD)
    assert param_kernel("tokens_B") is None
    assert UNNAMED not in kernels.REGISTRY  # an attribution failure is never a kernel name
