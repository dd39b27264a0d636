"""gradcodec as a codec of the storage libraries: numcodecs (:mod:`codec.storage.ncodec`,
``numcodecs.get_codec({"id": "gradcodec", "spec": "fp16"})``) and zarr 3
(:mod:`codec.storage.zarr3`, an array-to-bytes codec named ``gradcodec``).  Both are
registered through entry points (pyproject.toml: ``numcodecs.codecs``, ``zarr.codecs``), so
the libraries find them in a fresh process; each module imports its library, and nothing
here is imported by ``import codec``.  numcodecs and zarr are optional (``pip install -e
".[storage]"``).  docs/api.md, "numcodecs and zarr"."""
