"""Published accelerator measurements against kvjax's bounds, and predictions beside them.

`corpus`: the CSV columns (a public interface: one measurement a row, its source and shape);
`bounds`: kvjax's closed form for a row's exact shape and its bound on the row's chip;
`model`: an efficiency model per kernel class fitted on the corpus, its prediction intervals
and its leave-one-source-out error. Pure Python and numpy: a bound and a prediction are always
two numbers, never one number with a fudge factor inside the closed form.
"""
