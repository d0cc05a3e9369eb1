//! A single-precision matrix product for few rows, `C = A B` with `A`
//! `(m, k)` and `m` at most [`MAX_ROWS`] — a learning step's products
//! `x W` (batch × inputs times inputs × outputs) — whose right operand is
//! packed once into column panels and can be reused: the planned executor
//! keeps a weight's panels across the steps of a call, where
//! `matrixmultiply` packs both operands on every call.
//!
//! The kernel holds a 6 × 16 block of `C` in twelve AVX2 registers and
//! walks `k` with fused multiply-adds, one per element and `k` in order,
//! reading `A` where it lies (any non-negative strides). While it runs a
//! panel it prefetches the next one, an equal share of its rows per block
//! of rows: between a learner's steps the weights' panels fall out of the
//! near caches (`64×528 @ 528×512` in a GRU pp_prop step: 630–690 µs
//! → 480–590 µs per product in place). It runs only on
//! CPUs with AVX2 and FMA ([`applies`] says no elsewhere, and callers use
//! `matrixmultiply`); the interpreter and the planned executor make the
//! same choice from the same shapes, so both give the same bits.
//!
//! Where the CPU has AVX-512F, a second build of the kernel runs instead:
//! blocks of up to 12 rows × 32 columns in 24 of the 32 512-bit
//! registers, the rows split into blocks as even as they go. It adds the
//! same terms in the same order, so the two builds give the same bits (a
//! test checks both on every block shape). On this machine (Xeon, two
//! 512-bit FMA units) `bench_floor`'s products, one thread: `16×144×128`
//! 7.2 → 4.1 µs, `64×528×512` 407 → 222 µs, the hidden-128 chunk gradient
//! 7.3 → 4.1 µs a step.
//!
//! Measured against `matrixmultiply` (one thread, this machine, best of
//! 50): `16×144×128` 12.8 → 7.9 µs with the panels reused (13.9 µs packing
//! every call), `16×528×512` 229 → 110 µs, `64×528×512` 552 → 482 µs,
//! `128×144×128` 65 → 52 µs.
//!
//! A product of at most 4 columns (a readout to a few outputs) runs on
//! AVX-512 as 4 rows × 4 columns per register, not as
//! a 16-column panel that is three-quarters padding; same terms, same
//! order, same bits.
//!
//! [`gemm_acc`] runs the same kernel as `C += A B` with `B` read where it
//! lies (rows of a multiple of 16 columns in place of packed panels) and
//! any number of rows of `A`: pp_prop's chunk gradient `∇W += x̄ᵀ g`
//! ([`add_product`] picks it: at every size on AVX-512, for small chunks
//! on AVX2), with nothing packed or allocated per call, the terms taken
//! 256 at a time.

use ndarray::{Array2, ArrayView2};

/// The most rows of `A` the kernel takes: beyond, `A` no longer stays in
/// cache while the panels stream past it, and `matrixmultiply`'s blocking
/// wins.
pub const MAX_ROWS: usize = 128;

/// Columns per panel (two AVX2 registers of `f32`).
const NR: usize = 16;
/// Rows per register block (AVX2).
const MR: usize = 6;
/// Most rows per register block with AVX-512 (two panels a block: 24 of
/// the 32 registers hold `C`).
const MR512: usize = 12;
/// Most columns of a product the AVX-512 build runs as 4 rows × 4 columns
/// per register ([`x86::narrow512`]).
const NARROW: usize = 4;
/// Groups of 4 rows [`x86::narrow512`] runs at once (8 of its registers
/// hold `C`).
const NARROW_GROUPS: usize = 8;

/// Whether this CPU runs the kernel (AVX2 and FMA; checked once by std).
pub fn available() -> bool {
    super::has_avx2_fma()
}

/// Whether `a @ b`, `b` having `n` columns, runs here: `a` has 1 to
/// [`MAX_ROWS`] rows and at least one column, `n` is at least 1, `a`'s
/// strides are non-negative, and the CPU [has](available) the kernel's
/// instructions.
pub fn applies(a: &ArrayView2<'_, f32>, n: usize) -> bool {
    let (m, k) = a.dim();
    (1..=MAX_ROWS).contains(&m)
        && k >= 1
        && n >= 1
        && a.strides().iter().all(|&s| s >= 0)
        && available()
}

/// A right operand `B` `(k, n)` packed into column panels: panel `p` holds
/// columns `16p..16p+16` as `k` rows of 16 (zeros past `n`).
#[derive(Clone, Debug)]
pub struct PackedB {
    k: usize,
    n: usize,
    panels: Vec<f32>,
}

impl PackedB {
    /// Pack `b` (any layout).
    pub fn new(b: &ArrayView2<'_, f32>) -> Self {
        let (k, n) = b.dim();
        let np = n.div_ceil(NR);
        let mut panels = vec![0f32; np * k * NR];
        for (kk, row) in b.outer_iter().enumerate() {
            match row.as_slice() {
                Some(row) => {
                    for (p, cols) in row.chunks(NR).enumerate() {
                        let at = (p * k + kk) * NR;
                        panels[at..at + cols.len()].copy_from_slice(cols);
                    }
                }
                None => {
                    for (c, &v) in row.iter().enumerate() {
                        panels[((c / NR) * k + kk) * NR + c % NR] = v;
                    }
                }
            }
        }
        PackedB { k, n, panels }
    }

    /// `B`'s `(k, n)`.
    pub fn dim(&self) -> (usize, usize) {
        (self.k, self.n)
    }
}

/// `c = a @ b`, `c` row-major `(m, n)`.
///
/// # Panics
///
/// When the kernel does not [apply](applies) to `a` and `b`, `a`'s columns
/// are not `b`'s rows, or `c` is not `m · n` long: callers check first.
pub fn gemm(a: &ArrayView2<'_, f32>, b: &PackedB, c: &mut [f32]) {
    let (m, k) = a.dim();
    assert!(
        applies(a, b.n) && k == b.k && c.len() == m * b.n,
        "sgemm: ({m}, {k}) @ {:?} into {} elements is not this kernel's case",
        b.dim(),
        c.len()
    );
    split(a, b.panels(), c, false);
}

/// Whether [`gemm_acc`] runs `a @ b` here: `a` `(m, k)` and `b` `(k, n)`
/// non-empty, `a`'s strides non-negative, `b`'s rows contiguous
/// (column stride 1, row stride at least `n`, unless `b` has one row),
/// `n` a multiple of 16, and
/// the CPU [has](available) the kernel's instructions. Unlike [`applies`],
/// `a` may have any number of rows: `b` is read where it lies, and `a`'s
/// rows pass one block at a time.
pub fn acc_applies(a: &ArrayView2<'_, f32>, b: &ArrayView2<'_, f32>) -> bool {
    let ((m, k), (kb, n)) = (a.dim(), b.dim());
    m >= 1
        && k >= 1
        && k == kb
        && n >= 1
        && n.is_multiple_of(NR)
        && a.strides().iter().all(|&s| s >= 0)
        && b.strides()[1] == 1
        && (b.strides()[0] >= n as isize || k == 1)
        && available()
}

/// `c += a @ b`, `c` row-major `(m, n)`, `b` read where it lies (its rows
/// in place of packed panels): pp_prop's chunk gradient `∇W += x̄ᵀ g`,
/// with `x̄ᵀ` a transposed view and `g` the chunk's rows, so nothing is
/// packed or allocated. Each element of `c` is its old value plus one
/// multiply-add per term in `k` order.
///
/// # Panics
///
/// When the kernel does not [apply](acc_applies) or `c` is not `m · n`
/// long: callers check first.
pub fn gemm_acc(a: &ArrayView2<'_, f32>, b: &ArrayView2<'_, f32>, c: &mut [f32]) {
    let (m, k) = a.dim();
    let n = b.ncols();
    assert!(
        acc_applies(a, b) && c.len() == m * n,
        "sgemm: ({m}, {k}) @ {:?} added into {} elements is not this kernel's case",
        b.dim(),
        c.len()
    );
    let row = b.strides()[0].max(0) as usize;
    acc_in_slices(
        a,
        Panels {
            ptr: b.as_ptr(),
            k,
            n,
            row,
            panel: NR,
        },
        c,
    );
}

/// `c += a @ B` for `B` `(k, n)` read from `b` as column panels of 16 at
/// a stride of `stride` elements: element `(kk, j)` at
/// `(j / 16)·stride + 16·kk + j % 16`. pp_prop's f32 chunk keeps its
/// signal rows so (written there as they arrive), and its gradient
/// product then reads each panel's rows one after another: `528×512 +=
/// (64×528)ᵀ·64×512` at 116 GFMA/s against 101 for the rows in place
/// (one thread, AVX-512). The same bits as [`gemm_acc`] on the same `B`.
///
/// # Panics
///
/// When `a` `(m, k)` is empty or has a negative stride, `n` is not a
/// non-zero multiple of 16, `stride < 16·k`, `b` is shorter than the last
/// panel's end, `c` is not `m · n` long, or the CPU does not
/// [have](available) the kernel's instructions: callers check first.
pub fn gemm_acc_panels(a: &ArrayView2<'_, f32>, b: &[f32], n: usize, stride: usize, c: &mut [f32]) {
    let (m, k) = a.dim();
    assert!(
        m >= 1
            && k >= 1
            && n >= 1
            && n.is_multiple_of(NR)
            && stride >= k * NR
            && b.len() >= (n / NR - 1) * stride + k * NR
            && c.len() == m * n
            && a.strides().iter().all(|&s| s >= 0)
            && available(),
        "sgemm: ({m}, {k}) @ ({k}, {n}) panels at stride {stride} ({} elements) added into {} \
         elements is not this kernel's case",
        b.len(),
        c.len()
    );
    acc_in_slices(
        a,
        Panels {
            ptr: b.as_ptr(),
            k,
            n,
            row: NR,
            panel: stride,
        },
        c,
    );
}

/// `c += a @ b` with `k` in slices of at most `ACC_K_SLICE` terms, in
/// order: each element of `c` is stored after a slice's terms and
/// reloaded for the next, so it sees the same multiply-adds in the same
/// order as without the slices (an `f32` register and an `f32` in memory
/// hold the same bits). A slice of `B`'s rows, two panels wide, then
/// stays in the first-level cache while every block of `a`'s rows passes
/// over it. The caller has checked the shapes and the CPU.
fn acc_in_slices(a: &ArrayView2<'_, f32>, b: Panels, c: &mut [f32]) {
    let k = b.k;
    let mut k0 = 0;
    while k0 < k {
        let k1 = (k0 + ACC_K_SLICE).min(k);
        let panels = Panels {
            // SAFETY: row `k0 < k` of every panel of `b` is in bounds.
            ptr: unsafe { b.ptr.add(k0 * b.row) },
            k: k1 - k0,
            ..b
        };
        split(&a.slice(ndarray::s![.., k0..k1]), panels, c, true);
        k0 = k1;
    }
}

/// Terms of `k` per pass of [`gemm_acc`] over `c`: 256 rows of two
/// 16-column panels of `B` are 32 KiB, within a first-level data cache.
const ACC_K_SLICE: usize = 256;

/// Largest `k` and `m · n` for which [`add_product`] runs [`gemm_acc`].
const ACC_MAX_K: usize = 256;
const ACC_MAX_C: usize = 1 << 15;

/// `c += a @ b` as pp_prop's chunk gradient runs it: [`gemm_acc`] when it
/// [applies](acc_applies) and `c` is row-major, on the AVX-512 build at
/// every size, on the AVX2 build only for small products (`k` at most 256
/// rows, `c` at most 32768 elements); `matrixmultiply` otherwise.
/// Measured (one thread, alternating): the hidden-128 chunk
/// `144×128 += (128×144)ᵀ·128×128` on AVX2 31 → 37–42 GFMA/s, on AVX-512
/// (Zen 5) 61–75 → 93–110. At hidden 512, `528×512 += (512×528)ᵀ·512×512`,
/// `gemm_acc` without slices of `k` fell to 23–24 GFMA/s on AVX2 against
/// `matrixmultiply`'s 30–37, and on AVX-512 varied 68–105 against 81–97;
/// with `k` in slices of 256 it runs 98–101 against 73–92 (`k` 256: 106–108
/// against 77–91). The AVX2 build's limits date from before the slices
/// (no AVX2-only machine to measure them on since).
pub fn add_product(a: &ArrayView2<'_, f32>, b: &ArrayView2<'_, f32>, c: &mut Array2<f32>) {
    if picks_acc(a, b, c) {
        if let Some(c) = c.as_slice_mut() {
            return gemm_acc(a, b, c);
        }
    }
    ndarray::linalg::general_mat_mul(1.0, a, b, 1.0, c);
}

/// Whether [`add_product`] runs [`gemm_acc`] (when `c` is row-major).
fn picks_acc(a: &ArrayView2<'_, f32>, b: &ArrayView2<'_, f32>, c: &Array2<f32>) -> bool {
    let size_fits = Isa::best() == Isa::Avx512 || (a.ncols() <= ACC_MAX_K && c.len() <= ACC_MAX_C);
    size_fits && acc_applies(a, b) && c.dim() == (a.nrows(), b.ncols()) && c.is_standard_layout()
}

/// Where the kernel reads `B` `(k, n)`: row `kk` of panel `p` (columns
/// `16p..16p + 16`) starts at `ptr + p·panel + kk·row`.
#[derive(Clone, Copy, Debug)]
struct Panels {
    ptr: *const f32,
    k: usize,
    n: usize,
    row: usize,
    panel: usize,
}

// SAFETY: `Panels` only reads `B`, which its creator borrows for the call
// (`gemm`'s `&PackedB`, `gemm_acc`'s view); threads read it together.
unsafe impl Send for Panels {}
unsafe impl Sync for Panels {}

impl Panels {
    /// Columns `c0..c1` (`c0` a multiple of 16, `c1 ≤ n`): the panels from
    /// `c0 / 16` on.
    fn columns(self, c0: usize, c1: usize) -> Panels {
        assert!(c0.is_multiple_of(NR) && c0 < c1 && c1 <= self.n);
        Panels {
            // SAFETY: panel `c0 / 16` is one of the `⌈n/16⌉` panels.
            ptr: unsafe { self.ptr.add(c0 / NR * self.panel) },
            n: c1 - c0,
            ..self
        }
    }
}

impl PackedB {
    fn panels(&self) -> Panels {
        Panels {
            ptr: self.panels.as_ptr(),
            k: self.k,
            n: self.n,
            row: NR,
            panel: self.k * NR,
        }
    }
}

/// `c = a @ b` (or `c += a @ b` with `acc`), split across the current
/// rayon pool for large products, each thread writing its own rows or
/// columns of `c`: every element is computed as on one thread, so the
/// result does not depend on the split. The caller has checked the shapes
/// and the CPU.
fn split(a: &ArrayView2<'_, f32>, b: Panels, c: &mut [f32], acc: bool) {
    split_on(Isa::best(), a, b, c, acc)
}

/// Which of the kernel's two builds runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    /// 256-bit registers, 6 × 16 blocks.
    Avx2,
    /// 512-bit registers, up to 12 × 32 blocks.
    Avx512,
}

impl Isa {
    /// AVX-512 where the CPU [has](super::has_avx512) it (as the
    /// element-wise kernels decide), else AVX2. The two give the same bits.
    fn best() -> Isa {
        if super::has_avx512() {
            Isa::Avx512
        } else {
            Isa::Avx2
        }
    }
}

/// [`split`] on the kernel build `isa` (the tests run both).
fn split_on(isa: Isa, a: &ArrayView2<'_, f32>, b: Panels, c: &mut [f32], acc: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let (m, k) = a.dim();
        let n = b.n;
        assert!(
            c.len() == m * n,
            "sgemm: {} elements for a ({m}, {n}) result",
            c.len()
        );
        let threads = rayon::current_num_threads().min(m.max(n.div_ceil(2 * NR)));
        let min =
            crate::threads::split_threshold(PAR_MIN_WORK_AWAKE, PAR_MIN_WORK, PAR_MIN_WORK_OUTSIDE);
        let cp = SendPtr(c.as_mut_ptr());
        if threads > 1 && m * k * n >= min {
            use rayon::prelude::*;
            // Each thread reads all of one operand and its share of the
            // other: it takes columns (panels of `B`) when `A` is the
            // smaller, rows otherwise (split by rows, each thread streams
            // the whole weight of a step's forward product `x W`). Two
            // threads in a pool, three 528 × 512 weights in turn: 16 rows
            // 153–189 GFMA/s by rows, 205–208 by columns; 64 rows 206–231
            // and 230–235 (one thread: 106–112).
            if m < n {
                // In pairs of panels (the AVX-512 build's blocks).
                let pairs = n.div_ceil(2 * NR);
                let per = pairs.div_ceil(threads);
                (0..pairs.div_ceil(per)).into_par_iter().for_each(|t| {
                    let (c0, c1) = (t * per * 2 * NR, ((t + 1) * per * 2 * NR).min(n));
                    let part = b.columns(c0, c1);
                    // SAFETY: columns `c0..c1` of every row of `c` (this
                    // part's alone) from `c[0][c0]` at row stride `n`.
                    unsafe { rows(isa, a, part, cp.get().add(c0), n, acc) }
                });
            } else {
                let per = m.div_ceil(threads);
                (0..m.div_ceil(per)).into_par_iter().for_each(|t| {
                    let (r0, r1) = (t * per, ((t + 1) * per).min(m));
                    let part = a.slice(ndarray::s![r0..r1, ..]);
                    // SAFETY: rows `r0..r1` of `c` (this part's alone).
                    unsafe { rows(isa, &part, b, cp.get().add(r0 * n), n, acc) }
                });
            }
        } else {
            // SAFETY: `c` holds the `m × n` result.
            unsafe { rows(isa, a, b, cp.get(), n, acc) }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, a, b, c, acc);
        unreachable!("`applies` and `acc_applies` are false off x86_64")
    }
}

/// A result's pointer shared by the threads that write its disjoint parts.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: each thread writes only its own part of the result (see
// `split_on`), which outlives the threads' work.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Multiply-adds from which a product splits across threads under
/// [`keep_awake`](crate::threads::keep_awake).
const PAR_MIN_WORK_AWAKE: usize = 1 << 18;

/// Multiply-adds from which a product splits across threads when
/// called on one of the pool's threads (`rayon::ThreadPool::install`).
/// GRU pp_prop 128×64 (products of 1.2 M), two threads, in a pool:
/// 0.064 ms/step against 0.075 on one thread.
const PAR_MIN_WORK: usize = 1 << 20;

/// The same, called from outside the pool. Measured with `bench_learn`
/// (GRU pp_prop, two threads from the main thread, against one thread,
/// medians of 3 alternating rounds): products of 1.2 M (hidden 128, batch
/// 64) split: 0.154 against 0.075 ms/step; of 4.3 M (512×16) split: 0.249
/// against 0.272 unsplit.
const PAR_MIN_WORK_OUTSIDE: usize = 1 << 22;

/// `a @ b` (or, with `acc`, `c + a @ b`) into `c`, an `(m, b.n)` block at
/// row stride `ldc`, on the calling thread.
///
/// # Safety
///
/// `c` is valid for writes at `r·ldc + j` for `r < m`, `j < b.n`, and no
/// other thread reads or writes those elements meanwhile; `ldc ≥ b.n`.
#[cfg(target_arch = "x86_64")]
unsafe fn rows(isa: Isa, a: &ArrayView2<'_, f32>, b: Panels, c: *mut f32, ldc: usize, acc: bool) {
    let (m, k) = a.dim();
    assert!(
        available()
            && (isa == Isa::Avx2 || std::arch::is_x86_feature_detected!("avx512f"))
            && a.strides().iter().all(|&s| s >= 0)
            && k == b.k
            && ldc >= b.n
            && (b.row == NR || b.n.is_multiple_of(NR))
    );
    let (rs, cs) = (a.strides()[0] as usize, a.strides()[1] as usize);
    // SAFETY: the CPU has AVX2 and FMA, and AVX-512F for that build
    // (asserted); `a` is an `(m, k)` view
    // with non-negative strides `(rs, cs)`, so element `(r, kk)` lies at
    // `a.as_ptr() + r·rs + kk·cs` for `r < m`, `kk < k`; `b` holds
    // `⌈n/16⌉` panels of `k` rows of 16 at its strides (packed panels,
    // or the rows of a view with `n` a multiple of 16); `c` is valid for
    // the `m × n` block at stride `ldc` (the caller's contract).
    unsafe {
        match isa {
            Isa::Avx2 => x86::gemm(a.as_ptr(), rs, cs, m, k, b, c, ldc, acc),
            Isa::Avx512 if b.n <= NARROW && cs == 1 => {
                x86::narrow512(a.as_ptr(), rs, m, k, b, c, ldc, acc)
            }
            Isa::Avx512 => x86::gemm512(a.as_ptr(), rs, cs, m, k, b, c, ldc, acc),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, ShapeBuilder};

    /// Whether the kernel runs on this CPU (tests of it are skipped, with a
    /// message, where it never runs).
    fn kernel_here() -> bool {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2/FMA (the kernel never runs here)");
        }
        available()
    }

    /// Deterministic values in `[-0.5, 0.5)` (a 32-bit LCG from `seed`).
    fn draws(mut seed: u32) -> impl FnMut() -> f32 {
        move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        }
    }

    /// `a @ b` as the definition, in f64.
    fn reference(a: &ArrayView2<'_, f32>, b: &ArrayView2<'_, f32>) -> Array2<f64> {
        let ((m, k), n) = (a.dim(), b.ncols());
        Array2::from_shape_fn((m, n), |(i, j)| {
            (0..k).map(|t| a[[i, t]] as f64 * b[[t, j]] as f64).sum()
        })
    }

    #[test]
    fn the_kernel_is_the_product_for_every_row_block_and_panel_width() {
        if !kernel_here() {
            return;
        }
        let mut draw = draws(1);
        for &(m, k, n) in &[
            (1, 1, 1),
            (5, 3, 17),
            (6, 9, 16),
            (7, 33, 31),
            (13, 4, 40),
            (64, 144, 128),
            (128, 20, 5),
        ] {
            for (a_f, b_f) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = Array2::from_shape_fn((m, k).f(), |_| draw());
                let a = if a_f {
                    a
                } else {
                    a.as_standard_layout().into_owned()
                };
                let b = Array2::from_shape_fn((k, n).set_f(b_f), |_| draw());
                let mut c = vec![f32::NAN; m * n];
                assert!(applies(&a.view(), n));
                gemm(&a.view(), &PackedB::new(&b.view()), &mut c);
                let want = reference(&a.view(), &b.view());
                for (i, (&got, &want)) in c.iter().zip(want.iter()).enumerate() {
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "({m}, {k}) @ ({k}, {n}), column-major a {a_f} b {b_f}: \
                         element {i} is {got}, want {want}"
                    );
                }
            }
        }
        // A strided (sliced) left operand is read where it lies.
        let big = Array2::from_shape_fn((20, 30), |_| draw());
        let a = big.slice(ndarray::s![..;3, 1..;2]);
        let b = Array2::from_shape_fn((a.ncols(), 19), |_| draw());
        let mut c = vec![0.0; a.nrows() * 19];
        gemm(&a, &PackedB::new(&b.view()), &mut c);
        let want = reference(&a, &b.view());
        for (&got, &want) in c.iter().zip(want.iter()) {
            assert!((got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()));
        }
    }

    /// `c0 + a @ b` one rounding per term, `k` in order: what the kernel
    /// computes, bit for bit (`f32::mul_add` is one rounding on every CPU).
    fn fma_chain(a: &ArrayView2<'_, f32>, b: &ArrayView2<'_, f32>, c0: &[f32]) -> Vec<f32> {
        let ((m, k), n) = (a.dim(), b.ncols());
        let mut c = c0.to_vec();
        for i in 0..m {
            for j in 0..n {
                for t in 0..k {
                    c[i * n + j] = a[[i, t]].mul_add(b[[t, j]], c[i * n + j]);
                }
            }
        }
        c
    }

    #[test]
    fn the_product_is_one_fused_multiply_add_per_term_in_order() {
        if !kernel_here() {
            return;
        }
        let mut draw = draws(7);
        for &(m, k, n) in &[(1, 1, 1), (7, 33, 31), (16, 144, 128), (128, 20, 5)] {
            let a = Array2::from_shape_fn((m, k), |_| draw());
            let b = Array2::from_shape_fn((k, n), |_| draw());
            let mut c = vec![f32::NAN; m * n];
            gemm(&a.view(), &PackedB::new(&b.view()), &mut c);
            let want = fma_chain(&a.view(), &b.view(), &vec![0.0; m * n]);
            assert_eq!(c, want, "({m}, {k}) @ ({k}, {n})");
        }
    }

    #[test]
    fn both_builds_are_the_fma_chain_for_every_block_shape() {
        if !kernel_here() {
            return;
        }
        let mut isas = vec![Isa::Avx2];
        if Isa::best() == Isa::Avx512 {
            isas.push(Isa::Avx512);
        } else {
            eprintln!("this CPU has no AVX-512F: only the AVX2 build is checked");
        }
        let mut draw = draws(11);
        // Every row count up to three blocks of either build (the AVX-512
        // build evens its blocks out), panel counts odd and even, the last
        // panel full or partial; `C` set or added to; `B` packed, or read
        // in place (a column slice of a wider matrix).
        for m in (1..=37).chain([48, 64, 128]) {
            for &(k, n) in &[
                (1, 16),
                (5, 1),
                (9, 17),
                (3, 31),
                (7, 32),
                (13, 48),
                (4, 100),
                (128, 4),
                (6, 3),
                (17, 2),
                (8, 4),
            ] {
                let a = Array2::from_shape_fn((m, k), |_| draw());
                let wide = Array2::from_shape_fn((k, n + 16), |_| draw());
                let b = wide.slice(ndarray::s![.., 16..]);
                let c0: Vec<f32> = (0..m * n).map(|_| draw()).collect();
                let packed = PackedB::new(&b);
                for &isa in &isas {
                    let mut c = vec![f32::NAN; m * n];
                    split_on(isa, &a.view(), packed.panels(), &mut c, false);
                    let want = fma_chain(&a.view(), &b, &vec![0.0; m * n]);
                    assert_eq!(c, want, "{isa:?}: ({m}, {k}) @ ({k}, {n})");
                    let mut c = c0.clone();
                    split_on(isa, &a.view(), packed.panels(), &mut c, true);
                    let want = fma_chain(&a.view(), &b, &c0);
                    assert_eq!(c, want, "{isa:?}: ({m}, {k}) @ ({k}, {n}) added");
                    if acc_applies(&a.view(), &b) {
                        let in_place = Panels {
                            ptr: b.as_ptr(),
                            k,
                            n,
                            row: b.strides()[0] as usize,
                            panel: NR,
                        };
                        let mut c = c0.clone();
                        split_on(isa, &a.view(), in_place, &mut c, true);
                        assert_eq!(c, want, "{isa:?}: ({m}, {k}) @ ({k}, {n}) in place");
                    }
                }
            }
        }
    }

    #[test]
    fn gemm_acc_adds_the_product_to_c_reading_b_in_place() {
        if !kernel_here() {
            return;
        }
        let mut draw = draws(3);
        // pp_prop's chunk shape (a = x̄ᵀ, more rows than `gemm` takes),
        // single rows and columns, and a `b` whose rows are longer than
        // `n` (a column slice of a wider matrix).
        for &(m, k, n, wide) in &[
            (144, 128, 128, 128),
            (1, 1, 16, 16),
            (7, 3, 16, 48),
            (13, 40, 48, 53),
            (200, 9, 32, 32),
            // `k` past one slice of terms (`ACC_K_SLICE`): two, and three
            // with a short last one.
            (20, 257, 32, 32),
            (37, 600, 48, 64),
        ] {
            let x = Array2::from_shape_fn((k, m), |_| draw());
            let a = x.t();
            let g = Array2::from_shape_fn((k, wide), |_| draw());
            let b = g.slice(ndarray::s![.., wide - n..]);
            assert!(acc_applies(&a, &b), "({m}, {k}) @ ({k}, {n})");
            let c0: Vec<f32> = (0..m * n).map(|_| draw()).collect();
            let mut c = c0.clone();
            gemm_acc(&a, &b, &mut c);
            assert_eq!(c, fma_chain(&a, &b, &c0), "({m}, {k}) @ ({k}, {n})");
            let want = reference(&a, &b);
            for (i, (&got, &w)) in c.iter().zip(want.iter()).enumerate() {
                let w = w + c0[i] as f64;
                assert!(
                    (got as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "element {i}"
                );
            }
            // add_product: the same bits where it runs the kernel (on
            // AVX2 alone, not past 256 terms).
            let mut c2 = Array2::from_shape_vec((m, n), c0.clone()).unwrap();
            assert_eq!(
                picks_acc(&a, &b, &c2),
                k <= ACC_MAX_K || crate::kernels::has_avx512()
            );
            add_product(&a, &b, &mut c2);
            if k <= ACC_MAX_K || crate::kernels::has_avx512() {
                assert_eq!(
                    c2.as_slice().unwrap(),
                    &c[..],
                    "add_product ({m}, {k}) @ ({k}, {n})"
                );
            }
        }
        // Where it does not apply: n not a multiple of 16, b's columns
        // strided, a with a negative stride.
        let a = Array2::<f32>::zeros((4, 8));
        let b = Array2::<f32>::zeros((8, 20));
        assert!(!acc_applies(&a.view(), &b.view()));
        let b = Array2::<f32>::zeros((8, 32));
        assert!(!acc_applies(&a.view(), &b.slice(ndarray::s![.., ..;2])));
        assert!(!acc_applies(&a.slice(ndarray::s![..;-1, ..]), &b.view()));
        assert!(acc_applies(&a.view(), &b.view()));
        // add_product falls back to matrixmultiply (and still adds).
        let a = Array2::from_shape_fn((3, 5), |(i, j)| (i + j) as f32);
        let b = Array2::from_shape_fn((5, 7), |(i, j)| (i * j) as f32 - 2.0);
        let mut c = Array2::from_elem((3, 7), 1.0f32);
        add_product(&a.view(), &b.view(), &mut c);
        let want = reference(&a.view(), &b.view());
        for (&got, &w) in c.iter().zip(want.iter()) {
            assert_eq!(got as f64, w + 1.0);
        }
    }

    /// `B` as column panels at a stride (pp_prop's chunk layout, with room
    /// for more rows than are used) gives `gemm_acc`'s bits on the same
    /// `B` read in place: one multiply-add per term, in `k` order, past
    /// one slice of terms too.
    #[test]
    fn gemm_acc_panels_is_gemm_acc_on_panels() {
        if !kernel_here() {
            return;
        }
        let mut draw = draws(4);
        for &(m, k, n, cap) in &[
            (144, 128, 128, 128),
            (1, 1, 16, 1),
            (1, 64, 48, 80),
            (13, 40, 48, 53),
            (528, 64, 512, 512),
            (20, 257, 32, 300),
            (37, 600, 48, 600),
        ] {
            let a_rows = Array2::from_shape_fn((k, m), |_| draw());
            let a = a_rows.t();
            let b = Array2::from_shape_fn((k, n), |_| draw());
            // Panels of `cap` rows, the rows past `k` holding garbage.
            let stride = cap * NR;
            let mut panels: Vec<f32> = (0..n / NR * stride).map(|_| draw()).collect();
            for kk in 0..k {
                for j in 0..n {
                    panels[j / NR * stride + kk * NR + j % NR] = b[[kk, j]];
                }
            }
            let c0: Vec<f32> = (0..m * n).map(|_| draw()).collect();
            let (mut got, mut want) = (c0.clone(), c0.clone());
            gemm_acc_panels(&a, &panels, n, stride, &mut got);
            gemm_acc(&a, &b.view(), &mut want);
            assert_eq!(got, want, "({m}, {k}) @ ({k}, {n}) in panels of {cap} rows");
            assert_eq!(got, fma_chain(&a, &b.view(), &c0));
        }
    }

    #[test]
    fn rows_split_across_threads_give_the_same_bits() {
        if !kernel_here() {
            return;
        }
        let on = |threads: usize, f: &(dyn Fn() -> Vec<f32> + Sync)| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(f)
        };
        // gemm: c = a @ b on packed panels.
        let (m, k, n) = (64, 528, 100);
        assert!(m * k * n >= PAR_MIN_WORK);
        let a = Array2::from_shape_fn((m, k), |(i, j)| ((i * 31 + j * 7) % 17) as f32 / 9.0 - 0.9);
        let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 13 + j * 5) % 11) as f32 / 7.0 - 0.7);
        let panels = PackedB::new(&b.view());
        let run = || {
            let mut c = vec![0f32; m * n];
            gemm(&a.view(), &panels, &mut c);
            c
        };
        let one = on(1, &run);
        for threads in [2, 3, 5] {
            assert_eq!(on(threads, &run), one, "gemm, {threads} threads");
        }
        let want = reference(&a.view(), &b.view());
        for (&got, &want) in one.iter().zip(want.iter()) {
            assert!((got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()));
        }
        // gemm_acc: c += xᵀ @ b with b in place.
        let operands = |m: usize, k: usize, n: usize| {
            let x =
                Array2::from_shape_fn((k, m), |(i, j)| ((i * 31 + j * 7) % 17) as f32 / 9.0 - 0.9);
            let b =
                Array2::from_shape_fn((k, n), |(i, j)| ((i * 13 + j * 5) % 11) as f32 / 7.0 - 0.7);
            let c0: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32 - 2.0).collect();
            (x, b, c0)
        };
        let acc = |x: &Array2<f32>, b: &Array2<f32>, c0: &[f32]| {
            let mut c = c0.to_vec();
            gemm_acc(&x.t(), &b.view(), &mut c);
            c
        };
        // More rows than gemm takes (split by rows), then fewer rows than
        // columns (split by columns: pairs of panels, a last part of one
        // panel).
        for ((m, k, n), threads) in [
            ((300, 256, 64), &[2, 3][..]),
            ((40, 200, 176), &[2, 3, 4, 7]),
        ] {
            assert!(m * k * n >= PAR_MIN_WORK);
            let (x, b, c0) = operands(m, k, n);
            let run = || acc(&x, &b, &c0);
            let one = on(1, &run);
            assert_eq!(one, fma_chain(&x.t(), &b.view(), &c0));
            for &t in threads {
                assert_eq!(on(t, &run), one, "gemm_acc ({m}, {k}, {n}), {t} threads");
            }
            // From outside any pool (this test's thread, the global
            // pool's threads), where only products of
            // `PAR_MIN_WORK_OUTSIDE` split.
            if m * k * n >= PAR_MIN_WORK_OUTSIDE {
                assert_eq!(run(), one, "gemm_acc ({m}, {k}, {n}) from outside the pool");
            }
        }
    }

    #[test]
    fn it_applies_to_few_rows_only() {
        let a = Array2::<f32>::zeros((MAX_ROWS + 1, 4));
        assert!(!applies(&a.view(), 4));
        let a = Array2::<f32>::zeros((0, 4));
        assert!(!applies(&a.view(), 4));
        let a = Array2::<f32>::zeros((3, 0));
        assert!(!applies(&a.view(), 4));
        let a = Array2::<f32>::zeros((3, 4));
        assert!(!applies(&a.view(), 0));
        assert!(!applies(&a.slice(ndarray::s![..;-1, ..]), 4));
        assert_eq!(applies(&a.view(), 4), available());
    }
}
