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
from codec.dtypes import as_float_array
from codec.errors import CodecError, CorruptFrameError, UnknownCodecError
from codec.frame import DEFAULT_CHECKSUM, build_frame, parse_frame
from codec.modes import ADD, SET, SUB
from codec.stage import KINDS, Context, Stage, check_step, lookup, registered


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
            raise TypeError(f"checksum: expected True or False, got {checksum!r}")
        stages = [lookup(name)(**params) for name, params in specmod.parse(spec)] if isinstance(spec, str) else list(spec)
        self.stages = _arrange(stages, spec if isinstance(spec, str) else None)
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
        self._implicit_value = chooser is not None and self.value == _default_value(chooser)
        self.spec = specmod.format_spec(
            (s.name, _non_default(s)) for s in self.stages if not (s is self.value and self._implicit_value)
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
    def encode(self, x, *, dtype=None, key=None, step: int = 0) -> bytes:
        """Encode ``x`` (any float array-like; ``dtype`` reinterprets raw buffers) into a frame.

        ``key`` and ``step`` pick the random stream of stochastic stages (and the step of
        scheduled parameters): the same ``(x, key, step)`` always gives the same frame.
        ``ErrorFeedback`` passes its key and the key's step count."""
        arr = as_float_array(x, dtype)
        return self.encode_with(arr, Context(arr.shape, arr.dtype, key=key, step=check_step(step)))

    # ---------------------------------------------------------------- pipeline primitives
    # What encode and decode are made of, for codec.feedback.ErrorFeedback (which owns the
    # error-feedback step) and for callers holding a Context (per-key stage state).  ``arr``
    # and ``flat`` are plain C-contiguous base ndarrays (codec.dtypes.as_float_array's output).

    def encode_with(self, arr: np.ndarray, ctx: Context) -> bytes:
        """The frame of ``arr`` with an explicit :class:`~codec.stage.Context` (key, step and
        the per-key ``state`` stages may keep, as PowerSGD's Q)."""
        return self.frame(self.sections(arr.reshape(-1), ctx), arr.dtype, arr.shape)

    def sections(self, flat: np.ndarray, ctx: Context, *, residual=None, out=None) -> list:
        """Run the stages on ``flat``: transform or select, then value; returns the sections.

        ``residual``/``out`` (a select stage with ``fuses_feedback`` only): select from
        ``acc = flat + residual``, written into ``out`` in the selection pass.  Sets
        ``ctx.positions`` to the sent positions when a select stage ran."""
        sections: list = []
        values, vctx = flat, ctx
        if self.transform is not None:
            values = self.transform.forward(flat, ctx, sections)
            vctx = ctx.domain(values.size, values.dtype)
        elif self.select is not None:
            if residual is not None and not self.select.fuses_feedback:
                raise ValueError(f"residual: {self.select.name} does not fuse error feedback into its selection")
            ctx.positions, values = self.select.select(flat, ctx, sections, residual=residual, out=out)
            ctx.kept = values
        self.value.encode(values, vctx, sections)
        return sections

    def frame(self, sections: list, dtype, shape) -> bytes:
        """The frame holding ``sections`` for an array of ``dtype`` and ``shape``, with this
        codec's spec, checksum and byte stages."""
        return build_frame(self.spec, dtype, shape, sections, **self._frame_options)

    def frame_many(self, sections: list, layout, form: str = "table", *, pieces=None, joint: bool = False) -> bytes:
        """The many-tensor frame (format v2, :mod:`codec.manyframe`) holding ``sections[i]``
        for tensor i of ``layout`` (``joint``: ``[sections]`` of their concatenation);
        ``form`` "table" or "hash"; ``pieces`` as for :func:`codec.manyframe.build_many`."""
        from codec.manyframe import build_many

        return build_many(self.spec, layout, sections, form=form, pieces=pieces, joint=joint, **self._frame_options)

    def subtract(self, fr, flat: np.ndarray) -> None:
        """``flat -= decode(fr)`` in place, rounded once (a sparse frame touches only its
        positions); ``fr`` is a parsed frame (:func:`codec.frame.parse_frame`, or a tensor of
        a many-tensor frame) that this codec made."""
        self._decode_into(fr, flat, SUB)

    # ---------------------------------------------------------------- many tensors
    def encode_many(self, tensors, *, keys=None, step: int = 0, layout: str = "table", joint: bool = False) -> bytes:
        """One frame (format v2) holding every tensor of ``tensors``: a dict name -> array (the
        names are kept, and decoding gives a dict back) or a sequence of arrays.

        Each tensor is coded exactly as :meth:`encode` would code it alone (top-k's k, a
        quantizer's buckets, PowerSGD's matrices and the random streams are per tensor):
        ``keys`` (one per tensor; default None for all) and ``step`` are what ``encode``
        takes.  ``layout="hash"`` writes the layout's 8-byte hash instead of its table, for
        peers that agreed on it; decoding such a frame needs ``layout=``.

        An elementwise value stage alone (``none``, ``fp16``, ``bf16``) codes each run of
        consecutive small tensors of one dtype with one kernel call over their concatenation:
        the same codes, in the same place of the frame, as one call per tensor.

        ``joint=True`` is the whole-model variant, as DDP's buckets do it: the tensors (all of
        one dtype) are coded as ONE, their flat concatenation in order, so top-k keeps the
        model's k largest magnitudes and a quantizer's buckets run across tensors; ``keys``
        is then the one key of the concatenation.  The frame still records every tensor,
        and decodes to them."""
        from codec.manyframe import Layout

        names, arrays = many_inputs(tensors)
        step = check_step(step)
        lay = Layout(tuple(a.shape for a in arrays), tuple(a.dtype for a in arrays), names)
        if joint:
            flat = joined(arrays)
            sections = self.sections(flat, Context(flat.shape, flat.dtype, key=_hashable(keys), step=step, name="tensors"))
            return self.frame_many([sections], lay, layout, joint=True)
        keys = many_keys(keys, len(arrays))
        ctxs = [Context(a.shape, a.dtype, key=k, step=step, name=w) for a, k, w in zip(arrays, keys, _where(names, len(arrays)))]
        sections, pieces = self.sections_many(arrays, ctxs)
        return self.frame_many(sections, lay, layout, pieces=pieces)

    def sections_many(self, arrays, ctxs):
        """:meth:`sections` of every tensor (``ctxs[i]`` its context: key, step, state, the
        name errors give it), with the runs an elementwise value stage or a segmented select
        stage codes at once; returns ``(sections, pieces)`` for :meth:`frame_many`."""
        if self.elementwise:
            return self._runs_sections(arrays, [c.name for c in ctxs])
        sections = [None] * len(arrays)
        if self.select is not None:
            self._select_runs(arrays, ctxs, sections)
        for i, (a, ctx) in enumerate(zip(arrays, ctxs)):
            if sections[i] is None:
                sections[i] = self.sections(a.reshape(-1), ctx)
        return sections, None

    def _select_runs(self, arrays, ctxs, sections) -> None:
        """Fill ``sections[i]`` for the tensors of every run of small float32/float64 tensors
        that the select stage codes at once (:meth:`codec.stage.Select.select_segments`);
        the others stay None (coded one by one)."""
        from codec.ops import scratch

        for run in runs([(a.size, a.dtype) for a in arrays], SEGMENT_ELEMENTS, RUN_ELEMENTS):
            if len(run) < 2 or arrays[run[0]].dtype not in (np.float32, np.float64):
                continue
            sizes = [arrays[i].size for i in run]
            starts = np.zeros(len(run) + 1, np.int64)
            np.cumsum(sizes, out=starts[1:])
            flat = scratch(int(starts[-1]), arrays[run[0]].dtype)
            np.concatenate([arrays[i].reshape(-1) for i in run], out=flat)
            picked = self.select.select_segments(flat, starts, [ctxs[i] for i in run])
            if picked is None:
                continue
            for i, (idx, values, secs) in zip(run, picked):
                ctxs[i].positions, ctxs[i].kept = idx, values
                self.value.encode(values, ctxs[i], secs)
                sections[i] = secs

    @property
    def elementwise(self) -> bool:
        """A value stage alone whose codes are elementwise (:attr:`codec.stage.Value.elementwise`)."""
        return self.transform is None and self.select is None and self.value.elementwise

    def _runs_sections(self, arrays, where):
        """The table sections and payload pieces of an elementwise codec's many-tensor frame:
        one piece per run of small same-dtype tensors (:func:`runs`), coded at once."""
        from codec.manyframe import Entry
        from codec.ops import scratch

        sections, pieces = [], []
        groups = runs([(a.size, a.dtype) for a in arrays])
        # every run's concatenation in its own slice of one reused buffer per dtype: the
        # pieces are filled only when the frame is built, after the last run is formed
        room, used = {}, {}
        for run in groups:
            if len(run) > 1:
                dt = arrays[run[0]].dtype
                room[dt] = room.get(dt, 0) + sum(arrays[i].size for i in run)
        room = {dt: scratch(n, dt) for dt, n in room.items()}
        for run in groups:
            if len(run) == 1:
                a = arrays[run[0]]
                secs = self.sections(a.reshape(-1), Context(a.shape, a.dtype, name=where[run[0]]))
                sections.append(secs)
                pieces += secs
                continue
            dt, n = arrays[run[0]].dtype, sum(arrays[i].size for i in run)
            at = used.get(dt, 0)
            flat = room[dt][at : at + n]
            used[dt] = at + n
            np.concatenate([arrays[i].reshape(-1) for i in run], out=flat)
            (piece,) = self.sections(flat, Context(flat.shape, flat.dtype, name="tensors"))
            sections += [[Entry(piece.kind, piece.bits, arrays[i].size)] for i in run]
            pieces.append(self._exact_errors(piece, [(arrays[i], where[i]) for i in run]))
        return sections, pieces

    def _exact_errors(self, piece, members):
        """``piece`` (the codes of a run), whose error on a bad value (NaN under
        ``nonfinite=raise``) is raised again by the tensor that holds it, named as
        ``encode_many`` names it."""
        from codec.errors import NonFiniteError
        from codec.frame import Section

        if piece.fill is None:
            return piece

        def fill(out):
            try:
                piece.fill(out)
            except NonFiniteError:
                for a, w in members:
                    for sec in self.sections(a.reshape(-1), Context(a.shape, a.dtype, name=w)):
                        sec.materialize()
                raise

        return Section(piece.kind, piece.bits, piece.count, fill=fill)

    def decode_many(self, frame, out=None, *, layout=None, max_elements=None):
        """:func:`codec.decode_many`, checking that the frame was made by this codec."""
        mf = _parse_many(frame, layout, max_elements)
        self._check_same(mf)
        return _decode_many(mf, out)

    def decode_sparse_many(self, frame, *, layout=None, max_elements=None) -> list:
        """:func:`codec.decode_sparse_many`, checking that the frame was made by this codec."""
        mf = _parse_many(frame, layout, max_elements)
        self._check_same(mf)
        return _decode_sparse_many(mf)

    def decode_add_many(self, frame, out, *, layout=None, subtract: bool = False):
        """:func:`codec.decode_add_many`, checking that the frame was made by this codec."""
        mf = _parse_many(frame, layout, None)
        self._check_same(mf)
        return _decode_add_many(mf, out, subtract)

    # ---------------------------------------------------------------- decode
    def decode(self, frame, out=None, *, max_elements=None):
        """Decode ``frame`` into a new array (or into ``out``, which must match size and dtype)."""
        fr = parse_frame(frame, max_elements=max_elements)
        self._check_same(fr)
        return _decode(fr, out)

    def decode_add(self, frame, out, *, subtract: bool = False):
        """``out += decoded`` (``-=`` with ``subtract=True``) without a dense temporary for sparse codecs.

        ``out`` must be a NumPy array with the frame's element count and any supported float
        dtype (writeable, C-contiguous); returns ``out``.
        """
        fr = parse_frame(frame)
        self._check_same(fr)
        return _decode_add(fr, out, subtract)

    def decode_sparse(self, frame):
        """:func:`codec.decode_sparse`, checking that the frame was made by this codec."""
        fr = parse_frame(frame)
        self._check_same(fr)
        return _decode_sparse(fr)

    def _check_same(self, fr) -> None:
        names = "+".join(s.name for s in _codec_of(fr).stages)
        if names != self.codec_id:
            raise CodecError(f"frame was encoded by {fr.spec!r}, not by this codec ({self.spec!r}); use codec.decode(frame)")

    def _read(self, fr):
        """Phase 1 of decoding: check every section against what the stages expect and read
        the compact payload (positions, codes).  Nothing of the dense output size is
        allocated here, so a forged frame fails before any large allocation."""
        ctx = Context(fr.shape, fr.dtype)
        rd = fr.reader()
        if self.transform is not None:
            tpay, vctx = self.transform.read(rd, ctx)
            payload = (tpay, vctx, self.value.read(rd, vctx, vctx.n))
        else:
            if self.select is not None:
                ctx.positions = self.select.positions(rd, ctx)
            payload = self.value.read(rd, ctx, fr.n if ctx.positions is None else ctx.positions.size)
        rd.done()
        return ctx, payload

    def _write(self, ctx, payload, out: np.ndarray, mode: int) -> None:
        """Phase 2: write the decoded array into flat ``out`` (store, add or subtract per ``mode``)."""
        from codec.ops import WIDE, scatter, store, wide_dtype

        if self.transform is not None:  # coefficients in the domain's dtype, then the inverse
            tpay, vctx, vpay = payload
            values = np.empty(vctx.n, self.transform.domain_dtype(vctx.dtype))
            self.value.write(vpay, values, SET)
            self.transform.inverse(tpay, values, out, mode)
        elif out.dtype not in WIDE:  # kernels work on float32/float64; 16-bit outputs go through one
            wide = np.empty(out.size, wide_dtype(ctx.dtype))  # the decoded values exactly: rounded once, in store
            self._write(ctx, payload, wide, SET)
            store(wide, out, mode)
        elif self.select is None:
            self.value.write(payload, out, mode)
        else:
            scatter(self._kept(ctx, payload), ctx.positions, out, mode)

    def _kept(self, ctx, payload) -> np.ndarray:
        """The kept values of a select frame in the frame's dtype (float32 for 16-bit frames:
        exact), so adding them into a narrower array rounds once."""
        from codec.ops import wide_dtype

        values = np.empty(ctx.positions.size, wide_dtype(ctx.dtype))
        self.value.write(payload, values, SET)
        return values

    def _decode_into(self, fr, out: np.ndarray, mode: int) -> None:
        ctx, payload = self._read(fr)
        self._write(ctx, payload, out, mode)

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
            raise ValueError(f"config: expected a dict with a string 'id', got {config!r}")
        names = config["id"].split("+")
        params = {n: {} for n in names}
        for key, v in config.items():
            if key in ("id", "checksum"):
                continue
            stage, _, pname = key.rpartition(".")
            if not stage and len(names) == 1:
                stage = names[0]
            if stage not in params:
                raise ValueError(f"config: key {key!r} names no stage of {config['id']!r}")
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


# -------------------------------------------------------------------- helpers
def _default_value(chooser) -> Stage:
    """The value stage a pipeline without one gets: the select or transform stage's
    ``default_value`` (a registered name, or a Value class private to the stage), else ``none``."""
    value = "none" if chooser is None else chooser.default_value
    return (value if isinstance(value, type) else lookup(value))()


def _non_default(stage: Stage) -> dict:
    defaults = {p.name: p.default for p in stage.params}
    return {k: v for k, v in stage.config.items() if v != defaults[k] and v is not None}


def _arrange(stages, text):
    where = f"bad spec {text!r}" if text else "bad pipeline"
    seen = {}
    for s in stages:
        if not isinstance(s, Stage):
            raise TypeError(f"{where}: {s!r} is not a stage")
        if s.kind != "bytes" and s.kind in seen:
            raise ValueError(f"{where}: two {s.kind} stages ({seen[s.kind].name!r} and {s.name!r}); a codec has at most one")
        if any(t.name == s.name for t in stages if t is not s):
            raise ValueError(f"{where}: stage {s.name!r} appears twice")
        seen.setdefault(s.kind, s)
    if "transform" in seen and "select" in seen:
        raise ValueError(
            f"{where}: {seen['transform'].name!r} (transform) chooses its own coefficients; "
            f"it cannot be combined with the select stage {seen['select'].name!r}"
        )
    order = [KINDS.index(s.kind) for s in stages]
    for a, b in zip(range(len(stages)), range(1, len(stages))):
        if order[b] < order[a]:
            raise ValueError(
                f"{where}: stage {stages[b].name!r} ({stages[b].kind}) must come before {stages[a].name!r} "
                f"({stages[a].kind}); the order is {' -> '.join(KINDS)}"
            )
    if "value" not in seen:
        value = _default_value(seen.get("select") or seen.get("transform"))
        i = next((i for i, s in enumerate(stages) if s.kind == "bytes"), len(stages))
        stages = stages[:i] + [value] + stages[i:]
    return tuple(stages)


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
        raise TypeError(f"checksum: expected True or False, got {checksum!r}")
    if isinstance(spec, Codec):
        if params:
            raise ValueError("get_codec: keyword parameters cannot be combined with a Codec")
        return spec if checksum in (None, spec.checksum) else Codec(spec.stages, checksum=checksum)
    if isinstance(spec, dict):
        if params:
            raise ValueError("get_codec: keyword parameters cannot be combined with a config dict")
        return Codec.from_config(spec if checksum is None else {**spec, "checksum": checksum})
    if not isinstance(spec, str):
        raise TypeError(f"spec: expected a spec string, config dict or Codec, got {type(spec).__name__}")
    checksum = True if checksum is None else checksum
    if params:
        stages = specmod.parse(spec)
        if len(stages) != 1 or stages[0][1]:
            raise ValueError(f"get_codec: keyword parameters need a bare codec id, got {spec!r}")
        return Codec([lookup(stages[0][0])(**params)], checksum=checksum)
    return _cached(spec, checksum)


def _out_array(fr, out, *, add: bool, argname: str = "out") -> np.ndarray:
    """The flat base-ndarray view of ``out`` that decoding writes: a writeable, aligned,
    C-contiguous NumPy array (a subclass is written through a base view; masked arrays are
    refused) with the frame's element count and dtype (any supported dtype when adding)."""
    return _checked_out(out, fr.n, fr.shape, fr.dtype, add=add, argname=argname)


def _checked_out(out, n: int, shape, dtype, *, add: bool, argname: str) -> np.ndarray:
    """:func:`_out_array` for an array of ``n`` elements, ``shape`` and ``dtype``."""
    from codec.dtypes import CODES, base_view

    if out is None:
        raise TypeError(f"{argname}: decode_add adds into an existing array; pass one (None would add into a throw-away buffer)")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{argname}: expected a NumPy array, got {type(out).__name__}")
    plain = base_view(out, argname)
    if plain.size != n:
        raise ValueError(f"{argname}: has {plain.size} elements, the frame holds {n} (shape {shape})")
    if add and plain.dtype not in CODES.values():
        raise ValueError(f"{argname}: dtype {plain.dtype} cannot accumulate; use float16, bfloat16, float32 or float64 (native byte order)")
    if not add and plain.dtype != dtype:
        raise ValueError(f"{argname}: dtype {plain.dtype} does not match the frame's {dtype}")
    if not plain.flags.c_contiguous or not plain.flags.writeable or not plain.flags.aligned:
        raise ValueError(f"{argname}: must be a writeable, aligned, C-contiguous array")
    return plain.reshape(-1)


def _codec_of(fr) -> Codec:
    """The codec a validated frame names (its header CRC held, so a bad spec is a forgery)."""
    try:
        return get_codec(fr.spec)
    except UnknownCodecError:
        raise
    except (ValueError, TypeError) as e:
        raise CorruptFrameError(f"frame names an invalid codec {fr.spec!r}: {e}") from None


def _decode(fr, out=None):
    codec = _codec_of(fr)
    target = None if out is None else _out_array(fr, out, add=False)  # a wrong out: refused first
    ctx, payload = codec._read(fr)  # every section checked before the dense output is allocated
    if target is None:
        target = np.empty(fr.n, fr.dtype)
    codec._write(ctx, payload, target, SET)
    return target.reshape(fr.shape) if out is None else out


def _decode_add(fr, out, subtract=False):
    codec = _codec_of(fr)
    target = _out_array(fr, out, add=True)
    ctx, payload = codec._read(fr)
    codec._write(ctx, payload, target, SUB if subtract else ADD)
    return out


def decode(frame, out=None, *, max_elements=None):
    """Decode any gradcodec frame with nothing but the frame (the codec is read from its header)."""
    return _decode(parse_frame(frame, max_elements=max_elements), out)


def decode_sparse(frame, *, max_elements=None):
    """The ``(positions, values)`` a sparse frame carries, without a dense array.

    ``positions`` are sorted flat int64 indices; ``values`` are the decoded kept values, in the
    frame's dtype (float32 for 16-bit frames, which holds them exactly).  Only frames of a codec
    with a select stage (``topk``, ``adacomp``, ``randomk``, ...) are sparse; any other frame
    raises ``ValueError`` naming ``frame``."""
    return _decode_sparse(parse_frame(frame, max_elements=max_elements))


def _decode_sparse(fr):
    codec = _codec_of(fr)
    if codec.select is None:
        raise ValueError(f"frame: {fr.spec!r} has no select stage, so the frame is not sparse; use codec.decode")
    ctx, payload = codec._read(fr)
    return ctx.positions, codec._kept(ctx, payload)


# -------------------------------------------------------------------- many tensors
def many_inputs(tensors, argname: str = "tensors"):
    """``(names, arrays)`` of a dict name -> array (names a tuple of str) or a sequence of
    arrays (names None); each array through :func:`codec.dtypes.as_float_array`."""
    if isinstance(tensors, dict):
        for k in tensors:
            if not isinstance(k, str):
                raise TypeError(f"{argname}: names must be str, got {type(k).__name__} {k!r}")
        return tuple(tensors), [as_float_array(v, None, f"{argname}[{k!r}]") for k, v in tensors.items()]
    if isinstance(tensors, (list, tuple)):
        return None, [as_float_array(v, None, f"{argname}[{i}]") for i, v in enumerate(tensors)]
    raise TypeError(f"{argname}: expected a dict of name -> array or a list of arrays, got {type(tensors).__name__}")


#: the most elements of one run (:func:`runs`): a run is coded through one buffer of this
#: size at most, which stays in cache and is recycled by the allocator (a larger one would
#: be page-faulted afresh on every call); a larger tensor runs alone
RUN_ELEMENTS = 1 << 16


def runs(tensors, total: int = RUN_ELEMENTS, each: int | None = None) -> list[list[int]]:
    """Indices of ``tensors`` (``(size, dtype)`` pairs) grouped into maximal runs of
    consecutive tensors of one dtype holding at most ``total`` elements together (default
    :data:`RUN_ELEMENTS`), each of at most ``each`` (default ``total``); a tensor beyond
    either is a run of its own."""
    each = total if each is None else each
    out: list[list[int]] = []
    prev, count = None, 0  # the dtype and size of the run being extended (None: closed)
    for i, (size, dtype) in enumerate(tensors):
        if prev is not None and dtype == prev and size <= each and count + size <= total:
            out[-1].append(i)
            count += size
        else:
            out.append([i])
            prev, count = (dtype, size) if size <= each else (None, 0)
    return out


#: a select stage's runs (:meth:`codec.stage.Select.select_segments`): tensors of at most
#: RUN_ELEMENTS elements, up to this many together, so one kernel call spans enough data to
#: run on every thread (its scratch buffer is reused from call to call)
SEGMENT_ELEMENTS = 1 << 20


def joined(arrays) -> np.ndarray:
    """The flat concatenation of ``arrays`` (all of one dtype: ValueError naming ``tensors``
    otherwise), what a joint many-tensor frame codes."""
    dts = {a.dtype for a in arrays}
    if len(dts) > 1:
        raise ValueError(f"tensors: joint=True codes the tensors as one array, so they must share a dtype, got {sorted(d.name for d in dts)}")
    if not arrays:
        return np.empty(0, np.float32)
    return np.concatenate([a.reshape(-1) for a in arrays])


def _where(names, count: int) -> list[str]:
    """How errors name each tensor of a many-tensor call: ``tensors['w']`` or ``tensors[3]``."""
    return [f"tensors[{k!r}]" for k in (names if names is not None else range(count))]


def many_keys(keys, count: int) -> list:
    """``keys`` as a list of ``count`` per-tensor keys (None: None for every tensor)."""
    if keys is None:
        return [None] * count
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise TypeError(f"keys: expected one key per tensor (a list), got {type(keys).__name__}")
    if len(keys) != count:
        raise ValueError(f"keys: {len(keys)} keys for {count} tensors")
    return list(keys)


def _hashable(key):
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"keys: a key must be hashable, got {type(key).__name__}") from None
    return key


def _parse_many(frame, layout, max_elements):
    from codec.manyframe import parse_many

    return parse_many(frame, layout=layout, max_elements=max_elements)


def _many_targets(mf, out, *, add: bool) -> list:
    """Per tensor of ``mf``, the flat array decoding writes (None: a new one), from ``out``:
    None, a dict name -> array (exactly the frame's names) or a sequence (frame order)."""
    count = len(mf)
    if out is None:
        if add:
            raise TypeError("out: decode_add_many adds into existing arrays; pass them")
        return [None] * count
    names = mf.layout.names
    if isinstance(out, dict):
        if names is None:
            raise TypeError("out: this frame does not name its tensors; pass a list of arrays in frame order")
        if set(out) != set(names):
            missing, extra = sorted(set(names) - set(out)), sorted(set(out) - set(names))
            raise ValueError(f"out: must hold exactly the frame's tensors (missing {missing}, not in the frame {extra})")
        items = [(f"out[{k!r}]", out[k]) for k in names]
    elif isinstance(out, (list, tuple)):
        if len(out) != count:
            raise ValueError(f"out: {len(out)} arrays for a frame of {count} tensors")
        items = [(f"out[{i}]", a) for i, a in enumerate(out)]
    else:
        raise TypeError(f"out: expected a dict or list of arrays, got {type(out).__name__}")
    lay = mf.layout
    return [_checked_out(a, lay.sizes[i], lay.shapes[i], lay.dtypes[i], add=add, argname=where) for i, (where, a) in enumerate(items)]


def _read_many(mf) -> tuple:
    """The codec of ``mf`` and its jobs: ``(indices, ctx, payload)`` per tensor, or per run of
    small tensors an elementwise codec decodes at once (:func:`runs`), every section checked
    and compactly read (phase 1 for all tensors before any output is allocated)."""
    codec = _codec_of(mf)
    lay = mf.layout
    if mf.joint:  # one job: the concatenation
        jobs = [(list(range(len(mf))), *codec._read(mf.whole()))]
        mf.finish()
        return codec, jobs
    groups = runs(zip(lay.sizes, lay.dtypes)) if codec.elementwise else [[i] for i in range(len(mf))]
    jobs = []
    for g in groups:
        fr = _run_frame(mf, g) if len(g) > 1 else None
        if fr is None:  # alone, or a run whose tensors are not one values section each
            jobs += [([i], *codec._read(mf.tensor(i))) for i in g]
        else:
            jobs.append((g, *codec._read(fr)))
    mf.finish()
    return codec, jobs


def _run_frame(mf, run):
    """One v1-shaped frame over a run's codes, when every tensor of the run holds exactly one
    section of its own element count, with the first one's kind and a whole number of bytes
    per item (else None: each tensor is then read, and refused, on its own)."""
    from codec.frame import Frame, SectionInfo

    first = mf.tensor_sections[run[0]]
    if len(first) != 1 or first[0].bits % 8:
        return None
    kind, bits = first[0].kind, first[0].bits
    total = raw = 0
    for i in run:
        secs = mf.tensor_sections[i]
        n = mf.layout.sizes[i]
        if len(secs) != 1 or (secs[0].kind, secs[0].bits, secs[0].count) != (kind, bits, n):
            return None
        total += n
        raw += secs[0].raw_len
    info = SectionInfo(kind, first[0].encoding, bits, total, raw, raw, first[0].offset)
    return Frame(mf.payload, 2, mf.flags, mf.layout.dtypes[run[0]], (total,), mf.spec, [info], 0)


def _decode_many(mf, out=None):
    from codec.ops import scratch

    targets = _many_targets(mf, out, add=False)
    codec, jobs = _read_many(mf)
    lay = mf.layout
    results = [None] * len(mf)
    for idx, ctx, payload in jobs:
        if len(idx) == 1:
            i = idx[0]
            target = targets[i] if targets[i] is not None else np.empty(lay.sizes[i], lay.dtypes[i])
            codec._write(ctx, payload, target, SET)
            results[i] = target.reshape(lay.shapes[i])
            continue
        # a run (or a joint frame) at once: into a reused buffer when it is small and every
        # tensor has its out (copied there), else a new array of which each tensor is a view
        reuse = ctx.n <= SEGMENT_ELEMENTS and all(targets[i] is not None for i in idx)
        whole = scratch(ctx.n, ctx.dtype) if reuse else np.empty(ctx.n, ctx.dtype)
        codec._write(ctx, payload, whole, SET)
        at = 0
        for i in idx:
            part = whole[at : at + lay.sizes[i]]
            at += lay.sizes[i]
            if targets[i] is not None:
                np.copyto(targets[i], part)
                part = targets[i]
            results[i] = part.reshape(lay.shapes[i])
    if out is not None:
        return out
    return results if lay.names is None else dict(zip(lay.names, results))


def _decode_add_many(mf, out, subtract=False):
    from codec.ops import scatter, scratch, store, wide_dtype

    targets = _many_targets(mf, out, add=True)
    codec, jobs = _read_many(mf)
    mode = SUB if subtract else ADD
    for idx, ctx, payload in jobs:
        if len(idx) == 1 and not mf.joint:
            codec._write(ctx, payload, targets[idx[0]], mode)
            continue
        if codec.select is not None:  # a joint sparse frame: each tensor's share of the pairs
            for i, (pos, vals) in zip(idx, _split_pairs(mf, ctx.positions, codec._kept(ctx, payload))):
                scatter(vals, pos, targets[i], mode)
            continue
        # a run, or a joint dense frame: the decoded values, exactly (in the accumulator dtype of
        # the frame's: a narrow frame's codes may decode beyond its own dtype's range)
        wide = wide_dtype(ctx.dtype)
        whole = scratch(ctx.n, wide) if ctx.n <= SEGMENT_ELEMENTS else np.empty(ctx.n, wide)
        codec._write(ctx, payload, whole, SET)
        at = 0
        for i in idx:
            n = targets[i].size
            store(whole[at : at + n], targets[i], mode)  # each element rounded once, as decode_add
            at += n
    return out


def _split_pairs(mf, positions, values) -> list:
    """A joint frame's sorted flat positions (and their values) as each tensor's own pairs."""
    starts = np.zeros(len(mf) + 1, np.int64)
    np.cumsum(mf.layout.sizes, out=starts[1:])
    cut = np.searchsorted(positions, starts)
    return [(positions[cut[i] : cut[i + 1]] - starts[i], values[cut[i] : cut[i + 1]]) for i in range(len(mf))]


def decode_many(frame, out=None, *, layout=None, max_elements=None):
    """Decode a many-tensor frame (:meth:`Codec.encode_many`) with nothing but the frame: a
    dict name -> array when the frame names its tensors, else a list; or fill ``out`` (a dict
    or list of arrays of the frame's dtypes and sizes) and return it.

    ``layout`` (a :class:`codec.Layout`, or the tensors to read it off) is required for a
    frame in the layout-hash form and checked against a frame's table otherwise;
    ``max_elements`` bounds the sum of the tensors' element counts.  Every section of every
    tensor is checked before any output is allocated."""
    return _decode_many(_parse_many(frame, layout, max_elements), out)


def decode_sparse_many(frame, *, layout=None, max_elements=None) -> list:
    """Per tensor of a many-tensor frame of a sparse codec, its ``(positions, values)`` as
    :func:`decode_sparse` gives them, in frame order (a list, also for a named frame)."""
    return _decode_sparse_many(_parse_many(frame, layout, max_elements))


def _decode_sparse_many(mf) -> list:
    if _codec_of(mf).select is None:
        raise ValueError(f"frame: {mf.spec!r} has no select stage, so the frame is not sparse; use codec.decode_many")
    pairs = _split_pairs(mf, *_decode_sparse(mf.whole())) if mf.joint else [_decode_sparse(mf.tensor(i)) for i in range(len(mf))]
    mf.finish()
    return pairs


def decode_add_many(frame, out, *, layout=None, subtract: bool = False):
    """``out[i] += decoded[i]`` for every tensor of a many-tensor frame (``-=`` with
    ``subtract=True``); ``out`` a dict or list of arrays of any supported float dtype with
    the tensors' element counts.  Returns ``out``."""
    return _decode_add_many(_parse_many(frame, layout, None), out, subtract)


def list_codecs() -> list[dict]:
    """Every registered stage: id, kind, one-line doc, parameters with types and defaults."""
    return [
        {"id": name, "kind": cls.kind, "lossless": cls.lossless, "doc": cls.summary(), "params": [p.describe() for p in cls.params]}
        for name, cls in registered().items()
    ]
