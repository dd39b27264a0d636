"""The structure of a step's input (transport/allreduce.py): a dict or list of tensors as
(keys, arrays) and back, fused into buckets with ``bucket_bytes``, device tensors kept on the
device for a scheme with a device path (or copied to the host and back for one without),
and the caller's ``out=`` arrays checked against them."""

from __future__ import annotations

import numpy as np

from codec.arrays import as_float_array, is_torch, on_device, torch_view
from codec.errors import CodecTypeError, CodecValueError
from transport import device as devices

__all__ = ["Layout"]


class Layout:
    """A dict or list of tensors as (keys, arrays) and back; with ``bucket_bytes``, the
    tensors are sent as buckets (``sent``, ``sent_keys``): runs of consecutive tensors of one
    dtype concatenated flat up to that many bytes (a larger tensor is a bucket of its own,
    unchanged).  A bucket of several tensors is keyed ``"first..last"`` by its tensors' names.

    Device tensors (all of them or none) stay on the device when the scheme codes them there
    (``device_path``: ``Scheme.devices``); for a scheme without a device path they are
    copied to the host and their results copied back (``staged``)."""

    def __init__(self, tensors, bucket_bytes: int = 0, device_path: bool = False):
        if isinstance(tensors, dict):
            self.kind, self.keys = "dict", list(tensors)
            items = list(tensors.values())
        elif isinstance(tensors, (list, tuple)):
            self.kind, self.keys = type(tensors).__name__, list(range(len(tensors)))
            items = list(tensors)
        else:
            raise CodecTypeError(f"tensors: expected a dict of name -> array or a list of arrays, got {type(tensors).__name__}")
        self.devices = [on_device(x) for x in items]  # the codec's one device-array test
        if any(self.devices) and not all(self.devices):
            raise CodecTypeError("tensors: mixes device and host arrays; pass all of one kind")
        self.device = bool(items) and all(self.devices) and device_path
        self.staged = any(self.devices) and not device_path
        if self.device:
            from codec.device import as_device_array

            self.arrays = [as_device_array(x, f"tensors[{k!r}]") for k, x in zip(self.keys, items)]
        else:
            host = devices.host_copies(items) if self.staged else items
            self.arrays = [_plain(as_float_array(x, argname=f"tensors[{k!r}]")) for k, x in zip(self.keys, host)]
        self.groups = _buckets(self.arrays, bucket_bytes) if bucket_bytes else [[i] for i in range(len(self.arrays))]
        self.sent, self.sent_keys = [], []
        for g in self.groups:
            if len(g) == 1:
                self.sent.append(self.arrays[g[0]])
                self.sent_keys.append(self.keys[g[0]])
            else:
                self.sent.append(self._joined([self.arrays[i] for i in g]))
                self.sent_keys.append(f"{self.keys[g[0]]}..{self.keys[g[-1]]}")

    def _joined(self, arrays):
        """A bucket: its tensors concatenated flat (on the device for device tensors)."""
        if not self.device:
            return np.concatenate([a.reshape(-1) for a in arrays])
        from codec.device import concat, empty

        return concat([a.reshape(a.size) for a in arrays], empty(sum(a.size for a in arrays), arrays[0].dtype))

    def set_out(self, out) -> None:
        """Check ``out`` (None, or arrays with the inputs' structure, shapes and dtypes) and
        set ``targets``: per sent tensor, the caller's array its result is written into (None
        for a bucket of several tensors, whose result is copied into theirs by :meth:`rebuild`)."""
        self.out, self.targets = out, [None] * len(self.sent)
        if out is None:
            return
        if self.kind == "dict":
            if not isinstance(out, dict) or set(out) != set(self.keys):
                raise CodecValueError("out: expected a dict with exactly the tensors' names")
            outs = [out[k] for k in self.keys]
        else:
            if not isinstance(out, (list, tuple)) or len(out) != len(self.keys):
                raise CodecValueError(f"out: expected a list of {len(self.keys)} arrays, one per tensor")
            outs = list(out)
        for i, (k, a, o, dev) in enumerate(zip(self.keys, self.arrays, outs, self.devices)):
            where = f"out[{k!r}]"
            if self.device:
                if not on_device(o):
                    raise CodecTypeError(f"{where}: device tensors are reduced into device arrays, got {type(o).__name__}")
                from codec.device import as_device_array

                d = as_device_array(o, where, write=True)
                if tuple(d.shape) != tuple(a.shape) or np.dtype(d.dtype) != np.dtype(a.dtype):
                    raise CodecValueError(f"{where}: {np.dtype(d.dtype)}{list(d.shape)}, the tensor is {np.dtype(a.dtype)}{list(a.shape)}")
                continue
            if dev or on_device(o):
                raise CodecTypeError(f"{where}: out= takes host NumPy arrays here; {'device tensors of this scheme are returned as new device arrays' if dev else 'the tensors are host arrays'}")
            if is_torch(o):  # a CPU tensor: written through its NumPy view
                o = outs[i] = torch_view(o, where)
            if type(o) is not np.ndarray:
                raise CodecTypeError(f"{where}: expected a NumPy array, got {type(o).__name__}")
            if o.shape != a.shape or o.dtype != a.dtype:
                raise CodecValueError(f"{where}: {o.dtype}{list(o.shape)}, the tensor is {a.dtype}{list(a.shape)}")
            if not (o.flags.c_contiguous and o.flags.writeable and o.flags.aligned):
                raise CodecValueError(f"{where}: must be a writeable, aligned, C-contiguous array")
        if self.device:
            from codec.device import as_device_array

            outs = [as_device_array(o, "out", write=True) for o in outs]
        self.outs = outs
        for j, g in enumerate(self.groups):
            if len(g) == 1:
                self.targets[j] = outs[g[0]]

    def rebuild(self, sent):
        """The step's result in the input's structure: views of the sent results, or ``out``
        (a bucket's result copied into its tensors' arrays)."""
        if self.out is not None:
            for g, r in zip(self.groups, sent):
                if len(g) > 1:  # a bucket: its result is one array, copied into the callers'
                    at = 0
                    for i in g:
                        n = self.arrays[i].size
                        if self.device:
                            if n:
                                self.outs[i].reshape(n).copy_to_device(r[at : at + n])
                        else:
                            self.outs[i].reshape(-1)[...] = r[at : at + n]
                        at += n
            return self.out
        arrays = [None] * len(self.arrays)
        for g, r in zip(self.groups, sent):
            at = 0
            for i in g:  # views of the bucket's result
                a = self.arrays[i]
                arrays[i] = r if len(g) == 1 else r[at : at + a.size].reshape(a.shape)
                at += a.size
        if self.staged:
            from codec.device import to_device

            arrays = [to_device(a) for a in arrays]
        if self.kind == "dict":
            return dict(zip(self.keys, arrays))
        return arrays if self.kind == "list" else tuple(arrays)


def _plain(a: np.ndarray) -> np.ndarray:
    """A base-class, C-contiguous ndarray (an ``np.matrix`` or other subclass is viewed as one)."""
    if type(a) is not np.ndarray:
        a = a.view(np.ndarray)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _buckets(arrays, cap: int) -> list[list[int]]:
    """Indices of ``arrays`` grouped into runs of one dtype of at most ``cap`` bytes."""
    groups, size = [], 0
    for i, a in enumerate(arrays):
        if groups and a.dtype == arrays[groups[-1][-1]].dtype and size + a.nbytes <= cap:
            groups[-1].append(i)
            size += a.nbytes
        else:
            groups.append([i])
            size = a.nbytes
    return groups
