"""The traced view: XLA's cost analysis of the real Flax model, per kernel.

- `step`: one prefill or decode step lowered from abstract shapes, attributed per kernel;
- `hlo`: HLO text parsed and costed per instruction by XLA's rules (the one HLO type sizing);
- `sharded`: one device's compiled step of the tensor-parallel program; `collectives`: its
  collectives read from the compiled HLO.
"""
