"""Select stages (sparsifiers): which elements a frame carries.

``magnitude`` holds what the magnitude sparsifiers share (the one-pass candidate search,
exact top-k over the candidates, the index coder); one module per codec: ``topk``,
``gaussiank``, ``dgc``, ``threshold``, ``randomk``, ``adacomp``.
"""

from codec.stages.select import adacomp, dgc, gaussiank, randomk, threshold, topk  # noqa: F401  (register)
