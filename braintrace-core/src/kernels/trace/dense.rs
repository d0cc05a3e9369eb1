//! The fused dense trace loop: per input row and sample, the trace row of
//! `O` outputs × `S` states updated in place and the gradient row
//! accumulated, in blocks of [`LANES`](super::LANES) outputs.

use super::{Dims, KernelFloat, Operands, Solve, Store, LANES};

/// Split `e` (`batch` samples of `rows × row_len`) into `rows_per`-row
/// blocks: `parts[k][b]` is block `k`'s run of sample `b`.
pub(crate) fn split_rows<T>(
    e: &mut [T],
    batch: usize,
    rows: usize,
    row_len: usize,
    rows_per: usize,
) -> Vec<Vec<&mut [T]>> {
    let blocks = rows.div_ceil(rows_per);
    let mut parts: Vec<Vec<&mut [T]>> = (0..blocks).map(|_| Vec::with_capacity(batch)).collect();
    for sample in e.chunks_mut(rows * row_len) {
        for (k, piece) in sample.chunks_mut(rows_per * row_len).enumerate() {
            parts[k].push(piece);
        }
    }
    parts
}

/// The loop. `e`: `(batch, i, o·s)`, rows laid out as [`Blocked`] says,
/// stored as `E` ([`Store`]: loaded into `T`, computed with, rounded back);
/// `grad`: `(i, o)`; operands as [`Operands`] says.
///
/// Input rows are split into as many blocks as `threads` (one block when it
/// is 1), run on the current rayon pool: each block owns its gradient rows
/// and, per sample, one contiguous run of trace rows, so no two threads
/// write the same memory and the result does not depend on the number of
/// threads. Within a block the trace is streamed in memory order, sample by
/// sample, each sample's rows in one run; the block's gradient rows are
/// read again for every sample (from L2 or L3: 1 MiB at `528 × 512`).
///
/// Long runs are what the hardware prefetchers need. Tiles of about 64 KiB
/// of gradient rows, each sample's rows of a tile streamed before the next
/// tile (so the gradient tile stayed in L1/L2), cut the runs to 64 KiB and
/// were slower on an AMD Zen 5 (L2 1 MiB; `bench_learn --floor`, one
/// thread, D-RTRL, ours over the trace floor): GRU 512×64 1.35–1.39× →
/// 0.94–0.98×, LIF 512×64 1.27–1.40× → 0.91–1.02×, GRU 512×16 1.34–1.37× →
/// 0.89–0.99×; hidden 128 (a tile there held 128 of 144 rows) unchanged.
pub(crate) fn fused<T: KernelFloat, E: Store<T>>(
    dims: Dims,
    e: &mut [E],
    grad: &mut [T],
    ops: Operands<'_, T>,
    solve: Solve,
    threads: usize,
) {
    let Dims {
        batch,
        i: ni,
        o: no,
        s,
    } = dims;
    if batch == 0 || ni == 0 || no == 0 || s == 0 {
        return;
    }
    let ops = Operands {
        g: ops.g.filter(|_| solve != Solve::None),
        ..ops
    };
    let blocks = threads.clamp(1, ni);
    let rows_per = ni.div_ceil(blocks);
    let ctx = Ctx {
        dims,
        rows_per,
        ops,
        solve,
        prefetch: std::mem::size_of_val(e) >= PREFETCH_MIN_BYTES,
    };
    if blocks == 1 {
        // One block: each sample's rows are one run (in a list this thread
        // keeps, no allocation per step).
        crate::kernels::spare::with_slices(|part| {
            part.extend(e.chunks_mut(ni * no * s));
            block(&ctx, 0, part, grad);
        });
    } else {
        use rayon::prelude::*;
        split_rows(e, batch, ni, no * s, rows_per)
            .into_par_iter()
            .zip(grad.par_chunks_mut(rows_per * no))
            .enumerate()
            .for_each(|(k, (mut part, grad))| block(&ctx, k, &mut part, grad));
    }
}

/// What every block of one fused step reads.
pub(crate) struct Ctx<'a, T> {
    pub(crate) dims: Dims,
    pub(crate) rows_per: usize,
    pub(crate) ops: Operands<'a, T>,
    pub(crate) solve: Solve,
    /// Whether the trace runs are prefetched in software
    /// ([`PREFETCH_MIN_BYTES`]).
    pub(crate) prefetch: bool,
}

/// Run block `k`: with the storage type's own loop when it has one for
/// this CPU and shape ([`Store::dense_block`]), else [`block_same`] for
/// traces stored in the compute type, [`block_narrow`] for narrower ones.
#[inline]
pub(crate) fn block<T: KernelFloat, E: Store<T>>(
    ctx: &Ctx<'_, T>,
    k: usize,
    part: &mut [&mut [E]],
    grad: &mut [T],
) {
    if E::dense_block(ctx, k, part, grad) {
        // A loop written for this storage type ran it.
    } else if std::mem::size_of::<E>() < std::mem::size_of::<T>() {
        block_narrow(ctx, k, part, grad)
    } else {
        block_same(ctx, k, part, grad)
    }
}

crate::kernels::avx2_dispatch!(
    /// Run block `k`, with AVX2 when the CPU has it (the same arithmetic —
    /// no fused multiply-adds are introduced — in 8 lanes instead of 4).
    pub(crate) fn block_same<T: KernelFloat, E: Store<T>>(ctx: &Ctx<'_, T>, k: usize, part: &mut [&mut [E]], grad: &mut [T]) => block_scaled_or_not
);

crate::kernels::avx2_dispatch!(avx512:
    /// [`block_same`] for traces stored narrower than they are computed
    /// with, with AVX-512 when the CPU has it: the conversions (a bf16
    /// rounding is about a dozen integer operations per vector) made the
    /// 8-lane loop bound by instructions rather than memory (GRU 512×64,
    /// one core: bf16 traces 28 ms/step of CPU time against 24 with f32).
    pub(crate) fn block_narrow<T: KernelFloat, E: Store<T>>(ctx: &Ctx<'_, T>, k: usize, part: &mut [&mut [E]], grad: &mut [T]) => block_scaled_or_not
);

/// The block, compiled separately with and without a transform's
/// derivative (the loop without one stays as tight as it was).
#[inline(always)]
pub(crate) fn block_scaled_or_not<T: KernelFloat, E: Store<T>>(
    ctx: &Ctx<'_, T>,
    k: usize,
    part: &mut [&mut [E]],
    grad: &mut [T],
) {
    if ctx.ops.scale.is_some() {
        block_body::<T, E, true>(ctx, k, part, grad);
    } else {
        block_body::<T, E, false>(ctx, k, part, grad);
    }
}

#[inline(always)]
pub(crate) fn block_body<T: KernelFloat, E: Store<T>, const SCALED: bool>(
    ctx: &Ctx<'_, T>,
    k: usize,
    part: &mut [&mut [E]],
    grad: &mut [T],
) {
    let Dims {
        i: ni, o: no, s, ..
    } = ctx.dims;
    let Operands { x, d, df, g, scale } = ctx.ops;
    let solve = ctx.solve;
    let row_len = no * s;
    let i0 = k * ctx.rows_per;
    let rows = grad.len() / no;
    // The instantaneous term of a row with a transform: x Df f'(W)[i, :].
    let mut inst: Vec<T> = if SCALED {
        vec![T::zero(); row_len]
    } else {
        Vec::new()
    };
    let elem = std::mem::size_of::<E>();
    for (b, piece) in part.iter_mut().enumerate() {
        // The piece's bytes asked for in advance so far (see [`Ahead`]).
        let ahead = Ahead::new(piece, ctx.prefetch);
        let mut fetched = 0;
        let db = &d[b * no * s * s..(b + 1) * no * s * s];
        let dfb = &df[b * no * s..(b + 1) * no * s];
        let gb = g.map(|g| &g[b * no * s..(b + 1) * no * s]);
        for (ii, (row, grow)) in piece[..rows * row_len]
            .chunks_exact_mut(row_len)
            .zip(grad.chunks_exact_mut(no))
            .enumerate()
        {
            ahead.fetch(&mut fetched, (ii + 1) * row_len * elem + PREFETCH_BYTES);
            let xi = x.map(|x| x[b * ni + i0 + ii]).unwrap_or_else(T::one);
            let (xi, f): (T, &[T]) = match scale.filter(|_| SCALED) {
                Some(sc) => {
                    let srow = &sc[(i0 + ii) * no..(i0 + ii + 1) * no];
                    // Block by block, as `Blocked` lays the row out.
                    let mut at = 0;
                    for j in (0..no).step_by(LANES) {
                        let w = LANES.min(no - j);
                        for _ in 0..s {
                            for ((v, &f), &p) in inst[at..at + w]
                                .iter_mut()
                                .zip(&dfb[at..at + w])
                                .zip(&srow[j..j + w])
                            {
                                *v = xi * f * p;
                            }
                            at += w;
                        }
                    }
                    (T::one(), &inst)
                }
                None => (xi, dfb),
            };
            match s {
                1 => row1(row, grow, xi, db, f, gb, solve),
                2 => row2(row, grow, xi, db, f, gb, solve),
                _ => row_any(s, row, grow, xi, db, f, gb, solve),
            }
        }
    }
}

/// How far ahead of the row being updated a trace run is asked for in
/// software ([`Ahead`]), in bytes. The hardware prefetchers alone left the
/// fused loop well short of the memory's bandwidth on an AMD Zen 5 (one
/// core, GRU 512×64, a stand-alone copy of the loop: f32 7.2 ms/step, bf16 7.4;
/// with 6 KiB asked for ahead: 6.0 and 5.0; 2 KiB: 6.4 and 5.7; 12 KiB:
/// no better than 6). Into L1 (`T0`): into L2 only was slower (bf16 4.7
/// against 4.3 ms with the hand-written bf16 loop).
pub(crate) const PREFETCH_BYTES: usize = 6 << 10;

/// The smallest trace (one kernel call's, in bytes) that is prefetched in
/// software: a trace the last-level cache may hold gains nothing from it
/// and pays the hints (GRU 128×64, f32 traces of 4.7 MB per relation:
/// 0.44 → 0.47 ms/step with them).
pub(crate) const PREFETCH_MIN_BYTES: usize = 8 << 20;

/// A trace run's address range, for [`Ahead::fetch`] while the run itself
/// is borrowed by the loop.
#[derive(Clone, Copy)]
pub(crate) struct Ahead {
    base: *const u8,
    len: usize,
}

impl Ahead {
    /// `run`'s range, or an empty one (nothing prefetched) unless `on`.
    pub(crate) fn new<E>(run: &[E], on: bool) -> Self {
        Ahead {
            base: run.as_ptr().cast(),
            len: if on { std::mem::size_of_val(run) } else { 0 },
        }
    }

    /// Ask for the run's cache lines from byte `*done` up to byte `upto`
    /// (at most the run's end), one hint per 64 bytes; `*done` moves on.
    #[inline(always)]
    pub(crate) fn fetch(self, done: &mut usize, upto: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let upto = upto.min(self.len);
            while *done < upto {
                // SAFETY: a prefetch is a hint: it never faults and changes
                // no memory; the address lies inside the run
                // (`*done < len`).
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(self.base.wrapping_add(*done).cast());
                }
                *done += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (done, upto);
    }
}

/// One trace row, one state per neuron: `D` is diagonal.
#[inline(always)]
pub(crate) fn row1<T: KernelFloat, E: Store<T>>(
    row: &mut [E],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    solve: Solve,
) {
    let no = row.len();
    // Exact-length slices and zipped iterators: no bounds checks, so the
    // loop vectorises.
    let (db, dfb, grow) = (&db[..no], &dfb[..no], &mut grow[..no]);
    match (gb, solve) {
        (Some(gb), Solve::After) => {
            for (((e, gr), (&d, &f)), &gv) in row
                .iter_mut()
                .zip(grow.iter_mut())
                .zip(db.iter().zip(dfb))
                .zip(&gb[..no])
            {
                let v = E::flush(d * e.load() + xi * f);
                *e = E::store(v);
                *gr = *gr + gv * v;
            }
        }
        (Some(gb), Solve::Before) => {
            for (((e, gr), (&d, &f)), &gv) in row
                .iter_mut()
                .zip(grow.iter_mut())
                .zip(db.iter().zip(dfb))
                .zip(&gb[..no])
            {
                let old = e.load();
                *gr = *gr + gv * old;
                *e = E::store(E::flush(d * old + xi * f));
            }
        }
        _ => {
            for (e, (&d, &f)) in row.iter_mut().zip(db.iter().zip(dfb)) {
                *e = E::store(E::flush(d * e.load() + xi * f));
            }
        }
    }
}

/// One trace row, two states per neuron (LIF: `i`, `v`): `D` is 2 × 2.
/// Every operand is laid out as [`Blocked`] says: per block of `w`
/// outputs, `row` = `[e₀ | e₁]`, `db` = `[D₀₀ | D₀₁ | D₁₀ | D₁₁]`, `dfb`
/// and `gb` = `[·₀ | ·₁]`.
#[inline(always)]
pub(crate) fn row2<T: KernelFloat, E: Store<T>>(
    row: &mut [E],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    solve: Solve,
) {
    let no = grow.len();
    let before = solve == Solve::Before;
    // Full blocks through exact chunks (each loop one vector wide), then
    // the narrower last block.
    let full = no - no % LANES;
    let (row, row_r) = row.split_at_mut(2 * full);
    let (grow, grow_r) = grow.split_at_mut(full);
    let (db, db_r) = db[..4 * no].split_at(4 * full);
    let (dfb, dfb_r) = dfb[..2 * no].split_at(2 * full);
    let blocks = row
        .chunks_exact_mut(2 * LANES)
        .zip(grow.chunks_exact_mut(LANES))
        .zip(db.chunks_exact(4 * LANES))
        .zip(dfb.chunks_exact(2 * LANES));
    match gb {
        Some(gb) => {
            let (gb, gb_r) = gb[..2 * no].split_at(2 * full);
            for ((((e, gr), d), f), g) in blocks.zip(gb.chunks_exact(2 * LANES)) {
                pair(e, gr, xi, d, f, Some(g), before);
            }
            pair(row_r, grow_r, xi, db_r, dfb_r, Some(gb_r), before);
        }
        None => {
            for (((e, gr), d), f) in blocks {
                pair(e, gr, xi, d, f, None, before);
            }
            pair(row_r, grow_r, xi, db_r, dfb_r, None, before);
        }
    }
}

/// [`row2`]'s block: `grow.len()` outputs, the operands laid out as
/// [`Blocked`] says.
#[inline(always)]
pub(crate) fn pair<T: KernelFloat, E: Store<T>>(
    e: &mut [E],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    before: bool,
) {
    let w = grow.len();
    let (e0, e1) = e.split_at_mut(w);
    let (e0, e1) = (&mut e0[..w], &mut e1[..w]);
    let (d00, d01, d10, d11) = (
        &db[..w],
        &db[w..2 * w],
        &db[2 * w..3 * w],
        &db[3 * w..4 * w],
    );
    let (f0, f1) = (&dfb[..w], &dfb[w..2 * w]);
    match gb {
        Some(gb) => {
            let (g0, g1) = (&gb[..w], &gb[w..2 * w]);
            for o in 0..w {
                let (c0, c1) = (e0[o].load(), e1[o].load());
                let n0 = E::flush(d00[o] * c0 + d01[o] * c1 + xi * f0[o]);
                let n1 = E::flush(d10[o] * c0 + d11[o] * c1 + xi * f1[o]);
                let (s0, s1) = if before { (c0, c1) } else { (n0, n1) };
                grow[o] = grow[o] + g0[o] * s0 + g1[o] * s1;
                e0[o] = E::store(n0);
                e1[o] = E::store(n1);
            }
        }
        None => {
            for o in 0..w {
                let (c0, c1) = (e0[o].load(), e1[o].load());
                e0[o] = E::store(E::flush(d00[o] * c0 + d01[o] * c1 + xi * f0[o]));
                e1[o] = E::store(E::flush(d10[o] * c0 + d11[o] * c1 + xi * f1[o]));
            }
        }
    }
}

/// One trace row, any number of states per neuron, laid out as [`row2`]'s.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn row_any<T: KernelFloat, E: Store<T>>(
    s: usize,
    row: &mut [E],
    grow: &mut [T],
    xi: T,
    db: &[T],
    dfb: &[T],
    gb: Option<&[T]>,
    solve: Solve,
) {
    let no = grow.len();
    let mut out: Vec<T> = dfb[..s * no].iter().map(|&f| xi * f).collect();
    let cur: Vec<T> = row[..s * no].iter().map(|&e| e.load()).collect();
    for j in (0..no).step_by(LANES) {
        let w = LANES.min(no - j);
        let (e, o, d) = (
            &cur[s * j..s * (j + w)],
            &mut out[s * j..s * (j + w)],
            &db[s * s * j..s * s * (j + w)],
        );
        for a in 0..s {
            let acc = &mut o[a * w..(a + 1) * w];
            for c in 0..s {
                let dm = &d[(a * s + c) * w..(a * s + c + 1) * w];
                for ((v, &dv), &ev) in acc.iter_mut().zip(dm).zip(&e[c * w..(c + 1) * w]) {
                    *v = *v + dv * ev;
                }
            }
        }
        if let Some(gb) = gb {
            let src: &[T] = if solve == Solve::Before { e } else { o };
            let gj = &gb[s * j..s * (j + w)];
            for a in 0..s {
                for ((gr, &gv), &v) in grow[j..j + w]
                    .iter_mut()
                    .zip(&gj[a * w..(a + 1) * w])
                    .zip(&src[a * w..(a + 1) * w])
                {
                    *gr = *gr + gv * v;
                }
            }
        }
    }
    for (e, &v) in row.iter_mut().zip(&out) {
        *e = E::store(E::flush(v));
    }
}
