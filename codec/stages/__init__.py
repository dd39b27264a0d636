"""Every stage gradcodec ships, one folder per kind (the contract of each kind is in
:mod:`codec.stage`)::

    transform/   fft, powersgd                  maps the array into another domain and back
    select/      topk, gaussiank, dgc, threshold, randomk, adacomp
                                                which elements a frame carries
    value/       none, fp16, bf16, rangefloat, fp8, qsgd, minmax, terngrad, sign, efsign, onebit
                                                how the kept values are coded
    bytes/       zstd, crc32                    acts on the stored bytes

Importing this package registers them all (``import codec`` does); no stage module imports
Numba or a kernel backend at module level.
"""

from codec.stages import bytes, select, transform, value  # noqa: F401  (register every stage)
