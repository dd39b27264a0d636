"""A PyTorch DDP communication hook for any gradcodec spec: :class:`GradcodecState` and
:func:`gradcodec_hook`.

    >>> state = GradcodecState(None, "topk(ratio=0.01)+fp16", model=model)  # doctest: +SKIP
    >>> ddp.register_comm_hook(state, gradcodec_hook)

``fp16`` and ``bf16`` alone are summed as they are: the bucket cast to that dtype (with
per-parameter error feedback of what the cast drops) and one ``all_reduce``, as PyTorch's
``fp16_compress_hook`` does.  Any other spec's bucket is reduced by a
:class:`transport.Allreducer` over the state's process group
(:class:`transport.torchdist.TorchComm`), so every scheme of the MPI transport comes along:
the allgather of one many-tensor frame a rank (any codec), the dense allreduce (``none``),
the gTop-k tree and the two-round PowerSGD.  Per-parameter semantics: the bucket's
gradients (``bucket.gradients()``) are the frame's tensors, each coded as ``encode`` codes
it alone (top-k's k per parameter), not the flat bucket as one tensor, unless the state says
``flat=True``.  Error-feedback memory is keyed by parameter (its name when the state knows the
model, else its place in the order the hook first met the parameters), so it survives DDP's
bucket rebuild after the first iteration.  The first ``start_iter`` iterations are plain
dense allreduces (a warm-up, as PyTorch's PowerSGD hook does).  The result is the average
over the ranks, written into the bucket's buffer, which the returned future holds.

Like ``PowerSGDState``, the state pickles without its process group (restored as the default
group) and with every rank's memory (the reducer's ``state_dict``): a checkpoint of model,
optimizer and state taken mid-run and restored in new processes continues with identical
results.  docs/pytorch.md.
"""

from __future__ import annotations

from codec.errors import CodecTypeError, CodecValueError

__all__ = ["GradcodecState", "gradcodec_hook"]


class GradcodecState:
    """What :func:`gradcodec_hook` keeps between calls.

    ``process_group``: a ``torch.distributed`` group (None: the default group); ``spec``: any
    gradcodec spec (``Allreducer`` picks its scheme); ``error_feedback``: keep per-parameter
    residuals; ``start_iter``: iterations of plain dense allreduce before compressing;
    ``flat``: code each bucket's flat buffer as one tensor (DDP's bucket semantics, as the
    ``fp16_compress_hook`` does) instead of per parameter; ``model``: the module DDP wraps,
    whose parameter names key the memory (optional: without it, parameters are keyed in the
    order the hook meets them)."""

    def __init__(self, process_group, spec: str, *, error_feedback: bool = True, start_iter: int = 0, flat: bool = False, model=None):
        import codec

        for name, v in (("error_feedback", error_feedback), ("flat", flat)):
            if not isinstance(v, bool):
                raise CodecTypeError(f"{name}: expected True or False, got {v!r}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise CodecValueError(f"start_iter: expected an int >= 0 (dense iterations before compressing), got {start_iter!r}")
        if not isinstance(spec, str):
            raise CodecTypeError(f"spec: expected a spec string, got {type(spec).__name__}")
        head = codec.parse_spec(spec)[0][0]  # (a malformed spec fails here)
        if flat and head == "powersgd":
            raise CodecValueError("flat: powersgd compresses each parameter as its own matrix; a flat bucket has no matrix shape (leave flat=False)")
        self.spec, self.process_group = spec, process_group
        #: "fp16" or "bf16" for a spec of that stage alone: the bucket is cast and summed by
        #: all_reduce in that dtype (as PyTorch's fp16_compress_hook), not framed
        self.summed = head if codec.parse_spec(spec) == [(head, {})] and head in ("fp16", "bf16") else None
        self.residuals: dict = {}  # the summed path's error feedback: key -> float32 residual (a slice of a bucket's flat one)
        self.flats: dict = {}  # the parameters' keys of a bucket -> that bucket's flat residual
        self.error_feedback, self.start_iter, self.flat = error_feedback, start_iter, flat
        self.iter = 0
        self.names = {} if model is None else {id(p): n for n, p in model.named_parameters()}
        self.seen: dict = {}  # id(param) -> key, without names: the order the hook met them
        self._reducer = None
        self._saved = None  # a restored reducer's state, loaded when the reducer is made
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and self.summed is None:
            self.spec = self.reducer.spec  # (made now: an unknown codec or option fails here, on every rank alike)

    # ------------------------------------------------------------------ the reducer
    @property
    def reducer(self):
        """The :class:`transport.Allreducer` of this state's group (made on first use, every
        rank the same; a restored state's memory loaded into it)."""
        if self._reducer is None:
            from transport.allreduce import Allreducer
            from transport.torchdist import TorchComm

            self._reducer = Allreducer(self.spec, TorchComm(self.process_group), error_feedback=self.error_feedback, average=True)
            if self._saved is not None:
                self._reducer.load_state_dict(self._saved)
                self._saved = None
        return self._reducer

    def key(self, param) -> str:
        """The memory key of ``param``: its name, or ``"param<i>"`` in the order first met."""
        name = self.names.get(id(param))
        if name is not None:
            return name
        return self.seen.setdefault(id(param), f"param{len(self.seen)}")

    # ------------------------------------------------------------------ checkpoints
    def __getstate__(self):
        """Everything but the process group and the objects' identities: the options, the
        iteration, the keys in the order met and the reducer's memory (its ``state_dict``)."""
        reducer = self._reducer.state_dict() if self._reducer is not None else self._saved
        return {"spec": self.spec, "error_feedback": self.error_feedback, "start_iter": self.start_iter, "flat": self.flat,
                "iter": self.iter, "keys_met": len(self.seen), "reducer": reducer,
                "residuals": {k: v.cpu().numpy().copy() for k, v in self.residuals.items()}}

    def __setstate__(self, state):
        """Restore :meth:`__getstate__`'s dict; the process group becomes the default group
        (set ``process_group`` after loading for another), the names are given again by
        :meth:`bind` (a restored state keys unnamed parameters in the order met again)."""
        self.__init__(None, state["spec"], error_feedback=state["error_feedback"], start_iter=state["start_iter"], flat=state["flat"])
        self.iter = state["iter"]
        if state.get("residuals"):
            import torch

            self.residuals = {k: torch.from_numpy(v) for k, v in state["residuals"].items()}
        if state["reducer"] is not None and self._reducer is not None:  # (made already: a process group is up)
            self._reducer.load_state_dict(state["reducer"])
        else:
            self._saved = state["reducer"]

    def bind(self, model) -> "GradcodecState":
        """Key the memory by ``model``'s parameter names (after unpickling; returns self)."""
        self.names = {id(p): n for n, p in model.named_parameters()}
        return self


def gradcodec_hook(state: GradcodecState, bucket):
    """The DDP communication hook: ``ddp.register_comm_hook(state, gradcodec_hook)``.
    Returns a completed future holding the bucket's buffer, averaged over the ranks (dense
    during the first ``state.start_iter`` iterations)."""
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    if state.iter < state.start_iter:
        group = state.process_group
        size = dist.get_world_size(group)
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
        _advance(state, bucket)
        return fut.then(lambda f: f.value()[0].div_(size))
    if state.summed is not None:
        return _summed(state, bucket)
    params = bucket.parameters()
    if state.flat:
        tensors = {"..".join((state.key(params[0]), state.key(params[-1]))): buf}
    else:
        tensors = {state.key(p): g for p, g in zip(params, bucket.gradients())}
    state.reducer.reduce(tensors, out=tensors)  # (the gradients are views of the buffer: written in place)
    _advance(state, bucket)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _summed(state, bucket):
    """``fp16`` / ``bf16`` alone: the bucket (plus its residual, with error feedback) cast to
    the 16-bit dtype and divided by the world size there, summed by one ``all_reduce`` in
    that dtype and cast back into the buffer: PyTorch's ``fp16_compress_hook`` /
    ``bf16_compress_hook``, with per-parameter error feedback (the residual is what the cast
    dropped, in float32).  A cast is elementwise, so the bucket is cast whole: three passes
    over it with error feedback (add the residual, cast, subtract the codes), one without."""
    import torch
    import torch.distributed as dist

    half = torch.float16 if state.summed == "fp16" else torch.bfloat16
    group = state.process_group
    size = dist.get_world_size(group)
    buf = bucket.buffer()
    if state.error_feedback:
        r = _residual(state, bucket)
        r.add_(buf)  # (residual + gradient, in float32)
        codes = r.to(half)
        r.sub_(codes)  # what the cast dropped
    else:
        codes = buf.to(half)
    codes.div_(size)
    fut = dist.all_reduce(codes, group=group, async_op=True).get_future()
    _advance(state, bucket)

    def back(f):
        buf.copy_(f.value()[0])
        return buf

    return fut.then(back)


def _residual(state, bucket):
    """The bucket's residual: one flat float32 tensor on the bucket's device, laid out as the
    bucket, whose slices are ``state.residuals[key]`` of its parameters.  Made when a bucket
    of these parameters is first met (DDP rebuilds its buckets after the first iteration):
    each parameter's residual so far (from an earlier bucket, or a restored checkpoint) is
    copied into its slice."""
    import torch

    keys = tuple(state.key(p) for p in bucket.parameters())
    flat = state.flats.get(keys)
    if flat is not None:
        return flat
    buf = bucket.buffer()
    flat = torch.zeros(buf.numel(), dtype=torch.float32, device=buf.device)
    at = 0
    for key, g in zip(keys, bucket.gradients()):
        n = g.numel()
        old = state.residuals.get(key)
        if old is not None and old.numel() == n:
            flat[at : at + n].copy_(old.reshape(-1))
        state.residuals[key] = flat[at : at + n]
        at += n
    mine = set(keys)
    state.flats = {k: v for k, v in state.flats.items() if mine.isdisjoint(k)}  # (a rebuilt bucket's old residual: gone)
    state.flats[keys] = flat
    return flat


def _advance(state, bucket) -> None:
    """One iteration more once DDP's last bucket of the step has been reduced."""
    if bucket.is_last():
        state.iter += 1
