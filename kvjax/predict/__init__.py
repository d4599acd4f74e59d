"""Published accelerator measurements against kvjax's bounds, and predictions beside them. A
bound and a prediction are always two numbers, never one number with a fudge factor inside the
closed form. Pure Python and numpy. Its modules:

    corpus       the CSV columns (a public interface: one measurement a row, its source, shape)
    bounds       kvjax's closed form for a row's exact shape, and its bound on the row's chip
    model        an efficiency model per kernel class, fitted on the corpus
    heldout      the nested held-out interval and the held-out summary, for every prediction
    validate     every corpus row against its bound, the classes fitted and held out by group
    groups       the serving implementation behind a row (held out by the code that ran)
    steps        a whole step predicted from its kernels, with a fixed time per layer
    collectives  tensor-parallel all-reduces as engines reach them (sourced constants)
    apply        predictions beside the bounds for any model, step and chip (`calc --predict`)
"""
