"""Serving under load (issue 41): one scheduler (`scheduler`, pages in `pages`) and the clocks
behind it; the simulator's (`simulate`, step times from `step_time`'s closed form or from
`fitted`, a model fitted to the engine's measured steps) under a load (`load`). The engine, the
wall clock, is `kvjax.measured.engine`. Pure Python and numpy: no jax."""
