//! The product kernels against plain loops and the fused multiply-add chain.

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
        let x = Array2::from_shape_fn((k, m), |(i, j)| ((i * 31 + j * 7) % 17) as f32 / 9.0 - 0.9);
        let b = Array2::from_shape_fn((k, n), |(i, j)| ((i * 13 + j * 5) % 11) as f32 / 7.0 - 0.7);
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
