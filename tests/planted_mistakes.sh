#!/bin/bash
# Planted mistakes (issue 39): each edit below must make the named tests fail. The tree is
# restored after each (git checkout). Run from anywhere: bash tests/planted_mistakes.sh
cd "$(dirname "$0")/.."
run() {  # name, file, python replace old->new, tests
  name="$1"; file="$2"; old="$3"; new="$4"; shift 4
  python3 - "$file" "$old" "$new" <<'PY'
import sys
p, old, new = sys.argv[1:4]
s = open(p).read(); assert old in s, old; open(p, "w").write(s.replace(old, new, 1))
PY
  out=$(timeout 900 python3 -m pytest -q -x -p no:randomly "$@" 2>&1 | tail -1)
  git checkout -q -- "$file"
  echo "$name: $out"
}
run "matmul FLOPs off by one term (+m*n)" kvjax/analytic/primitives.py "flops=2 * m * k * n + (m * n if bias else 0)," "flops=2 * m * k * n + m * n + (m * n if bias else 0)," tests/test_analytic.py tests/test_traced_step.py
run "KV cache off by a layer" kvjax/analytic/sizes.py "    return per_position * held * batch + tensor_scale_bytes(cfg)" "    return per_position * (held - held // cfg.num_layers) * batch + tensor_scale_bytes(cfg)" tests/test_seed.py tests/test_analytic.py
run "causal mask off by one (the diagonal dropped)" kvjax/nn/attention.py "    mask_TS = jnp.tril(jnp.ones((T, T), jnp.bool_))" "    mask_TS = jnp.tril(jnp.ones((T, T), jnp.bool_), -1)" tests/test_nn.py tests/test_families.py
run "attention scale dropped" kvjax/model/config.py "        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5" "        return 1.0" tests/test_nn.py
