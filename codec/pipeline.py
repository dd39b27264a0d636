"""``Codec``: a pipeline of stages named by a spec string, with the numcodecs-shaped API.

    encode:  array -> [transform | select] -> value -> sections -> [bytes] -> frame
    decode:  frame -> validate header -> sections -> value -> [scatter | inverse] -> array

Decoding always takes its parameters from the frame (``codec.decode(frame)`` needs nothing
else); ``Codec.decode`` additionally checks that the frame was made by the same pipeline.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from codec import spec as specmod
from codec import device, many, manydecode, replay
from codec.assembly import arrange, default_value, non_default
from codec.dtypes import as_float_array, checked_out, host_like, on_device, readonly
from codec.errors import CodecError, CodecTypeError, CodecValueError, CorruptFrameError, UnknownCodecError
from codec.frame import DEFAULT_CHECKSUM, build_frame, parse_frame
from codec.framebuffer import frame_out
from codec.manyframe import build_many, parse_many
from codec.modes import ADD, SET, SUB
from codec.stage import KINDS, Context, check_step, lookup
from codec.device import as_input
from codec.ops import scatter_checked, store, WIDE, wide_dtype
from codec.payloadcheck import reading


class Codec:
    """A gradient codec.  Build one with :func:`codec.get_codec` (or ``Codec(spec)``).

    ``encode(x)`` returns a self-describing frame (``bytes``); ``decode(frame)`` returns a new
    array of the original dtype and shape; ``decode(frame, out=y)`` fills ``y``;
    ``decode_add(frame, out=acc)`` adds the decoded array into ``acc``.

    Every frame carries a CRC-32C of its payload (the header has its own CRC32), checked
    before decoding; ``checksum=False`` leaves it out, for transports that already guarantee
    integrity (MPI).  Decoders accept frames with or without it.  A ``crc32`` stage in the
    spec writes its zlib CRC32 instead, either way.
    """

    def __init__(self, spec, *, checksum: bool = True):
        if not isinstance(checksum, bool):
            raise CodecTypeError(f"checksum: expected True or False, got {checksum!r}")
        stages = [lookup(name)(**params) for name, params in specmod.parse(spec)] if isinstance(spec, str) else list(spec)
        self.stages = arrange(stages, spec if isinstance(spec, str) else None)
        by_kind = {k: [s for s in self.stages if s.kind == k] for k in KINDS}
        self.transform = by_kind["transform"][0] if by_kind["transform"] else None
        self.select = by_kind["select"][0] if by_kind["select"] else None
        self.value = by_kind["value"][0]
        self.post = tuple(by_kind["bytes"])
        self.checksum = checksum
        self._frame_options = {"checksum": DEFAULT_CHECKSUM if checksum else None}
        for s in self.post:  # a crc32 stage names its own checksum, with or without the default
            self._frame_options.update(s.frame_options())
        chooser = self.select or self.transform
        self._implicit_value = chooser is not None and self.value == default_value(chooser)
        self.spec = specmod.format_spec(
            (s.name, non_default(s)) for s in self.stages if not (s is self.value and self._implicit_value)
        )
        self.codec_id = "+".join(s.name for s in self.stages)

    # ---------------------------------------------------------------- properties
    @property
    def lossless(self) -> bool:
        """True when decode(encode(x)) reproduces x bit for bit (NaN and inf included)."""
        return all(s.lossless for s in self.stages)

    def passes_nonfinite(self, shape) -> bool:
        """Whether encoding an array of ``shape`` holding NaN/inf sends it rather than raising
        ValueError: when every stage passes it (:meth:`codec.stage.Stage.passes_nonfinite`:
        lossless stages and ``nonfinite=keep``; powersgd only for tensors it passes through)."""
        return all(s.passes_nonfinite(tuple(shape)) for s in self.stages)

    # ---------------------------------------------------------------- encode
    def encode(self, x, *, dtype=None, key=None, step: int = 0, out=None) -> bytes:
        """Encode ``x`` (any float array-like; ``dtype`` reinterprets raw buffers) into a frame.

        ``key`` and ``step`` pick the random stream of stochastic stages (and the step of
        scheduled parameters): the same ``(x, key, step)`` always gives the same frame.
        ``ErrorFeedback`` passes its key and the key's step count.

        ``out``: a writable buffer (bytearray, uint8 array) to write the frame into, from its
        start, instead of a new ``bytes``; the result is then a memoryview of exactly the
        frame's bytes in ``out``, valid until ``out`` is written again.  A training loop that
        reuses one buffer saves the page faults of a fresh frame every step (about 1.7 ms for
        the 50 MB of 25M fp16 values).  ValueError naming ``out`` when the frame does not fit
        (nothing is written) or the buffer overlaps ``x``.  ``out`` may also be a callable
        ``size -> buffer``, asked once for the frame's exact size (a pool of buffers)."""
        arr = self.input(x, dtype)
        dest = frame_out(out, (arr,))
        return self.encode_with(arr, Context(tuple(arr.shape), np.dtype(arr.dtype), key=key, step=check_step(step)), out=dest)

    def input(self, x, dtype=None, argname: str = "x"):
        """``x`` as the stages take it: a C-contiguous NumPy array (:func:`as_float_array`), or a
        device array viewed as it is once every stage is checked to take one
        (:func:`codec.device.as_input`)."""
        if not on_device(x):
            return as_float_array(x, dtype, argname)

        return as_input(self.stages, x, dtype, argname)

    def max_frame_bytes(self, x, *, dtype=None, step: int = 0) -> int:
        """The most bytes :meth:`encode` can write for an array of ``x``'s shape and dtype at
        ``step``, whatever its values: allocate an ``out=`` buffer (host or device) once from
        it and reuse it every step.  ``x`` is read for its shape and dtype only (an array, a
        device array, or what :meth:`encode` takes with ``dtype``).  Exact for the dense
        codecs; for a sparsifier whose count depends on the data (threshold, DGC) it allows
        every element.  A scheduled parameter (a ratio that decays) changes it with ``step``.
        :mod:`codec.bounds` says how it is formed."""
        from codec.bounds import described, frame_bound

        shape, dt = described(x, dtype)
        return frame_bound(self, shape, dt, step)

    def max_frame_bytes_many(self, tensors, *, step: int = 0, layout: str = "table", joint: bool = False, skip_missing: bool = False) -> int:
        """The most bytes :meth:`encode_many` can write for ``tensors`` (a dict name -> array,
        pairs or a list of arrays, read for their shapes and dtypes only, or a
        :class:`codec.manyframe.Layout`) with the same ``step``, ``layout``, ``joint`` and
        ``skip_missing``;
        as :meth:`max_frame_bytes`."""
        from codec.bounds import described_many, many_bound

        return many_bound(self, described_many(tensors, skip_missing=skip_missing), step, layout, joint)

    # ---------------------------------------------------------------- pipeline primitives
    # What encode and decode are made of, for codec.feedback.ErrorFeedback (which owns the
    # error-feedback step) and for callers holding a Context (per-key stage state).  ``arr``
    # and ``flat`` are what :meth:`input` gives: plain C-contiguous base ndarrays, or device arrays.

    def encode_with(self, arr: np.ndarray, ctx: Context, *, out=None) -> bytes:
        """The frame of ``arr`` with an explicit :class:`~codec.stage.Context` (key, step and
        the per-key ``state`` stages may keep, as PowerSGD's Q); ``out`` as for :meth:`frame`."""
        return self.frame(self.sections(arr.reshape(-1), ctx), arr.dtype, arr.shape, out=out)

    def sections(self, flat: np.ndarray, ctx: Context, *, residual=None, out=None) -> list:
        """Run the stages on ``flat``: transform or select, then value; returns the sections.

        ``residual``/``out`` (a select stage with ``fuses_feedback`` only): select from
        ``acc = flat + residual``, written into ``out`` in the selection pass.  Sets
        ``ctx.positions`` to the sent positions when a select stage ran.  The stages get
        ``flat`` read-only, whoever made it (a caller's array, error feedback's sum): a kernel
        compiles one signature per dtype, not one per dtype and writability."""
        flat = readonly(flat)
        sections: list = []
        values, vctx = flat, ctx
        if self.transform is not None:
            values = self.transform.forward(flat, ctx, sections)
            vctx = ctx.domain(values.size, values.dtype)
        elif self.select is not None:
            if residual is not None and not self.select.fuses_feedback:
                raise CodecValueError(f"residual: {self.select.name} does not fuse error feedback into its selection")
            return self.selected(ctx, *self.select.select(flat, ctx, sections, residual=residual, out=out), sections)
        self.value.encode(values, vctx, sections)
        return sections

    def selected(self, ctx: Context, positions, values, sections: list) -> list:
        """The rest of :meth:`sections` after a select stage chose ``positions`` and their
        ``values`` (alone, or for a tensor of a many-tensor run: ``select_segments``): both
        recorded on ``ctx``, the values coded after ``sections``."""
        ctx.positions, ctx.kept = positions, values
        self.value.encode(values, ctx, sections)
        return sections

    def frame(self, sections: list, dtype, shape, *, out=None) -> bytes:
        """The frame holding ``sections`` for an array of ``dtype`` and ``shape``, with this
        codec's spec, checksum and byte stages; ``out`` (a uint8 array from
        :func:`codec.framebuffer.frame_out`): written there, a memoryview of it returned."""
        return build_frame(self.spec, dtype, shape, sections, out=out, **self._frame_options)

    def frame_many(self, sections: list, layout, form: str = "table", *, pieces=None, joint: bool = False, out=None) -> bytes:
        """The many-tensor frame (format v2, :mod:`codec.manyframe`) holding ``sections[i]``
        for tensor i of ``layout`` (``joint``: ``[sections]`` of their concatenation);
        ``form`` "table" or "hash"; ``pieces`` as for :func:`codec.manyframe.build_many`;
        ``out`` as for :meth:`frame`."""
        return build_many(self.spec, layout, sections, form=form, pieces=pieces, joint=joint, out=out, **self._frame_options)

    def subtract(self, fr, flat: np.ndarray) -> None:
        """``flat -= decode(fr)`` in place, rounded once (a sparse frame touches only its
        positions); ``fr`` is a parsed frame (:func:`codec.frame.parse_frame`, or a tensor of
        a many-tensor frame) that this codec made."""
        ctx, payload = self._read(fr, device=on_device(flat))  # (a device frame's codes, positions and values read there)
        self._write(ctx, payload, flat, SUB)

    # ---------------------------------------------------------------- many tensors
    def encode_many(self, tensors, *, keys=None, step: int = 0, layout: str = "table", joint: bool = False, out=None, skip_missing: bool = False) -> bytes:
        """One frame (format v2) holding every tensor of ``tensors``: a dict name -> array or
        any iterable of ``(name, array)`` pairs (the names are kept, and decoding gives a dict
        back: ``((n, p.grad) for n, p in model.named_parameters())``), or a sequence of
        arrays.  ``skip_missing=True`` leaves out the tensors that are None (parameters
        without a gradient); else a None is a TypeError naming it.

        Each tensor is coded exactly as :meth:`encode` would code it alone (top-k's k, a
        quantizer's buckets, PowerSGD's matrices and the random streams are per tensor):
        ``keys`` (one per tensor; default None for all) and ``step`` are what ``encode``
        takes.  ``layout="hash"`` writes the layout's 8-byte hash instead of its table, for
        peers that agreed on it; decoding such a frame needs ``layout=``.

        ``joint=True`` is the whole-model variant, as DDP's buckets do it: the tensors (all of
        one dtype) are coded as ONE, their flat concatenation in order, so top-k keeps the
        model's k largest magnitudes and a quantizer's buckets run across tensors; ``keys``
        is then the one key of the concatenation.  The frame still records every tensor,
        and decodes to them.  How the work runs: :mod:`codec.many`.

        ``out``: a buffer to write the frame into, as for :meth:`encode`."""
        return many.encode(self, tensors, keys=keys, step=step, layout=layout, joint=joint, out=out, skip_missing=skip_missing)

    @property
    def elementwise(self) -> bool:
        """A value stage alone whose codes are elementwise (:attr:`codec.stage.Value.elementwise`)."""
        return self.transform is None and self.select is None and self.value.elementwise

    def decode_many(self, frame, out=None, *, layout=None, max_elements=None, like=None):
        """:func:`codec.decode_many`, checking that the frame was made by this codec."""
        parsed = lambda: (self, self._same(parse_many(frame, layout=layout, max_elements=max_elements, verify_payload="defer")))  # noqa: E731
        return replay.decode_many(frame, out, parsed, codec=self, layout=layout, max_elements=max_elements, like=like)

    def decode_sparse_many(self, frame, *, layout=None, max_elements=None) -> list:
        """:func:`codec.decode_sparse_many`, checking that the frame was made by this codec."""
        return manydecode.decode_sparse(self, self._same(parse_many(frame, layout=layout, max_elements=max_elements)))

    def decode_add_many(self, frame, out, *, layout=None, subtract: bool = False):
        """:func:`codec.decode_add_many`, checking that the frame was made by this codec."""
        return manydecode.decode_add(self, self._same(parse_many(frame, layout=layout)), out, subtract)

    # ---------------------------------------------------------------- decode
    def decode(self, frame, out=None, *, max_elements=None, like=None):
        """Decode ``frame`` into a new array (or into ``out``, which must match size and dtype:
        a NumPy array, a CPU or CUDA torch tensor, any device array); ``like`` a device array:
        the new array is on the device, of ``like``'s kind; a CPU torch tensor: a new CPU
        tensor (:func:`codec.decode`)."""
        return self.decode_frame(self._same(parse_frame(frame, max_elements=max_elements, verify_payload="defer")), out, like=like)

    def decode_add(self, frame, out, *, subtract: bool = False):
        """``out += decoded`` (``-=`` with ``subtract=True``) without a dense temporary for sparse codecs.

        ``out`` must be a NumPy array with the frame's element count and any supported float
        dtype (writeable, C-contiguous); returns ``out``.
        """
        return self.decode_add_frame(self._same(parse_frame(frame)), out, subtract)

    def decode_sparse(self, frame):
        """:func:`codec.decode_sparse`, checking that the frame was made by this codec."""
        return self.decode_sparse_frame(self._same(parse_frame(frame)))

    # the same on a parsed frame (:func:`codec.frame.parse_frame`, or one tensor of a many-tensor
    # frame) that this codec reads: what codec.decode does once the frame named its codec
    def decode_frame(self, fr, out=None, *, like=None):
        """Decode the parsed frame ``fr`` into a new array (on the device of ``like`` when it is
        a device array), or into ``out``; a payload check ``fr`` carries (``fr.check``) is
        completed in the same pass where the stages can (:meth:`payload_check`)."""
        on_dev = out is None and on_device(like)
        if on_dev:
            device.check_stages(self.stages, "like")
            device.check_dtype(fr.dtype, "like")
        target = None if out is None else self._out(out, fr, add=False)  # a wrong out: refused first
        check = self.payload_check(fr.check, on_dev or on_device(target))
        with reading(check):  # every section checked before the dense output is allocated (the codes' range: in the pass that checks the payload)
            ctx, payload = self._read(fr, device=on_dev or on_device(target), in_pass=check is not None)
        if target is None:
            target = device.empty(fr.n, fr.dtype) if on_dev else np.empty(fr.n, fr.dtype)
        self._write(ctx, payload, target, SET, check)
        if check is not None:
            check.verify((target,) if out is not None else ())  # a caller's out: NaN when the frame is damaged
        if out is not None:
            return out
        return device.as_like(target.reshape(fr.shape), like) if on_dev else host_like(target.reshape(fr.shape), like)

    def decode_add_frame(self, fr, out, subtract: bool = False):
        """``out += decode(fr)`` (``-=`` with ``subtract``), returning ``out``."""
        target = self._out(out, fr, add=True)
        ctx, payload = self._read(fr, device=on_device(target))
        self._write(ctx, payload, target, SUB if subtract else ADD)
        return out

    def _out(self, out, fr, *, add: bool):
        """The flat array decoding ``fr`` writes: ``out`` checked (:func:`checked_out`), or for a
        device array its device view (:func:`codec.device.checked_out`)."""
        if not on_device(out):
            return checked_out(out, fr.n, fr.shape, fr.dtype, add=add)

        device.check_stages(self.stages, "out")
        return device.checked_out(out, fr.n, fr.shape, fr.dtype, add=add)

    def decode_sparse_frame(self, fr):
        """``(positions, values)`` of the parsed sparse frame ``fr``."""
        if self.select is None:
            raise CodecValueError(f"frame: {fr.spec!r} has no select stage, so the frame is not sparse; use codec.decode")
        ctx, payload = self._read(fr)
        return ctx.positions, self._kept(ctx, payload)

    def payload_check(self, check, device: bool = False):
        """``check`` (a parsed frame's :class:`codec.payloadcheck.PayloadCheck`, or None) when
        decoding with this codec completes it in its own pass over the payload (a value stage
        that :attr:`~codec.stage.Value.checks_payload` alone, with no byte stage, into host
        arrays); otherwise it is verified now, before anything is read (None is returned)."""
        if check is None or (self.value.checks_payload and self.select is None and self.transform is None and not self.post and not device):
            return check
        check.verify()
        return None

    def _same(self, fr):
        """``fr`` (a parsed frame, v1 or v2), after checking this codec made it."""
        if "+".join(s.name for s in codec_of(fr).stages) != self.codec_id:
            raise CodecError(f"frame was encoded by {fr.spec!r}, not by this codec ({self.spec!r}); use codec.decode(frame)")
        return fr

    def _read(self, fr, positions=None, device=False, in_pass=False):
        """Phase 1 of decoding: check every section against what the stages expect and read
        the compact payload (positions, codes).  Nothing of the dense output size is
        allocated here, so a forged frame fails before any large allocation.  ``positions``:
        the frame's positions already read and checked (a many-tensor frame reads them all at
        once: :meth:`codec.stage.Select.positions_segments`); ``device``: the output is a
        device array (``Context.device``: the positions may be read there); ``in_pass``: the
        payload check is completed as the value stage writes (``Context.checked_in_pass``)."""
        ctx = Context(fr.shape, fr.dtype, device=device, value=self.value, checked_in_pass=in_pass)
        rd = fr.reader()
        if self.transform is not None:
            tpay, vctx = self.transform.read(rd, ctx)
            payload = (tpay, vctx, self.value.read(rd, vctx, vctx.n))
        else:
            if self.select is not None:
                # known= only from positions_segments: a stage without it keeps positions(reader, ctx)
                ctx.positions = self.select.positions(rd, ctx) if positions is None else self.select.positions(rd, ctx, known=positions)
            payload = self.value.read(rd, ctx, fr.n if ctx.positions is None else ctx.positions.size)
        rd.done()
        return ctx, payload

    def _write(self, ctx, payload, out: np.ndarray, mode: int, check=None) -> None:
        """Phase 2: write the decoded array into flat ``out`` (store, add or subtract per
        ``mode``); ``check``: the frame's payload check the value stage notes its codes in
        (:meth:`payload_check` gave it)."""
        if self.transform is not None:  # coefficients in the domain's dtype, where out lives (the codes cross, not the values), then the inverse
            from codec.device import Memory

            tpay, vctx, vpay = payload
            values = Memory(on_device(out)).empty(vctx.n, self.transform.domain_dtype(vctx.dtype))
            self.value.write(vpay, values, SET)
            self.transform.inverse(tpay, values, out, mode)
        elif out.dtype not in WIDE:  # kernels work on float32/float64; 16-bit outputs go through one
            from codec.device import Memory

            wide = Memory(on_device(out)).empty(out.size, wide_dtype(ctx.dtype))  # the decoded values exactly, where out lives: rounded once, in store
            self._write(ctx, payload, wide, SET, check)
            store(wide, out, mode)
        elif check is not None:
            self.value.write(payload, out, mode, check=check)
        elif self.select is None:
            self.value.write(payload, out, mode)
        else:
            scatter_checked(self._kept(ctx, payload), ctx.positions, out.reshape(-1), mode)  # positions() checked them

    def _kept(self, ctx, payload) -> np.ndarray:
        """The kept values of a select frame in the accumulator dtype of the frame's (float32
        for 16-bit frames: exact), so adding them into a narrower array rounds once."""
        return self.value.written(payload, ctx.positions.size, ctx)

    # ---------------------------------------------------------------- config
    def get_config(self) -> dict:
        """A flat JSON-serialisable dict with ``"id"``; ``get_codec(cfg) == self``.

        Parameters are keyed by name for a one-stage codec, ``"stage.param"`` otherwise.
        """
        named = [s for s in self.stages if not (s is self.value and self._implicit_value)]
        cfg = {"id": "+".join(s.name for s in named)}
        if not self.checksum:
            cfg["checksum"] = False
        for s in named:
            for k, v in s.config.items():
                if v is not None:
                    cfg[k if len(named) == 1 else f"{s.name}.{k}"] = v if not isinstance(v, specmod.Call) else str(v)
        return cfg

    @classmethod
    def from_config(cls, config: dict) -> "Codec":
        if not isinstance(config, dict) or not isinstance(config.get("id"), str):
            raise CodecValueError(f"config: expected a dict with a string 'id', got {config!r}")
        names = config["id"].split("+")
        params = {n: {} for n in names}
        for key, v in config.items():
            if key in ("id", "checksum"):
                continue
            stage, _, pname = key.rpartition(".")
            if not stage and len(names) == 1:
                stage = names[0]
            if stage not in params:
                raise CodecValueError(f"config: key {key!r} names no stage of {config['id']!r}")
            params[stage][pname] = v
        return cls([lookup(n)(**params[n]) for n in names], checksum=config.get("checksum", True))

    def __eq__(self, other):
        return isinstance(other, Codec) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash(json.dumps(self.get_config(), sort_keys=True))

    def __repr__(self):
        return f"Codec({self.spec!r})" if self.checksum else f"Codec({self.spec!r}, checksum=False)"

    def __reduce__(self):
        return (get_codec, (self.get_config(),))


@functools.lru_cache(maxsize=256)
def _cached(spec: str, checksum: bool) -> Codec:
    return Codec(spec, checksum=checksum)


def get_codec(spec=None, /, *, checksum: bool | None = None, **params) -> Codec:
    """A codec from a spec string (``"topk(ratio=0.001)+zstd"``), an id plus keyword parameters
    (``get_codec("qsgd", levels=16)``), a config dict (from ``get_config``) or a Codec.

    ``checksum=False`` gives the codec that writes frames without the payload CRC-32C (see
    :class:`Codec`); None keeps what ``spec`` says (a config dict or Codec may carry it;
    otherwise True)."""
    if checksum is not None and not isinstance(checksum, bool):
        raise CodecTypeError(f"checksum: expected True or False, got {checksum!r}")
    if isinstance(spec, Codec):
        if params:
            raise CodecValueError("get_codec: keyword parameters cannot be combined with a Codec")
        return spec if checksum in (None, spec.checksum) else Codec(spec.stages, checksum=checksum)
    if isinstance(spec, dict):
        if params:
            raise CodecValueError("get_codec: keyword parameters cannot be combined with a config dict")
        return Codec.from_config(spec if checksum is None else {**spec, "checksum": checksum})
    if not isinstance(spec, str):
        raise CodecTypeError(f"spec: expected a spec string, config dict or Codec, got {type(spec).__name__}")
    checksum = True if checksum is None else checksum
    if params:
        stages = specmod.parse(spec)
        if len(stages) != 1 or stages[0][1]:
            raise CodecValueError(f"get_codec: keyword parameters need a bare codec id, got {spec!r}")
        return Codec([lookup(stages[0][0])(**params)], checksum=checksum)
    return _cached(spec, checksum)


def codec_of(fr) -> Codec:
    """The codec a validated frame names (its header CRC held, so a bad spec is a forgery)."""
    try:
        return get_codec(fr.spec)
    except UnknownCodecError:
        raise
    except (ValueError, TypeError) as e:
        raise CorruptFrameError(f"frame names an invalid codec {fr.spec!r}: {e}") from None
