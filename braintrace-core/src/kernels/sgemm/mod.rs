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
// SAFETY: as for `Send`: shared reads of a borrowed `B` only.
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
// SAFETY: as for `Send`: each thread writes only its own part.
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
mod x86;

#[cfg(test)]
mod tests;
