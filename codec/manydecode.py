"""Phase 2 of a many-tensor decode: ``codec.decode_many``, ``decode_add_many`` and
``decode_sparse_many`` of a parsed v2 frame (:mod:`codec.manyframe`), and :func:`subtract`,
error feedback's decoding of the tensors its runs coded.

Every tensor's sections are read first (:mod:`codec.readruns`, phase 1: a run at once, with
the stages' ``read_run``, ``positions_segments``, ``read_kept`` and ``read_segments``), then
written: a tensor alone through the codec's pipeline, a run where its tensors lie in one
kernel call where the stage can (:meth:`codec.stage.Value.write_segments`,
:meth:`codec.stage.Transform.inverse_segments`, ``scatter_segments``), else through one
buffer of the run.  A sparse frame with raw values of one dtype decoded into host arrays
skips both phases' per-tensor steps (:func:`_pairs_at_once`).  Encoding is
:mod:`codec.many`.
"""

from __future__ import annotations

import numpy as np

from codec.device import empty, Memory, spans as device_spans
from codec.dtypes import checked_out, host_like, on_device
from codec.errors import CodecTypeError, CodecValueError
from codec.modes import ADD, SET, SUB
from codec.ops import offsets, scatter_checked, scatter_segments, scratch, store, WIDE, wide_dtype
from codec.payloadcheck import reading
from codec.readruns import read_jobs, reads_positions, reads_runs
from codec.runs import RUNS, SEGMENT_ELEMENTS, SEGMENTED_MIN, RunShape
from codec import device
from codec.frame import SectionKind
from codec.kernels import backend
from codec.section import Encoding


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
        keys, arrays = names, [out[k] for k in names]
    elif isinstance(out, (list, tuple)):
        if len(out) != count:
            raise CodecValueError(f"out: {len(out)} arrays for a frame of {count} tensors")
        keys, arrays = range(count), list(out)
    else:
        raise CodecTypeError(f"out: expected a dict or list of arrays, got {type(out).__name__}")
    lay = mf.layout

    plain = all(type(a) is np.ndarray for a in arrays)  # (host arrays: no device array among them)
    check = device.checked_out if not plain and device.many_on_device(c.stages, arrays, "out") else checked_out  # (device arrays: decoding writes on the device)
    # each array's name for an error (out['w'] or out[3]) is formed only when it is refused
    return [check(a, lay.sizes[i], lay.shapes[i], lay.dtypes[i], add=add, argname=_Named(k)) for i, (k, a) in enumerate(zip(keys, arrays))]


class _Named:
    """How an error names ``out``'s array under key ``k`` (``out['w']``, ``out[3]``): formed
    when a check fails and formats it, not for every array of every decode."""

    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __str__(self) -> str:
        return f"out[{self.key!r}]"


def _whole(c, ctx, payload, dtype, reuse: bool, device: bool = False, check=None) -> np.ndarray:
    """A run's (or a joint frame's) values decoded at once into ``dtype``: into this
    thread's reused buffer when ``reuse`` (small, and only read before the next call), else a
    new array; with ``device``, a new device array (the codes cross the link, not the values);
    ``check``: the frame's payload check, noted as the codes are read (``Codec._write``)."""
    if device:
        whole = empty(ctx.n, dtype)
    else:
        whole = scratch(ctx.n, dtype) if reuse and ctx.n <= SEGMENT_ELEMENTS else np.empty(ctx.n, dtype)
    c._write(ctx, payload, whole, SET, check)
    return whole


def decode(c, mf, out=None, like=None):
    """``codec.decode_many``: the parsed frame ``mf``, which the codec ``c`` made, decoded
    (new arrays of ``like``'s kind without ``out``: on its device for a device array)."""
    targets = _targets(c, mf, out, add=False)
    lay = mf.layout
    dev = on_device(*targets) or (out is None and on_device(like))
    if dev and out is None:  # new device arrays: the stages and dtypes checked first
        device.check_stages(c.stages, "like")
        for dt in set(lay.dtypes):
            device.check_dtype(dt, "like")
    mem = Memory(dev)
    check = c.payload_check(mf.check, dev)  # completed as the codes are decoded, or verified now
    written = None if dev or check is not None else _pairs_at_once(c, mf, targets)
    if written is not None:  # (new arrays: of like's kind, named as the frame names them)
        results = written if like is None else [host_like(r, like) for r in written]
        return out if out is not None else results if lay.names is None else dict(zip(lay.names, results))
    segmented = _segmented(c, mf, targets, dev)
    with reading(check):
        jobs = read_jobs(c, mf, device=dev, whole_runs=segmented, in_pass=check is not None)
    spans = device_spans([idx for idx, _, _ in jobs], targets)  # device outputs end to end: a job written at once
    results = [None] * len(mf)  # (new arrays only: with out, the caller's arrays are returned)
    together = _inverse_together(c, mf, jobs, targets) if out is not None and not dev and not mf.joint else set()
    for idx, ctx, payload in jobs:
        if len(idx) == 1 and idx[0] in together:  # (written with the others of its dtype)
            continue
        if len(idx) == 1 and not mf.joint:
            i = idx[0]
            target = targets[i] if targets[i] is not None else mem.empty(lay.sizes[i], lay.dtypes[i])
            c._write(ctx, payload, target, SET, check)
            results[i] = target.reshape(lay.shapes[i])
        elif len(idx) > 1 and idx[0] in spans:  # device outputs end to end: the job written at once
            c._write(ctx, payload, spans[idx[0]], SET)
        elif c.select is not None and out is not None:  # a joint sparse frame or a sparse run: its pairs, per tensor
            _scatter_pairs(mf, idx, ctx.positions, c._kept(ctx, payload), targets, SET, lambda i, pos, vals: scatter_checked(vals, pos, targets[i], SET))
        elif segmented and c.value.write_segments(payload, [targets[i] for i in idx], SET, check):
            continue  # every tensor of the run written where it lies, in one pass
        else:  # a run, or a joint frame: each tensor a view of one array, or copied into its out
            whole = _whole(c, ctx, payload, ctx.dtype, reuse=out is not None, device=dev, check=check)
            first = lay.at[idx[0]] if idx else 0
            for i in idx:
                at = lay.at[i] - first
                part = whole[at : at + lay.sizes[i]]
                if targets[i] is None:
                    results[i] = part.reshape(lay.shapes[i])
                elif not dev:
                    np.copyto(targets[i], part)
                elif part.size:  # (device to device)
                    targets[i].copy_to_device(part)
    if check is not None:
        check.verify(targets)  # a caller's outs: NaN when the frame is damaged
    if out is not None:
        return out
    if like is not None:
        results = [device.as_like(r, like) if dev else host_like(r, like) for r in results]
    return results if lay.names is None else dict(zip(lay.names, results))


def _pairs_at_once(c, mf, targets) -> list | None:
    """A sparse frame whose kept values are stored as they are (value stage ``none``, no
    transform or byte stage, separate tensors of one float32/float64 dtype, an uncompressed
    payload, its CRC-32C already verified) decoded into host arrays (``targets``; None: new
    ones), returned in their tensors' shapes: its values sections checked as the value stage
    reads them (values, raw, the dtype's width), then the index coder's stages read, check
    and write every pair in one kernel call (the select stage's ``pairs_run``), and the
    others read every tensor's positions at once (``positions_run``, which checks them) and
    scatter all the pairs with one ``scatter_segments`` call (each array zeroed where nothing
    is kept).  The general path's reads and writes, without its per-tensor stages: the
    sample's top-k decode 256 -> ~100 µs.  None, having written nothing, when the frame or
    the arrays are not that: the general path then reads it, and refuses what it refuses,
    naming the tensor."""
    lay = mf.layout
    dt = lay.dtypes[0] if len(lay) else None
    if c.select is None or c.value.name != "none" or c.transform is not None or c.post or mf.joint or len(mf) < 2 or not reads_positions(c, mf):
        return None
    if dt not in WIDE or lay.dtypes.count(dt) != len(lay) or any(t is not None and t.dtype is not dt and t.dtype != dt for t in targets):
        return None
    secs = mf.tensor_sections
    bits = dt.itemsize * 8
    for s in secs:  # a select stage's section, then its values, raw, in the dtype
        if len(s) != 2 or s[1].kind != SectionKind.VALUES or s[1].bits != bits or s[1].encoding != Encoding.RAW or s[1].raw_len != s[1].stored_len:
            return None
    payload = np.frombuffer(mf.payload, np.uint8)
    arrays = [t if t is not None else np.empty(n, dt) for t, n in zip(targets, lay.sizes)]
    done = c.select.pairs_run(payload, secs, lay.starts, arrays)  # (the index coder's stages: one kernel call)
    if done is not None:
        return [a.reshape(shape) for a, shape in zip(arrays, lay.shapes)] if done else None
    try:
        got = c.select.positions_run(payload, secs, lay.sizes, c.value)
    except CodecValueError:  # (CorruptFrameError: the general path names it)
        return None
    counts = [s[1].count for s in secs]
    if got is None or got[1].tolist() != offsets(counts).tolist():
        return None
    idx, kstarts = got
    starts = lay.starts
    backend("index", idx).absolute_positions(idx, kstarts, np.array(starts), idx)  # (run positions, in place; writeable arrays: the encoder's signature)
    values = np.concatenate([payload[s[1].offset : s[1].offset + s[1].raw_len] for s in secs]).view(dt)
    if not scatter_segments(values, idx, starts, arrays, SET, kstarts=kstarts):
        return None
    return [a.reshape(shape) for a, shape in zip(arrays, lay.shapes)]


def _inverse_together(c, mf, jobs, targets) -> set:
    """The tensors of ``jobs`` read alone that the codec's transform writes together, one call
    per dtype (:meth:`codec.stage.Transform.inverse_segments`: PowerSGD's compressed
    matrices), written into their ``targets``: their indices."""
    if c.transform is None:
        return set()
    lay = mf.layout
    lone = [(idx[0], payload) for idx, _, payload in jobs if len(idx) == 1 and not c.transform.passes(lay.shapes[idx[0]])]
    done = set()
    for dt in {lay.dtypes[i] for i, _ in lone}:
        group = [(i, payload) for i, payload in lone if lay.dtypes[i] == dt]
        if len(group) > 1 and c.transform.inverse_segments(c.value, [p for _, p in group], [targets[i] for i, _ in group], SET):
            done.update(i for i, _ in group)
    return done


def decode_add(c, mf, out, subtract=False):
    """``codec.decode_add_many`` of the parsed frame ``mf``, which the codec ``c`` made."""
    targets = _targets(c, mf, out, add=True)
    dev = on_device(*targets)
    segmented = _segmented(c, mf, targets, dev)
    jobs = read_jobs(c, mf, device=dev, whole_runs=segmented)
    _add_jobs(c, mf, jobs, targets, SUB if subtract else ADD, device_spans([idx for idx, _, _ in jobs], targets), segmented)
    return out


def _segmented(c, mf, targets, device: bool) -> bool:
    """Whether decoding ``mf`` writes every run of an elementwise codec, or of a value stage
    that reads runs (a quantizer's: :func:`codec.readruns.reads_runs`), straight into its
    tensors' arrays (:meth:`codec.stage.Value.write_segments`), or scatters every run of a
    sparse codec whose positions are read at once (:func:`codec.readruns.reads_positions`)
    into them (one ``scatter_segments`` call): host targets given, each of its tensor's own
    float32/float64 dtype.  A run is then every consecutive tensor of one dtype (a whole
    model in one pass, no tensor through the pipeline on its own), and no buffer of it is
    formed.  Not below :data:`codec.runs.SEGMENTED_MIN` elements, where the kernels run
    serially anyway."""
    if device or mf.joint or any(t is None for t in targets) or sum(mf.layout.sizes) < SEGMENTED_MIN:
        return False
    if not (c.elementwise or reads_runs(c, mf) or reads_positions(c, mf)):
        return False
    return all(t.dtype == dt and dt in WIDE for t, dt in zip(targets, mf.layout.dtypes))


def subtract(c, mf, targets: dict, shape: RunShape = RUNS, spans: dict | None = None) -> None:
    """``targets[i] -= decoded tensor i`` (flat arrays of the frame's dtypes, rounded once as
    ``decode_add_many`` does) for the tensors ``targets`` names (the others are not read):
    the error-feedback step of the tensors a many-tensor run coded (``shape`` as
    :func:`sections` took it, so they are read in the same runs).  ``spans``: per run whose
    targets are consecutive slices of one flat array (``{first index: that array}``), the
    array, which a run then updates at once (one scatter)."""
    full = [targets.get(i) for i in range(len(mf))]
    _add_jobs(c, mf, read_jobs(c, mf, set(targets), shape, on_device(*targets.values())), full, SUB, spans or {})


def _add_jobs(c, mf, jobs, targets, mode, spans=None, segmented: bool = False) -> None:
    """``targets[i] (+|-)= decoded tensor i`` for every tensor of ``jobs`` (from
    :func:`codec.readruns.read_jobs`); ``spans``: per job of several tensors whose targets are consecutive
    slices of one flat array (keyed by its first tensor), that array, updated at once;
    ``segmented``: runs are written where their tensors lie (:func:`_segmented`)."""
    for idx, ctx, payload in jobs:
        span = spans.get(idx[0]) if spans and len(idx) > 1 else None
        if len(idx) == 1 and not mf.joint:
            c._write(ctx, payload, targets[idx[0]], mode)
        elif span is not None and c.select is not None:  # the run's pairs, counted from its first element, written
            c._write(ctx, payload, span, mode)  # as one tensor's (a 16-bit output: the dense decoded values added once)
        elif c.select is not None:  # a joint sparse frame or a sparse run: each tensor's share of the pairs
            _scatter_pairs(mf, idx, ctx.positions, c._kept(ctx, payload), targets, mode, lambda i, pos, vals: _add_pairs(pos, vals, targets[i], mode))
        elif segmented and c.value.write_segments(payload, [targets[i] for i in idx], mode):
            continue
        else:  # a run, or a joint dense frame: the decoded values exactly (the accumulator dtype
            # of the frame's: a narrow frame's codes may decode beyond its own dtype's range)
            whole = _whole(c, ctx, payload, wide_dtype(ctx.dtype), reuse=True, device=on_device(targets[idx[0]]))
            if span is not None:
                store(whole, span, mode)
                continue
            first = mf.layout.at[idx[0]] if idx else 0
            for i in idx:
                at = mf.layout.at[i] - first
                store(whole[at : at + targets[i].size], targets[i], mode)  # rounded once, as decode_add


def decode_sparse(c, mf) -> list:
    """``codec.decode_sparse_many`` of the parsed frame ``mf``, which the codec ``c`` made: the
    jobs decoding reads (every tensor's positions at once, the small tensors' values in runs),
    each tensor's pairs split off its job's."""
    if c.select is None:
        raise CodecValueError(f"frame: {mf.spec!r} has no select stage, so the frame is not sparse; use codec.decode_many")
    pairs = [None] * len(mf)
    for idx, ctx, payload in read_jobs(c, mf):
        kept = c._kept(ctx, payload)
        if len(idx) == 1 and not mf.joint:
            pairs[idx[0]] = (ctx.positions, kept)
        else:  # a run, or a joint frame's concatenation
            for i, pair in zip(idx, _split_pairs(mf, idx, ctx.positions, kept)):
                pairs[i] = pair
    return pairs


def _scatter_pairs(mf, idx, positions, values, targets, mode, each) -> None:
    """The sorted pairs of consecutive tensors ``idx`` coded as one (a joint frame, or a run of
    a sparse frame; positions counted from the first one's first element, checked) written
    into their ``targets`` (``mode``): at once where :func:`codec.ops.scatter_segments`
    takes them, else ``each(i, positions, values)`` with each tensor's own pairs."""
    starts = mf.layout.starts[idx[0] : idx[-1] + 2] - mf.layout.starts[idx[0]] if len(idx) else None
    if starts is not None and scatter_segments(values, positions, starts, [targets[i] for i in idx], mode):
        return
    for i, (pos, vals) in zip(idx, _split_pairs(mf, idx, positions, values)):
        each(i, pos, vals)


def _add_pairs(pos, vals, target, mode) -> None:
    """``target[pos] (+|-)= vals`` for one tensor's pairs (positions checked), rounded once."""
    if target.dtype in WIDE:
        scatter_checked(vals, pos, target, mode)
    else:  # as Codec._write adds into a 16-bit array: the dense decoded tensor, once rounded
        wide = Memory(on_device(target)).empty(target.size, vals.dtype)  # where the target lives
        scatter_checked(vals, pos, wide, SET)
        store(wide, target, mode)


def _split_pairs(mf, idx, positions, values) -> list:
    """The sorted positions (and their values) of consecutive tensors ``idx`` coded as one (a
    joint frame, or a run of a sparse frame), counted from the first one's first element, as
    each tensor's own pairs."""
    if not len(idx):
        return []
    starts = mf.layout.starts[idx[0] : idx[-1] + 2] - mf.layout.starts[idx[0]]
    cut = np.searchsorted(positions, starts)
    return [(positions[cut[t] : cut[t + 1]] - starts[t], values[cut[t] : cut[t + 1]]) for t in range(len(starts) - 1)]
