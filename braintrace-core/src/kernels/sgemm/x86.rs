//! The product kernels in AVX2+FMA and AVX-512F intrinsics: blocks of `C`
//! held in registers, one fused multiply-add per term, `k` in order (see
//! the parent module for the layout they read and the bits they give).

use super::{Panels, MR, MR512, NARROW, NARROW_GROUPS, NR};
use std::arch::x86_64::*;

/// Every panel, every block of up to 6 rows.
///
/// # Safety
///
/// As [`super::rows`] checks: AVX2 and FMA, `a` valid at
/// `r·rs + kk·cs` for `r < m`, `kk < k`, `b.k == k`, `b` valid for its
/// `⌈n/16⌉` panels of `k` rows of 16, `c` valid for writes at
/// `r·ldc + j` for `r < m`, `j < b.n` (no other thread's), `ldc ≥ b.n`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm(
    a: *const f32,
    rs: usize,
    cs: usize,
    m: usize,
    k: usize,
    b: Panels,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    // SAFETY: the caller upholds this function's `# Safety` contract
    // (the CPU features it is built for, and pointers valid for every
    // element the loops below read and write); each access stays within it.
    unsafe {
        let n = b.n;
        let np = n.div_ceil(NR);
        let blocks = m.div_ceil(MR);
        for p in 0..np {
            let panel = b.ptr.add(p * b.panel);
            let c0 = p * NR;
            let w = NR.min(n - c0);
            // The next panel's rows are fetched into the cache while this
            // panel runs, an equal share during each row block: between
            // steps a weight's panels fall out to memory or the last-level
            // cache, and the hardware prefetcher only starts after the
            // first misses of each panel.
            let next = if p + 1 < np {
                b.ptr.add((p + 1) * b.panel)
            } else {
                std::ptr::null()
            };
            for j in 0..blocks {
                let r0 = j * MR;
                let rows = MR.min(m - r0);
                let ap = a.add(r0 * rs);
                let out = c.add(r0 * ldc + c0);
                let (lo, hi) = (j * k / blocks, (j + 1) * k / blocks);
                let pf = if next.is_null() {
                    (next, 0)
                } else {
                    (next.add(lo * b.row), hi - lo)
                };
                // SAFETY (each arm): rows `r0..r0 + rows` of `a` are in
                // bounds; `out` starts at `c[r0][c0]` and reaches
                // `c[r0 + rows - 1][c0 + w - 1]`, inside `c`; `panel`
                // holds `k` rows of 16 at stride `b.row`; `pf` covers rows
                // `lo..hi` of the next panel (`hi ≤ k`), or nothing.
                match rows {
                    6 => block::<6>(ap, rs, cs, panel, b.row, k, out, ldc, w, pf, acc),
                    5 => block::<5>(ap, rs, cs, panel, b.row, k, out, ldc, w, pf, acc),
                    4 => block::<4>(ap, rs, cs, panel, b.row, k, out, ldc, w, pf, acc),
                    3 => block::<3>(ap, rs, cs, panel, b.row, k, out, ldc, w, pf, acc),
                    2 => block::<2>(ap, rs, cs, panel, b.row, k, out, ldc, w, pf, acc),
                    _ => block::<1>(ap, rs, cs, panel, b.row, k, out, ldc, w, pf, acc),
                }
            }
        }
    }
}

/// The same product as [`gemm`] on AVX-512: each block of rows runs
/// two panels (32 columns, two 512-bit registers per row) at once, so
/// a term's two loads of `B` serve up to 24 multiply-adds; the rows are
/// split into blocks of at most 12, as even as they go (16 rows: two
/// blocks of 8). A last odd panel runs alone, and columns past `n`
/// are masked. Same terms in the same order as [`gemm`]: the same bits.
///
/// # Safety
///
/// As [`gemm`], with AVX-512F in place of AVX2 and FMA.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm512(
    a: *const f32,
    rs: usize,
    cs: usize,
    m: usize,
    k: usize,
    b: Panels,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    // SAFETY: the caller upholds this function's `# Safety` contract
    // (the CPU features it is built for, and pointers valid for every
    // element the loops below read and write); each access stays within it.
    unsafe {
        let n = b.n;
        let np = n.div_ceil(NR);
        let blocks = m.div_ceil(MR512);
        let mut p = 0;
        while p < np {
            let pair = p + 1 < np;
            let panel = b.ptr.add(p * b.panel);
            let c0 = p * NR;
            let w = (n - c0).min(if pair { 2 * NR } else { NR });
            let step = if pair { 2 } else { 1 };
            let next = if p + step < np {
                b.ptr.add((p + step) * b.panel)
            } else {
                std::ptr::null()
            };
            // Prefetched along with the next panel: the one after it, when
            // the next block of columns is a pair.
            let next2 = if p + step + 1 < np { b.panel } else { 0 };
            for j in 0..blocks {
                let (r0, r1) = (j * m / blocks, (j + 1) * m / blocks);
                let ap = a.add(r0 * rs);
                let out = c.add(r0 * ldc + c0);
                let (lo, hi) = (j * k / blocks, (j + 1) * k / blocks);
                let pf = if next.is_null() {
                    (next, 0, 0)
                } else {
                    (next.add(lo * b.row), hi - lo, next2)
                };
                macro_rules! run {
                    ($($r:literal)*) => {
                        match (r1 - r0, pair) {
                            $(
                                ($r, true) => block512::<$r, 2>(ap, rs, cs, panel, b.row, b.panel, k, out, ldc, w, pf, acc),
                                ($r, false) => block512::<$r, 1>(ap, rs, cs, panel, b.row, b.panel, k, out, ldc, w, pf, acc),
                            )*
                            _ => unreachable!("blocks of 1 to {MR512} rows"),
                        }
                    };
                }
                // SAFETY (each arm): rows `r0..r1` of `a` are in bounds;
                // `out` starts at `c[r0][c0]` and reaches
                // `c[r1 - 1][c0 + w - 1]`, inside `c`; `panel` (and the
                // panel after it, for a pair) holds `k` rows of 16 at
                // stride `b.row`; `pf` covers rows `lo..hi` of the next
                // panel (and of the one after it, `pf.2` further), or
                // nothing.
                run!(1 2 3 4 5 6 7 8 9 10 11 12)
            }
            p += step;
        }
    }
}

/// `R` rows × `P` panels (`P` 1 or 2) on AVX-512: as [`block`], with
/// the panel after `bp` at `bp + pstride`, `w ≤ 16·P` columns written
/// (the rest masked), and the next block's rows prefetched from `pf.0`
/// (and `pf.0 + pf.2` when `pf.2` is not zero).
///
/// # Safety
///
/// AVX-512F; `a` valid at `r·rs + kk·cs` for `r < R`, `kk < k`; the
/// `P` panels valid for `k` rows of 16 at stride `ldb`; `out` valid
/// for reads and writes at `r·ldc + j` for `r < R`, `j < w`; `pf.1 ≤ k`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn block512<const R: usize, const P: usize>(
    a: *const f32,
    rs: usize,
    cs: usize,
    bp: *const f32,
    ldb: usize,
    pstride: usize,
    k: usize,
    out: *mut f32,
    ldc: usize,
    w: usize,
    pf: (*const f32, usize, usize),
    acc: bool,
) {
    // SAFETY: the caller upholds this function's `# Safety` contract
    // (the CPU features it is built for, and pointers valid for every
    // element the loops below read and write); each access stays within it.
    unsafe {
        debug_assert!(pf.1 <= k && w <= P * NR);
        let mask = |q: usize| -> __mmask16 {
            let cols = w.saturating_sub(q * NR).min(NR);
            ((1u32 << cols) - 1) as __mmask16
        };
        let masks: [__mmask16; P] = std::array::from_fn(mask);
        let mut c = [[_mm512_setzero_ps(); P]; R];
        if acc {
            for (r, row) in c.iter_mut().enumerate() {
                for (q, v) in row.iter_mut().enumerate() {
                    *v = _mm512_maskz_loadu_ps(masks[q], out.add(r * ldc + q * NR));
                }
            }
        }
        macro_rules! term {
            ($kk:expr) => {{
                let kk = $kk;
                let bv: [__m512; P] =
                    std::array::from_fn(|q| _mm512_loadu_ps(bp.add(q * pstride + kk * ldb)));
                for (r, row) in c.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*a.add(r * rs + kk * cs));
                    for (v, b) in row.iter_mut().zip(&bv) {
                        *v = _mm512_fmadd_ps(av, *b, *v);
                    }
                }
            }};
        }
        for kk in 0..pf.1 {
            let at = pf.0.add(kk * ldb);
            _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
            if pf.2 != 0 {
                _mm_prefetch::<_MM_HINT_T0>(at.add(pf.2) as *const i8);
            }
            term!(kk);
        }
        for kk in pf.1..k {
            term!(kk);
        }
        for (r, row) in c.iter().enumerate() {
            for (q, v) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(out.add(r * ldc + q * NR), masks[q], *v);
            }
        }
    }
}

/// A product of at most [`NARROW`] columns on AVX-512 (a readout
/// `h W` to a few outputs): each 512-bit register holds 4 rows × 4
/// columns of `C` (lane `4i + j`: row `i`, column `j`), not one row of
/// a 16-column panel of which 12 columns are padding. Per four terms
/// a group of 4 rows loads its rows' 4 elements of `A` as one
/// register, and each term spreads its element across its row's lanes
/// by an in-lane shuffle; `B`'s row (its first 4 packed columns,
/// zeros past `n`) is broadcast to the four rows. Up to 8 groups (32
/// rows) run at once, so the multiply-add chains overlap. Each element
/// of `C` still gets one fused multiply-add per term in `k` order, from
/// zero or (`acc`) its old value: the bits of [`gemm512`] and [`gemm`].
/// `bench_learn --profile`, against the panel kernel, two to three runs
/// each: GRU pp_prop 128×64, its readout `64×128 @ 128×4` 1.51–1.97 →
/// 0.87–0.93 µs a step; at hidden 4, batch 64, `64×20 @ 20×4`
/// 0.36–0.38 → 0.28–0.31 µs and `64×4 @ 4×4` 0.24–0.25 → 0.23–0.26.
///
/// # Safety
///
/// As [`gemm512`], with `a`'s column stride 1 (`a` valid at `r·rs + kk`)
/// and `b.n ≤ NARROW` (one panel, packed: rows of 16 at stride `b.row`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn narrow512(
    a: *const f32,
    rs: usize,
    m: usize,
    k: usize,
    b: Panels,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    // SAFETY: the caller upholds this function's `# Safety` contract
    // (the CPU features it is built for, and pointers valid for every
    // element the loops below read and write); each access stays within it.
    unsafe {
        debug_assert!(b.n <= NARROW);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(4 * NARROW_GROUPS);
            let (ap, out) = (a.add(r0 * rs), c.add(r0 * ldc));
            macro_rules! run {
                ($($g:literal)*) => {
                    match rows.div_ceil(4) {
                        $($g => narrow_block::<$g>(ap, rs, rows, k, b.ptr, b.row, out, ldc, b.n, acc),)*
                        _ => unreachable!("1 to {NARROW_GROUPS} groups of rows"),
                    }
                };
            }
            // SAFETY: rows `r0..r0 + rows` of `a` and of `c` are in bounds
            // (the caller's contract); the panel holds `k` rows of 16.
            run!(1 2 3 4 5 6 7 8);
            r0 += rows;
        }
    }
}

/// `G` groups of 4 rows (`rows` of them real, `rows > 4(G - 1)`; the
/// missing rows of the last group repeat its last real row and are not
/// stored) × `w ≤ 4` columns, as [`narrow512`] describes.
///
/// # Safety
///
/// AVX-512F; `a` valid at `r·rs + kk` for `r < rows`, `kk < k`; `bp`
/// valid for `k` rows of at least 4 elements at stride `ldb`; `out`
/// valid for reads and writes at `r·ldc + j` for `r < rows`, `j < w`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn narrow_block<const G: usize>(
    a: *const f32,
    rs: usize,
    rows: usize,
    k: usize,
    bp: *const f32,
    ldb: usize,
    out: *mut f32,
    ldc: usize,
    w: usize,
    acc: bool,
) {
    // SAFETY: the caller upholds this function's `# Safety` contract
    // (the CPU features it is built for, and pointers valid for every
    // element the loops below read and write); each access stays within it.
    unsafe {
        debug_assert!(rows > 4 * (G - 1) && rows <= 4 * G && w <= NARROW);
        let row = |i: usize| a.add(i.min(rows - 1) * rs);
        // Four 128-bit values as the four lanes of a register. (Built by
        // lane moves, not through an array in memory: a wide load of
        // narrow stores, or narrow loads of a wide store, stalls store
        // forwarding; that made this kernel slower than the panel
        // kernel on `64×4 @ 4×4`.)
        macro_rules! lanes {
            ($f:expr) => {{
                let f = $f;
                let x = _mm512_castps128_ps512(f(0));
                let x = _mm512_insertf32x4::<1>(x, f(1));
                let x = _mm512_insertf32x4::<2>(x, f(2));
                _mm512_insertf32x4::<3>(x, f(3))
            }};
        }
        // The first `w` columns of a row (the rest masked: never read or
        // written).
        let cols = ((1u32 << w) - 1) as __mmask16;
        let mut c = [_mm512_setzero_ps(); G];
        if acc {
            for (g, v) in c.iter_mut().enumerate() {
                *v = lanes!(|i: usize| if 4 * g + i < rows {
                    _mm512_castps512_ps128(_mm512_maskz_loadu_ps(cols, out.add((4 * g + i) * ldc)))
                } else {
                    _mm_setzero_ps()
                });
            }
        }
        let k4 = k / 4 * 4;
        let mut kk = 0;
        while kk < k4 {
            let v: [__m512; G] =
                std::array::from_fn(|g| lanes!(|i: usize| _mm_loadu_ps(row(4 * g + i).add(kk))));
            macro_rules! term {
                ($j:literal, $imm:literal) => {{
                    let bv = _mm512_broadcast_f32x4(_mm_loadu_ps(bp.add((kk + $j) * ldb)));
                    for (acc, x) in c.iter_mut().zip(&v) {
                        *acc = _mm512_fmadd_ps(_mm512_permute_ps::<$imm>(*x), bv, *acc);
                    }
                }};
            }
            term!(0, 0x00);
            term!(1, 0x55);
            term!(2, 0xAA);
            term!(3, 0xFF);
            kk += 4;
        }
        for kk in k4..k {
            let bv = _mm512_broadcast_f32x4(_mm_loadu_ps(bp.add(kk * ldb)));
            for (g, acc) in c.iter_mut().enumerate() {
                let av = lanes!(|i: usize| _mm_set1_ps(*row(4 * g + i).add(kk)));
                *acc = _mm512_fmadd_ps(av, bv, *acc);
            }
        }
        for (g, v) in c.iter().enumerate() {
            macro_rules! put {
                ($i:literal) => {
                    if 4 * g + $i < rows {
                        let x = _mm512_castps128_ps512(_mm512_extractf32x4_ps::<$i>(*v));
                        _mm512_mask_storeu_ps(out.add((4 * g + $i) * ldc), cols, x);
                    }
                };
            }
            put!(0);
            put!(1);
            put!(2);
            put!(3);
        }
    }
}

/// `R` rows × one panel: `out[r][..w] = s + Σ_kk a[r][kk] panel[kk][..w]`,
/// `s` zero or, with `acc`, what `out` holds; `kk` in order, one fused
/// multiply-add per term. Meanwhile the `pf.1` panel rows from `pf.0`
/// on are prefetched, one per `kk`.
///
/// # Safety
///
/// AVX2 and FMA; `a` valid at `r·rs + kk·cs` for `r < R`, `kk < k`;
/// `panel` valid for `k` rows of 16 at stride `ldb`; `out` valid for
/// reads and writes at `r·ldc + j` for `r < R`, `j < w`; `pf.1 ≤ k`
/// (prefetching never faults,
/// but the address must be computable: `pf.0` spans `pf.1` rows at
/// stride `ldb`).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const R: usize>(
    a: *const f32,
    rs: usize,
    cs: usize,
    bp: *const f32,
    ldb: usize,
    k: usize,
    out: *mut f32,
    ldc: usize,
    w: usize,
    pf: (*const f32, usize),
    acc: bool,
) {
    // SAFETY: the caller upholds this function's `# Safety` contract
    // (the CPU features it is built for, and pointers valid for every
    // element the loops below read and write); each access stays within it.
    unsafe {
        debug_assert!(pf.1 <= k);
        let mut lo = [_mm256_setzero_ps(); MR];
        let mut hi = [_mm256_setzero_ps(); MR];
        if acc {
            for r in 0..R {
                let src = std::slice::from_raw_parts(out.add(r * ldc), w);
                let mut row = [0f32; NR];
                let from = if w == NR {
                    src.as_ptr()
                } else {
                    row[..w].copy_from_slice(src);
                    row.as_ptr()
                };
                lo[r] = _mm256_loadu_ps(from);
                hi[r] = _mm256_loadu_ps(from.add(8));
            }
        }
        macro_rules! term {
            ($kk:expr) => {{
                let kk = $kk;
                let b0 = _mm256_loadu_ps(bp.add(kk * ldb));
                let b1 = _mm256_loadu_ps(bp.add(kk * ldb + 8));
                for r in 0..R {
                    let av = _mm256_set1_ps(*a.add(r * rs + kk * cs));
                    lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
                    hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
                }
            }};
        }
        for kk in 0..pf.1 {
            _mm_prefetch::<_MM_HINT_T0>(pf.0.add(kk * ldb) as *const i8);
            term!(kk);
        }
        for kk in pf.1..k {
            term!(kk);
        }
        for r in 0..R {
            let dst = std::slice::from_raw_parts_mut(out.add(r * ldc), w);
            if w == NR {
                // A full panel straight from the registers (a copy of a
                // runtime length was a call to `memmove` per row).
                _mm256_storeu_ps(dst.as_mut_ptr(), lo[r]);
                _mm256_storeu_ps(dst.as_mut_ptr().add(8), hi[r]);
            } else {
                let mut row = [0f32; NR];
                _mm256_storeu_ps(row.as_mut_ptr(), lo[r]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), hi[r]);
                dst.copy_from_slice(&row[..w]);
            }
        }
    }
}
