"""The traced view: XLA's cost analysis of the real Flax model, per kernel.

- `step`: one prefill, decode or extend step lowered from abstract shapes, attributed per kernel;
- `by_kind`: a model traced from one layer of each kind, extrapolated to all of them;
- `hlo`: HLO text parsed and costed per instruction by XLA's rules (the one HLO type sizing);
- `compiled`: the compiled module per instruction and per kernel;
- `sharded`: one device's compiled step of the tensor-parallel program;
- `sharded_program`: that program set up from abstract shapes, and its memory per device;
- `collectives`: the collectives read from the compiled HLO;
- `targets`: the accelerators compiled for without a device, described;
- `target_compile`: compiling for one of them on this host;
- `target_step`: a step compiled for a target, per kernel, beside the closed form;
- `target_costs`: that module's costs counted by kvjax, per kernel;
- `target_rules`: the instruction costs XLA's analysis lacks on an accelerator;
- `fusion_scopes`: the kernel each instruction inside a fusion computes;
- `fusion_split`: a fusion's costs split over those kernels.
"""
