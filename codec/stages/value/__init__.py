"""Value stages: how kept values are coded.

``floats``: ``none`` (exact), ``fp16``, ``bf16``.  The quantizers share ``quantizer``
(:class:`~codec.stages.value.quantizer.Quantizer`: kernel encode, one table-driven decode):
``minifloat`` (``rangefloat``, ``fp8``), ``qsgd``, ``minmax``, ``terngrad``, ``signs``
(``sign``, ``efsign``, ``onebit``).  Each is a dense codec on its own and a value stage after
a select stage.
"""

from codec.stages.value import floats, minifloat, minmax, qsgd, signs, terngrad  # noqa: F401  (register)
