"""Serving under load (issue 41): one scheduler (`scheduler`, pages in `pages`) and the clocks
behind it; the simulator's (`simulate`, step times from `step_time`) under a load (`load`).
Pure Python and numpy: no jax."""
