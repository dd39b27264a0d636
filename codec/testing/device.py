"""The device conformance check: a codec's CUDA path against its host path, byte for byte
(or within the documented tolerance of a stage that rounds otherwise on the device).

Needs Numba's CUDA target (``numba-cuda``): a GPU, or the simulator chosen before
``numba.cuda`` is first imported (``NUMBA_ENABLE_CUDASIM=1``), which is why
:func:`codec.testing.check_codec` does not call it.
"""

from __future__ import annotations

import numpy as np

from codec.errors import CodecValueError
import codec as _codec
from codec.device import DTYPES
from codec.testing.arrays import diff_msg

__all__ = ["check_device", "device_tolerance"]



def check_device(codec, arr: np.ndarray, steps: int = 2) -> bool:
    """``arr`` (float16, float32 or float64) through a device array gives what it gives on the host:
    the same frame byte for byte (``encode``, with and without ``out=``), also written on the
    device (``out=`` a device buffer of ``max_frame_bytes``, from the device array and from
    the host one); the same
    array from ``decode(out=)``, ``decode(like=)`` and ``decode_add`` into device arrays, and
    from the host frame held on the device (decoded to the host, into a device array,
    ``decode_add``); and under ``ErrorFeedback`` the same frames and residuals step by step
    (odd steps write a device frame, which the step reads back), the residual on the device.
    A codec with a stage whose device frames are not the host's (:func:`device_tolerance`:
    the fft stage) is held to its tolerance instead: device frames decode within it of the
    host's, decodes into device arrays and residuals likewise.  A codec with a stage that has no CUDA path must refuse the device array with a TypeError
    naming ``x``.  Values compare bit for bit, except that a NaN produced by arithmetic may
    carry another payload (docs/kernels.md, determinism).  Returns whether the codec took the
    device array (False: it refused it as it should); arrays of other dtypes are refused
    with a ValueError, as they cannot be device arrays."""
    from numba import cuda

    c = _codec.get_codec(codec)
    arr = np.asarray(arr)
    if arr.dtype not in DTYPES:
        raise CodecValueError(f"arr: device arrays are float16, float32 or float64, got {arr.dtype}")
    d = cuda.to_device(arr)
    try:
        frame = c.encode(d)
    except TypeError as e:
        assert "x:" in str(e) and "CUDA" in str(e), f"{c}: a device array was refused without naming x and CUDA: {e}"
        return False
    tol = device_tolerance(c)
    check = _check if tol is None else _close(tol, arr)
    host = c.encode(arr)
    if tol is None:
        assert bytes(frame) == bytes(host), f"{c}: the frame of a device array differs from the host's"
    else:
        check(c.decode(frame), c.decode(host), f"{c}: the frame of a device array")
    buf = np.zeros(len(frame) + 3, np.uint8)
    assert bytes(c.encode(d, out=buf)) == bytes(frame), f"{c}: encode(device array, out=) gave another frame"
    dbuf = cuda.device_array(c.max_frame_bytes(d), np.uint8)  # (allocated from the bound, read off the device array)
    dframe = c.encode(d, out=dbuf)
    assert len(dframe) == len(frame) and bytes(dframe.copy_to_host()) == bytes(frame), f"{c}: a device frame differs from the host frame of the device array"
    assert bytes(c.encode(arr, out=dbuf).copy_to_host()) == bytes(host), f"{c}: a host array's device frame differs from its host frame"
    want = c.decode(host)
    held = cuda.to_device(np.frombuffer(host, np.uint8))  # the host's frame, held on the device
    check(c.decode(held), want, f"{c}: decode of a device frame")
    out = cuda.device_array(arr.shape, arr.dtype)
    c.decode(held, out=out)
    check(out.copy_to_host(), want, f"{c}: decode of a device frame into a device array")
    out = cuda.device_array(arr.shape, arr.dtype)
    assert c.decode(host, out=out) is out, f"{c}: decode(out=device array) must return out"
    check(out.copy_to_host(), want, f"{c}: decode into a device array")
    like = _codec.decode(host, like=d)
    check(like.copy_to_host(), want, f"{c}: decode(like=device array)")
    base = np.random.default_rng(7).standard_normal(arr.shape).astype(arr.dtype)
    acc = cuda.to_device(base)
    c.decode_add(host, acc, subtract=True)
    check(acc.copy_to_host(), c.decode_add(host, base.copy(), subtract=True), f"{c}: decode_add into a device array", base)
    c.decode_add(held, acc)
    check(acc.copy_to_host(), c.decode_add(host, c.decode_add(host, base.copy(), subtract=True)), f"{c}: decode_add of a device frame", base)
    on_dev, on_host = _codec.ErrorFeedback(c), _codec.ErrorFeedback(c)
    for step in range(steps):
        x = (arr * (1 + 0.25 * step)).astype(arr.dtype)
        f_dev, f_host = on_dev.encode(cuda.to_device(x), key="t", out=(lambda size: cuda.device_array(size, np.uint8)) if step % 2 else None), on_host.encode(x, key="t")
        if step % 2:  # odd steps write a device frame (the step reads it back to subtract it)
            f_dev = f_dev.copy_to_host()
        if tol is None:
            assert bytes(f_dev) == bytes(f_host), f"{c}: error feedback step {step}: the device frame differs"
        else:
            check(c.decode(f_dev), c.decode(f_host), f"{c}: error feedback step {step}: the device frame")
        r = on_dev.residual("t")
        assert not isinstance(r, np.ndarray), f"{c}: the residual of a device gradient is not on the device"
        check(r.copy_to_host(), on_host.residual("t"), f"{c}: error feedback step {step}: the residual")
    return True


def device_tolerance(codec) -> float | None:
    """None when ``codec``'s device frames are the host's byte for byte; else the largest
    ``device_tolerance`` of its stages (:attr:`codec.stage.Stage.device_tolerance`)."""
    tols = [s.device_tolerance for s in _codec.get_codec(codec).stages if s.device_tolerance is not None]
    return max(tols) if tols else None


def _close(tol: float, arr: np.ndarray):
    """The check of a codec with a device tolerance: ``||got - want||_2 <= tol * ||arr||_2``
    (float64 norms; NaN and inf where both have them), the same arrays' shapes and dtypes;
    ``base``: what a ``decode_add`` added to, its norm added to the scale (a sum rounded to
    a 16-bit dtype may round either way)."""
    norm = lambda a: float(np.linalg.norm(np.asarray(a, np.float64).reshape(-1)))  # noqa: E731

    def check(got, want, what: str, base=None) -> None:
        scale = norm(arr) + (0.0 if base is None else norm(base))
        assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
        g, w = np.asarray(got, np.float64).reshape(-1), np.asarray(want, np.float64).reshape(-1)
        odd = ~np.isfinite(w)
        assert np.array_equal(g[odd], w[odd], equal_nan=True), f"{what}: NaN/inf differ"
        err = float(np.linalg.norm(g[~odd] - w[~odd]))
        assert err <= tol * scale, f"{what}: {err:.3g} from the host's, above {tol:.3g} x ||x|| = {tol * scale:.3g}"

    return check


def _check(got, want, what: str, base=None) -> None:
    msg = diff_msg(got, want, what)
    assert msg is None, msg
