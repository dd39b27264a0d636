"""Many tensors in one call: ``Codec.encode_many`` and ``codec.decode_many`` /
``decode_add_many`` / ``decode_sparse_many`` (the format, v2, is :mod:`codec.manyframe`).

Encoding runs every tensor's stages with its own context, except where a stage can code a
run of small tensors at once (:mod:`codec.runs`: an elementwise value stage, a quantizer's
``encode_run``, a select stage's ``select_segments``); either way the frame holds the bytes
per-tensor coding gives.  Decoding reads every tensor's sections (a run at once, with the
stages' ``read_run``, ``positions_segments`` and ``read_kept``) before writing any output;
:func:`subtract` is error feedback's decoding of the tensors its runs coded.
"""

from __future__ import annotations

import numpy as np

from codec import pack
from codec.device import Memory, spans as device_spans
from codec.dtypes import as_float_array, checked_out, on_device
from codec.errors import CodecTypeError, CodecValueError, CorruptFrameError
from codec.frame import Frame, SectionInfo
from codec.framebuffer import frame_out
from codec.manyframe import VERSION, Layout
from codec.modes import ADD, SET, SUB
from codec.ops import WIDE, scatter_checked, scratch, store, wide_dtype
from codec.runs import RUNS, SEGMENT_ELEMENTS, RunShape, elementwise_sections, runs, segment_runs, select_runs, transform_runs, value_runs
from codec.stage import Context, check_step


# -------------------------------------------------------------------- inputs
def many_inputs(tensors, argname: str = "tensors", device: bool = False):
    """``(names, arrays)`` of a dict name -> array (names a tuple of str) or a sequence of
    arrays (names None); each array through :func:`codec.dtypes.as_float_array`, or with
    ``device`` a device array viewed (:func:`codec.device.as_device_array`)."""
    def one(v, name):
        if device and on_device(v):
            from codec.device import as_device_array

            return as_device_array(v, name)
        return as_float_array(v, None, name)

    if isinstance(tensors, dict):
        for k in tensors:
            if not isinstance(k, str):
                raise CodecTypeError(f"{argname}: names must be str, got {type(k).__name__} {k!r}")
        return tuple(tensors), [one(v, f"{argname}[{k!r}]") for k, v in tensors.items()]
    if isinstance(tensors, (list, tuple)):
        return None, [one(v, f"{argname}[{i}]") for i, v in enumerate(tensors)]
    raise CodecTypeError(f"{argname}: expected a dict of name -> array or a list of arrays, got {type(tensors).__name__}")


def joined(arrays) -> np.ndarray:
    """The flat concatenation of ``arrays`` (all of one dtype: ValueError naming ``tensors``
    otherwise), what a joint many-tensor frame codes."""
    dts = {a.dtype for a in arrays}
    if len(dts) > 1:
        raise CodecValueError(f"tensors: joint=True codes the tensors as one array, so they must share a dtype, got {sorted(d.name for d in dts)}")
    if not arrays:
        return np.empty(0, np.float32)
    if on_device(arrays[0]):  # (device arrays all: many_on_device)
        from codec import device

        return device.concat(arrays, device.empty(sum(a.size for a in arrays), arrays[0].dtype))
    return np.concatenate([a.reshape(-1) for a in arrays])


def where(names, count: int) -> list[str]:
    """How errors name each tensor of a many-tensor call: ``tensors['w']`` or ``tensors[3]``."""
    return [f"tensors[{k!r}]" for k in (names if names is not None else range(count))]


def many_keys(keys, count: int) -> list:
    """``keys`` as a list of ``count`` per-tensor keys (None: None for every tensor)."""
    if keys is None:
        return [None] * count
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise CodecTypeError(f"keys: expected one key per tensor (a list), got {type(keys).__name__}")
    if len(keys) != count:
        raise CodecValueError(f"keys: {len(keys)} keys for {count} tensors")
    return list(keys)


def hashable_key(key):
    try:
        hash(key)
    except TypeError:
        raise CodecTypeError(f"keys: a key must be hashable, got {type(key).__name__}") from None
    return key


# -------------------------------------------------------------------- encoding
def encode(c, tensors, *, keys=None, step: int = 0, layout: str = "table", joint: bool = False, out=None) -> bytes:
    """``c.encode_many(tensors, ...)`` (:meth:`codec.Codec.encode_many`)."""
    from codec.device import many_on_device

    names, arrays = many_inputs(tensors, device=True)
    dev = many_on_device(c.stages, arrays)
    step = check_step(step)
    lay = Layout.of(arrays, names)
    dest = frame_out(out, () if dev else arrays)
    if joint:
        flat = joined(arrays)
        secs = c.sections(flat, Context(flat.shape, flat.dtype, key=hashable_key(keys), step=step, name="tensors"))
        return c.frame_many([secs], lay, layout, joint=True, out=dest)
    keys = many_keys(keys, len(arrays))
    ctxs = [Context(a.shape, a.dtype, key=k, step=step, name=w) for a, k, w in zip(arrays, keys, where(names, len(arrays)))]
    secs, pieces, _ = sections(c, arrays, ctxs)
    return c.frame_many(secs, lay, layout, pieces=pieces, out=dest)


def sections(c, arrays, ctxs, alone=None, shape: RunShape = RUNS, flats: dict | None = None, gradients: dict | None = None):
    """The sections of every tensor (``ctxs[i]`` its context: key, step, state, the name
    errors give it), with the runs an elementwise value stage, a segmented select stage or a
    value stage's :meth:`codec.stage.Value.encode_run` codes at once; ``alone(i)`` gives the
    sections of a tensor no run codes (default: ``c.sections`` of it); ``shape``: the select
    and quantizer runs'; ``flats``: the runs whose concatenation the caller formed
    (``{first index: flat}``); ``gradients``: the runs' gradients, for a select stage that
    sees them (:func:`codec.runs.select_runs`).  Device arrays (all of them) take the same runs: a select
    stage without a segmented twin declines its runs, whose tensors then select alone.
    Returns ``(sections, pieces, ran)`` (``pieces`` for
    ``Codec.frame_many``; ``ran``: the indices of the tensors runs coded)."""
    if alone is None:
        alone = lambda i: c.sections(arrays[i].reshape(-1), ctxs[i])  # noqa: E731
    if c.elementwise:
        return elementwise_sections(c, arrays, ctxs, alone, flats)
    out = [None] * len(arrays)
    coded = {}
    if c.select is not None:
        coded = select_runs(c, arrays, ctxs, out, shape, flats, gradients)
    elif c.transform is not None:
        coded = transform_runs(c, arrays, ctxs, out, shape, flats)
    else:
        coded = value_runs(c, arrays, ctxs, out, shape, flats)
    ran = {i for i, secs in enumerate(out) if secs is not None}
    for i in range(len(arrays)):
        if out[i] is None:
            out[i] = alone(i)
    if not coded:
        return out, None, ran
    pieces, skip = [], 0
    for i, secs in enumerate(out):
        if i in coded:
            pieces.append(coded[i][1])
            skip = coded[i][0]
        elif skip:
            skip -= 1
        else:
            pieces += secs
    return out, pieces, ran


# -------------------------------------------------------------------- decoding
def _targets(c, mf, out, *, add: bool) -> list:
    """Per tensor of ``mf``, the flat array decoding writes (None: a new one), from ``out``:
    None, a dict name -> array (exactly the frame's names) or a sequence (frame order), all
    host arrays or all device arrays (the codec ``c``'s stages then checked to take them)."""
    count = len(mf)
    if out is None:
        if add:
            raise CodecTypeError("out: decode_add_many adds into existing arrays; pass them")
        return [None] * count
    names = mf.layout.names
    if isinstance(out, dict):
        if names is None:
            raise CodecTypeError("out: this frame does not name its tensors; pass a list of arrays in frame order")
        if set(out) != set(names):
            missing, extra = sorted(set(names) - set(out)), sorted(set(out) - set(names))
            raise CodecValueError(f"out: must hold exactly the frame's tensors (missing {missing}, not in the frame {extra})")
        items = [(f"out[{k!r}]", out[k]) for k in names]
    elif isinstance(out, (list, tuple)):
        if len(out) != count:
            raise CodecValueError(f"out: {len(out)} arrays for a frame of {count} tensors")
        items = [(f"out[{i}]", a) for i, a in enumerate(out)]
    else:
        raise CodecTypeError(f"out: expected a dict or list of arrays, got {type(out).__name__}")
    lay = mf.layout
    from codec import device

    if device.many_on_device(c.stages, [a for _, a in items], "out"):  # decoding writes on the device
        return [device.checked_out(a, lay.sizes[i], lay.shapes[i], lay.dtypes[i], add=add, argname=where) for i, (where, a) in enumerate(items)]
    return [checked_out(a, lay.sizes[i], lay.shapes[i], lay.dtypes[i], add=add, argname=where) for i, (where, a) in enumerate(items)]


def _read_jobs(c, mf, only=None, shape: RunShape = RUNS, device: bool = False) -> list:
    """The jobs of ``mf`` for the codec ``c``: ``(indices, ctx, payload)`` per tensor, or per run of
    small tensors an elementwise codec decodes at once (:func:`runs`), every section checked
    and compactly read (phase 1 for all tensors before any output is allocated).  ``only``:
    the jobs of these tensors alone (a set of indices; the others are not read); ``shape``:
    the select and quantizer runs' (as they were encoded); ``device``: the outputs are device
    arrays, so a tensor read alone reads a large index section there (``Context.device``)."""
    lay = mf.layout
    if mf.joint:  # one job: the concatenation
        jobs = [(list(range(len(mf))), *c._read(mf.whole()))]
        mf.finish()
        return jobs
    segs = None if c.elementwise else segment_runs(list(zip(lay.sizes, lay.dtypes)), shape)
    known = _known_positions(c, mf, only, {i for g in segs if len(g) > 1 for i in g} if device and c.select is not None else None)
    value_runs = c.transform is None and c.select is None and not c.elementwise and isinstance(mf.payload, memoryview)
    sparse_runs = any(k is not None for k in known)  # every tensor's positions (of only) read at once
    transform_runs = c.transform is not None and c.transform.segmented and isinstance(mf.payload, memoryview)
    if c.elementwise:
        groups = runs(zip(lay.sizes, lay.dtypes))
    elif value_runs or sparse_runs or transform_runs:  # a zstd payload is decompressed section by section as the stages read it
        alone = set(range(len(mf))) - {i for g in segs for i in g}
        groups = sorted(segs + [[i] for i in alone])
    else:
        groups = [[i] for i in range(len(mf))]
    if only is not None:  # a run only partly asked for: its tensors asked for, each alone
        asked = []
        for g in groups:
            asked += [g] if all(i in only for i in g) else [[i] for i in g if i in only]
        groups = asked
    jobs = []
    for g in groups:
        if len(g) == 1:
            job = None
        elif sparse_runs:
            job = _sparse_run_job(c, mf, g, known)
        elif transform_runs:
            job = _transform_run_job(c, mf, g)
        else:
            job = _run_job(c, mf, g, value_runs)
        if job is None:  # alone, or a run whose tensors are not what the run expects
            jobs += [([i], *c._read(mf.tensor(i), known[i], device)) for i in g]
        else:
            jobs.append(job)
    if only is None:
        mf.finish()
    return jobs


def _run_job(c, mf, run, value_runs):
    """The job ``(run, ctx, payload)`` of a run of tensors read at once, or None (each is read
    alone): an elementwise codec's one section over the run (:func:`_values_frame`), or what the
    value stage's :meth:`codec.stage.Value.read_run` reads."""
    lay = mf.layout
    if not value_runs:
        fr = _values_frame(mf, [mf.tensor_sections[i] for i in run], [lay.sizes[i] for i in run], lay.dtypes[run[0]])
        return None if fr is None else (run, *c._read(fr))
    sizes = [lay.sizes[i] for i in run]
    dtype = lay.dtypes[run[0]]
    payload = _or_alone(c.value.read_run, np.frombuffer(mf.payload, np.uint8), [mf.tensor_sections[i] for i in run], sizes, dtype)
    return None if payload is None else (run, Context((sum(sizes),), dtype, name="tensors"), payload)


def _or_alone(read, *args):
    """``read(*args)`` (a stage's run reader), or None when it refuses the run: its tensors
    are then read alone, which raises the error that names the tensor and section."""
    try:
        return read(*args)
    except CorruptFrameError:
        return None


def _sparse_run_job(c, mf, run, known):
    """The job of a run of a sparse frame whose positions were read at once (``known``): the
    value stage reads every tensor's value sections (all but the select stage's first) at
    once (:meth:`codec.stage.Value.read_kept`), the positions counted from the run's first
    element (as a joint frame's); None (each tensor read alone) when it cannot."""
    lay = mf.layout
    ks = [known[i].size for i in run]
    if any(not mf.tensor_sections[i] for i in run):
        return None
    dtype, values = lay.dtypes[run[0]], [mf.tensor_sections[i][1:] for i in run]
    if c.value.elementwise:  # the run's values sections read as one
        fr = _values_frame(mf, values, ks, dtype)
        payload = None if fr is None else _or_alone(_read_values, c.value, fr, dtype)
    else:
        payload = _or_alone(c.value.read_kept, np.frombuffer(mf.payload, np.uint8), values, ks, dtype)
    if payload is None:
        return None
    ctx = Context((int(lay.starts[run[-1] + 1] - lay.starts[run[0]]),), lay.dtypes[run[0]], name="tensors")
    ctx.positions = np.concatenate([known[i] for i in run]) + np.repeat(lay.starts[run] - lay.starts[run[0]], ks)
    return run, ctx, payload


def _transform_run_job(c, mf, run):
    """The job of a run of a transform's frame read at once: the transform's sections
    (:attr:`codec.stage.Transform.segmented`'s ``read_segments``) and the value stage's
    (as :func:`_sparse_run_job` reads them), so that one inverse writes the run's
    concatenation; None (each tensor read alone) when it cannot."""
    lay = mf.layout
    secs = [mf.tensor_sections[i] for i in run]
    if any(not s for s in secs):
        return None
    data, dtype = np.frombuffer(mf.payload, np.uint8), lay.dtypes[run[0]]
    got = _or_alone(c.transform.read_segments, data, [s[0] for s in secs], [lay.sizes[i] for i in run], dtype)
    if got is None:
        return None
    tpay, counts = got
    vdtype = c.transform.domain_dtype(dtype)
    vctx = Context((sum(counts),), vdtype, name="tensors")
    if c.value.elementwise:
        fr = _values_frame(mf, [s[1:] for s in secs], counts, vdtype)
        vpay = None if fr is None else _or_alone(_read_values, c.value, fr, vdtype)
    else:
        vpay = _or_alone(c.value.read_kept, data, [s[1:] for s in secs], counts, vdtype)
    if vpay is None:
        return None
    return run, Context((int(lay.starts[run[-1] + 1] - lay.starts[run[0]]),), dtype, name="tensors"), (tpay, vctx, vpay)


def _read_values(value, fr, dtype):
    """What the value stage reads of the one-section frame ``fr`` (:func:`_values_frame`)."""
    rd = fr.reader()
    payload = value.read(rd, Context(fr.shape, dtype), fr.n)
    rd.done()
    return payload


def _known_positions(c, mf, only=None, in_runs=None) -> list:
    """Per tensor, its positions when the codec's select stage reads every tensor's (or those
    of ``only``) at once (:meth:`codec.stage.Select.positions_segments`); else None for each
    (each tensor's positions are then read, and refused, by the stage itself).  ``in_runs``
    (decoding into device arrays): the tensors of runs; any other whose first section has
    ``codec.pack.DEVICE_SECTION`` bytes or more is left to its own read, on the device."""
    none = [None] * len(mf)
    if c.select is None or c.transform is not None or not isinstance(mf.payload, memoryview):
        return none  # a zstd payload is decompressed section by section as the stages read it
    secs, sizes = mf.tensor_sections, mf.layout.sizes
    idx = range(len(mf)) if only is None else sorted(only)
    if in_runs is not None:
        idx = [i for i in idx if i in in_runs or not secs[i] or secs[i][0].raw_len < pack.DEVICE_SECTION]
    if not idx:
        return none
    got = _or_alone(c.select.positions_segments, np.frombuffer(mf.payload, np.uint8), [secs[i] for i in idx], [sizes[i] for i in idx], c.value)
    if got is None:
        return none
    for i, pos in zip(idx, got):
        none[i] = pos
    return none


def _values_frame(mf, sections, counts, dtype):
    """One v1-shaped frame holding a run's values sections as one, when ``sections[t]`` (tensor
    t's) is exactly one section of ``counts[t]`` items, all of the first one's kind and width,
    a whole number of bytes per item: over the payload itself when they lie end to end (an
    elementwise run's codes), else over a copy gathering them (a sparse run's kept values);
    None otherwise (each tensor is then read, and refused, on its own)."""
    first = sections[0][0] if sections and len(sections[0]) == 1 else None
    if first is None or first.bits % 8:
        return None
    for secs, n in zip(sections, counts):
        if len(secs) != 1 or (secs[0].kind, secs[0].bits, secs[0].count) != (first.kind, first.bits, n):
            return None
    total = sum(counts)
    raw = sum(secs[0].raw_len for secs in sections)
    if all(b[0].offset == a[0].offset + a[0].raw_len for a, b in zip(sections, sections[1:])):
        payload, at = mf.payload, first.offset
    else:
        data = np.frombuffer(mf.payload, np.uint8)
        payload, at = memoryview(np.concatenate([data[s[0].offset : s[0].offset + s[0].raw_len] for s in sections])), 0
    info = SectionInfo(first.kind, first.encoding, first.bits, total, raw, raw, at)
    return Frame(payload, VERSION, mf.flags, dtype, (total,), mf.spec, [info], 0)


def _whole(c, ctx, payload, dtype, reuse: bool, device: bool = False) -> np.ndarray:
    """A run's (or a joint frame's) values decoded at once into ``dtype``: into this
    thread's reused buffer when ``reuse`` (small, and only read before the next call), else a
    new array; with ``device``, a new device array (the codes cross the link, not the values)."""
    if device:
        from codec.device import empty

        whole = empty(ctx.n, dtype)
    else:
        whole = scratch(ctx.n, dtype) if reuse and ctx.n <= SEGMENT_ELEMENTS else np.empty(ctx.n, dtype)
    c._write(ctx, payload, whole, SET)
    return whole


def decode(c, mf, out=None):
    """``codec.decode_many``: the parsed frame ``mf``, which the codec ``c`` made, decoded."""
    targets = _targets(c, mf, out, add=False)
    jobs = _read_jobs(c, mf, device=on_device(*targets))
    spans = device_spans([idx for idx, _, _ in jobs], targets)  # device outputs end to end: a job written at once
    lay = mf.layout
    results = [None] * len(mf)
    for idx, ctx, payload in jobs:
        if len(idx) == 1 and not mf.joint:
            i = idx[0]
            target = targets[i] if targets[i] is not None else np.empty(lay.sizes[i], lay.dtypes[i])
            c._write(ctx, payload, target, SET)
            results[i] = target.reshape(lay.shapes[i])
        elif len(idx) > 1 and idx[0] in spans:  # device outputs end to end: the job written at once
            c._write(ctx, payload, spans[idx[0]], SET)
            for i in idx:
                results[i] = targets[i]
        elif c.select is not None and out is not None:  # a joint sparse frame or a sparse run: its pairs, per tensor
            for i, (pos, vals) in zip(idx, _split_pairs(mf, idx, ctx.positions, c._kept(ctx, payload))):
                scatter_checked(vals, pos, targets[i], SET)  # positions the stage checked
                results[i] = targets[i]
        else:  # a run, or a joint frame: each tensor a view of one array, or copied into its out
            dev = out is not None and on_device(targets[idx[0]])
            whole = _whole(c, ctx, payload, ctx.dtype, reuse=out is not None, device=dev)
            for i in idx:
                at = lay.starts[i] - lay.starts[idx[0]]
                part = whole[at : at + lay.sizes[i]]
                if targets[i] is not None:
                    if not dev:
                        np.copyto(targets[i], part)
                    elif part.size:  # (device to device)
                        targets[i].copy_to_device(part)
                    part = targets[i]
                results[i] = part.reshape(lay.shapes[i])
    if out is not None:
        return out
    return results if lay.names is None else dict(zip(lay.names, results))


def decode_add(c, mf, out, subtract=False):
    """``codec.decode_add_many`` of the parsed frame ``mf``, which the codec ``c`` made."""
    targets = _targets(c, mf, out, add=True)
    jobs = _read_jobs(c, mf, device=on_device(*targets))
    _add_jobs(c, mf, jobs, targets, SUB if subtract else ADD, device_spans([idx for idx, _, _ in jobs], targets))
    return out


def subtract(c, mf, targets: dict, shape: RunShape = RUNS, spans: dict | None = None) -> None:
    """``targets[i] -= decoded tensor i`` (flat arrays of the frame's dtypes, rounded once as
    ``decode_add_many`` does) for the tensors ``targets`` names (the others are not read):
    the error-feedback step of the tensors a many-tensor run coded (``shape`` as
    :func:`sections` took it, so they are read in the same runs).  ``spans``: per run whose
    targets are consecutive slices of one flat array (``{first index: that array}``), the
    array, which a run then updates at once (one scatter)."""
    full = [targets.get(i) for i in range(len(mf))]
    _add_jobs(c, mf, _read_jobs(c, mf, set(targets), shape, on_device(*targets.values())), full, SUB, spans or {})


def _add_jobs(c, mf, jobs, targets, mode, spans=None) -> None:
    """``targets[i] (+|-)= decoded tensor i`` for every tensor of ``jobs`` (from
    :func:`_read_jobs`); ``spans``: per job of several tensors whose targets are consecutive
    slices of one flat array (keyed by its first tensor), that array, updated at once."""
    for idx, ctx, payload in jobs:
        span = spans.get(idx[0]) if spans and len(idx) > 1 else None
        if len(idx) == 1 and not mf.joint:
            c._write(ctx, payload, targets[idx[0]], mode)
        elif span is not None and c.select is not None:  # the run's pairs, counted from its first element, written
            c._write(ctx, payload, span, mode)  # as one tensor's (a 16-bit output: the dense decoded values added once)
        elif c.select is not None:  # a joint sparse frame or a sparse run: each tensor's share of the pairs
            for i, (pos, vals) in zip(idx, _split_pairs(mf, idx, ctx.positions, c._kept(ctx, payload))):
                if targets[i].dtype in WIDE:
                    scatter_checked(vals, pos, targets[i], mode)  # positions the stage checked
                else:  # as Codec._write adds into a 16-bit array: the dense decoded tensor, once rounded
                    wide = Memory(on_device(targets[i])).empty(targets[i].size, vals.dtype)  # where the target lives
                    scatter_checked(vals, pos, wide, SET)
                    store(wide, targets[i], mode)
        else:  # a run, or a joint dense frame: the decoded values exactly (the accumulator dtype
            # of the frame's: a narrow frame's codes may decode beyond its own dtype's range)
            whole = _whole(c, ctx, payload, wide_dtype(ctx.dtype), reuse=True, device=on_device(targets[idx[0]]))
            if span is not None:
                store(whole, span, mode)
                continue
            for i in idx:
                at = mf.layout.starts[i] - mf.layout.starts[idx[0]]
                store(whole[at : at + targets[i].size], targets[i], mode)  # rounded once, as decode_add


def decode_sparse(c, mf) -> list:
    """``codec.decode_sparse_many`` of the parsed frame ``mf``, which the codec ``c`` made: the
    jobs decoding reads (every tensor's positions at once, the small tensors' values in runs),
    each tensor's pairs split off its job's."""
    if c.select is None:
        raise CodecValueError(f"frame: {mf.spec!r} has no select stage, so the frame is not sparse; use codec.decode_many")
    pairs = [None] * len(mf)
    for idx, ctx, payload in _read_jobs(c, mf):
        kept = c._kept(ctx, payload)
        if len(idx) == 1 and not mf.joint:
            pairs[idx[0]] = (ctx.positions, kept)
        else:  # a run, or a joint frame's concatenation
            for i, pair in zip(idx, _split_pairs(mf, idx, ctx.positions, kept)):
                pairs[i] = pair
    return pairs


def _split_pairs(mf, idx, positions, values) -> list:
    """The sorted positions (and their values) of consecutive tensors ``idx`` coded as one (a
    joint frame, or a run of a sparse frame), counted from the first one's first element, as
    each tensor's own pairs."""
    if not len(idx):
        return []
    starts = mf.layout.starts[idx[0] : idx[-1] + 2] - mf.layout.starts[idx[0]]
    cut = np.searchsorted(positions, starts)
    return [(positions[cut[t] : cut[t + 1]] - starts[t], values[cut[t] : cut[t + 1]]) for t in range(len(starts) - 1)]
