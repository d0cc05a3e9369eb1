//! The trace loops against their formula, on one and several threads;
//! the row layout; the flushing of tiny values.

use super::dense::*;
use super::*;
use rand::{Rng, SeedableRng};

/// Values below `√(smallest normal)` become zero, others (and NaN,
/// infinities) stay; an operand without tiny elements is not copied.
#[test]
fn flush_zeroes_tiny_values_only() {
    for v in [1e-20f32, -1e-20, 1e-30, f32::MIN_POSITIVE, 1e-40, -1e-44] {
        assert_eq!(flush(v), 0.0, "{v:e}");
    }
    for v in [2e-19f32, -1e-10, 1.0, f32::INFINITY, f32::MAX] {
        assert_eq!(flush(v), v, "{v:e}");
    }
    assert!(flush(f32::NAN).is_nan());
    assert_eq!(flush(1e-160f64), 0.0);
    assert_eq!(flush(1e-150f64), 1e-150);
    let mut keep = Vec::new();
    let plain = [0.0f32, 1.0, -2e-19, 3.0];
    assert!(std::ptr::eq(flushed(&plain, &mut keep), &plain[..]));
    let some = [0.0f32, 1.0, 1e-25, 3.0];
    assert_eq!(flushed(&some, &mut keep), &[0.0, 1.0, 0.0, 3.0]);
}

/// A trace that no input refreshes decays to exact zeros, never
/// through subnormals (which cost a microcode assist per multiply),
/// and its gradient products stay normal on the way.
#[test]
fn a_decaying_trace_reaches_zero_without_subnormals() {
    let no = 19;
    let d: Vec<f32> = (0..no).map(|o| 0.3 + 0.03 * o as f32).collect();
    let f = vec![0.0f32; no];
    let g = vec![1e-3f32; no];
    let mut row = vec![1.0f32; no];
    let mut grow = vec![0.0f32; no];
    for step in 0..400 {
        row1(&mut row, &mut grow, 0.0, &d, &f, Some(&g), Solve::After);
        for (o, v) in row.iter().chain(&grow).enumerate() {
            assert!(!v.is_subnormal(), "step {step}, element {o}: {v:e}");
        }
    }
    assert!(row.iter().all(|&v| v == 0.0), "{row:?}");
    // Two states per neuron, as LIF lays them out.
    // D = [[0.3, 0.3], [0.3, 0.3]] per neuron (eigenvalues 0.6, 0).
    let d2 = vec![0.3f32; 4 * no];
    let (f2, g2) = (vec![0.0f32; 2 * no], vec![1e-3f32; 2 * no]);
    let mut row = vec![1.0f32; 2 * no];
    for step in 0..400 {
        row2(&mut row, &mut grow, 0.0, &d2, &f2, Some(&g2), Solve::Before);
        for (o, v) in row.iter().chain(&grow).enumerate() {
            assert!(!v.is_subnormal(), "pair, step {step}, element {o}: {v:e}");
        }
    }
    assert!(row.iter().all(|&v| v == 0.0), "{row:?}");
    // The sparse loop, one and two states per stored entry, with a
    // tiny operand in `D` (flushed when the operands are borrowed).
    for s in [1, 2] {
        let (no, nnz, n_in) = (3, 5, 4);
        let sp = SparseIdx {
            rows: vec![0, 1, 1, 2, 3],
            cols: vec![0, 2, 1, 0, 2],
            n_in,
        };
        let dims = SpDims {
            batch: 1,
            nnz,
            n_in,
            o: no,
            s,
        };
        let mut d = vec![0.6f32 / s as f32; no * s * s];
        d[0] = 1e-30;
        let (df, g, x) = (
            vec![0.0f32; no * s],
            vec![1e-3f32; no * s],
            vec![1.0f32; n_in],
        );
        let stored = |v: &[f32]| {
            ArrayData::F32(
                ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[v.len()]), v.to_vec()).unwrap(),
            )
        };
        let (d, df, g, x) = (stored(&d), stored(&df), stored(&g), stored(&x));
        let mut e = TraceBuf::F32(
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[nnz * s]), vec![1.0f32; nnz * s])
                .unwrap(),
        );
        let mut grad = stored(&vec![0.0f32; nnz]);
        for step in 0..300 {
            let ops = Stored {
                x: Some(&x),
                d: &d,
                df: &df,
                g: Some(&g),
                scale: None,
            };
            run(
                Loop::Sparse(dims, &sp),
                &mut e,
                &mut grad,
                ops,
                Solve::After,
                1,
            )
            .unwrap();
            for v in e.widened().to_vec_f64().iter().chain(&grad.to_vec_f64()) {
                assert!(
                    !(*v as f32).is_subnormal(),
                    "sparse, {s} states, step {step}: {v:e}"
                );
            }
        }
        assert!(
            e.widened().to_vec_f64().iter().all(|&v| v == 0.0),
            "sparse, {s} states"
        );
    }
}

/// The update written as the formula, element by element.
#[allow(clippy::too_many_arguments)]
fn reference(
    dims: Dims,
    e: &mut [f64],
    grad: &mut [f64],
    x: Option<&[f64]>,
    d: &[f64],
    df: &[f64],
    g: &[f64],
    scale: Option<&[f64]>,
    solve: Solve,
) {
    let Dims {
        batch,
        i: ni,
        o: no,
        s,
    } = dims;
    // Public layouts: e (b, i, o, a), D (b, o, a, c), Df and g (b, o, a).
    let old = e.to_vec();
    let at = |b: usize, i: usize, o: usize, a: usize| ((b * ni + i) * no + o) * s + a;
    let dat = |b: usize, a: usize, c: usize, o: usize| ((b * no + o) * s + a) * s + c;
    let fat = |b: usize, a: usize, o: usize| (b * no + o) * s + a;
    for b in 0..batch {
        for i in 0..ni {
            let xi = x.map_or(1.0, |x| x[b * ni + i]);
            for o in 0..no {
                for a in 0..s {
                    let mut v = xi * df[fat(b, a, o)] * scale.map_or(1.0, |s| s[i * no + o]);
                    for c in 0..s {
                        v += d[dat(b, a, c, o)] * old[at(b, i, o, c)];
                    }
                    e[at(b, i, o, a)] = v;
                }
                if solve != Solve::None {
                    for a in 0..s {
                        let src = if solve == Solve::Before {
                            old[at(b, i, o, a)]
                        } else {
                            e[at(b, i, o, a)]
                        };
                        grad[i * no + o] += g[fat(b, a, o)] * src;
                    }
                }
            }
        }
    }
}

#[test]
fn blocked_rows_are_blocks_of_lanes_outputs_value_by_value() {
    // 10 outputs x 2 values: a full block of 8, then one of 2.
    let lay = Blocked { n: 10, k: 2 };
    let public: Vec<(usize, usize)> = (0..10).flat_map(|o| [(o, 0), (o, 1)]).collect();
    let mut got = public.clone();
    lay.block_rows(&public, &mut got);
    let mut want: Vec<(usize, usize)> = (0..8).map(|o| (o, 0)).collect();
    want.extend((0..8).map(|o| (o, 1)));
    want.extend([(8, 0), (9, 0), (8, 1), (9, 1)]);
    assert_eq!(LANES, 8);
    assert_eq!(got, want);
    let mut back = got.clone();
    lay.unblock_rows(&got, &mut back);
    assert_eq!(back, public);
    // Several rows, each on its own; one value per output is the identity.
    let rows: Vec<usize> = (0..3 * 10 * 2).collect();
    let mut moved = rows.clone();
    lay.block_rows(&rows, &mut moved);
    assert_eq!(
        moved[20..40],
        moved[..20].iter().map(|v| v + 20).collect::<Vec<_>>()[..]
    );
    let plain = Blocked { n: 13, k: 1 };
    let v: Vec<usize> = (0..26).collect();
    let mut w = vec![0; 26];
    plain.block_rows(&v, &mut w);
    assert_eq!(v, w);
}

#[test]
fn the_kernel_equals_the_formula_on_one_and_several_threads() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for &(batch, ni, no, s, has_x) in &[
        (2, 5, 3, 1, true),
        (3, 7, 4, 2, true),
        (1, 4, 5, 3, true),
        (2, 1, 6, 2, false),
        (4, 2, 3, 1, true),
        (2, 9, 2, 4, true),
        // Outputs over one block wide, with a narrower last block.
        (2, 3, 11, 2, true),
        (1, 2, 19, 3, true),
        (2, 4, 17, 1, true),
        (3, 1, 9, 2, false),
    ] {
        for (solve, scaled) in [Solve::None, Solve::After, Solve::Before]
            .into_iter()
            .flat_map(|s| [(s, false), (s, true)])
        {
            let dims = Dims {
                batch,
                i: ni,
                o: no,
                s,
            };
            let mut draw =
                |n: usize| -> Vec<f64> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
            let e0 = draw(batch * ni * no * s);
            let g0 = draw(ni * no);
            let x = draw(batch * ni);
            let d = draw(batch * no * s * s);
            let df = draw(batch * no * s);
            let g = draw(batch * no * s);
            let scale = draw(ni * no);
            let xo = has_x.then_some(&x[..]);
            let sc = scaled.then_some(&scale[..]);
            let (mut er, mut gr) = (e0.clone(), g0.clone());
            reference(dims, &mut er, &mut gr, xo, &d, &df, &g, sc, solve);
            // The kernel's operands, laid out as `Blocked` says.
            let lay = |k: usize, v: &[f64]| {
                let mut out = v.to_vec();
                Blocked { n: no, k }.block_rows(v, &mut out);
                out
            };
            let (eb, d, df, g) = (lay(s, &e0), lay(s * s, &d), lay(s, &df), lay(s, &g));
            for threads in [1, 2, 3, 4, 8] {
                let (mut e, mut gk) = (eb.clone(), g0.clone());
                pool.install(|| {
                    fused(
                        dims,
                        &mut e,
                        &mut gk,
                        Operands {
                            x: xo,
                            d: &d,
                            df: &df,
                            g: Some(&g),
                            scale: sc,
                        },
                        solve,
                        threads,
                    )
                });
                let mut ep = e.clone();
                Blocked { n: no, k: s }.unblock_rows(&e, &mut ep);
                for (a, b) in ep.iter().zip(&er).chain(gk.iter().zip(&gr)) {
                    assert!(
                        (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                        "{dims:?} {solve:?} threads {threads}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// bf16 traces of an f32 model: the loop this CPU runs (the hand-written
/// AVX-512 BF16 one where it can, `bf16x`) against the generic loop
/// (reached by pretending the CPU has no AVX-512), bit for bit, on one and
/// several threads: every solve, with and without a transform and an
/// input, rows shorter than, equal to and longer than 32 values with a
/// remainder, and values the flush zeroes, infinities and NaN among them.
#[test]
fn the_bf16_loop_equals_the_generic_one_bit_for_bit() {
    use half::bf16;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let special = [
        1e-20f32,
        -3e-21,
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NAN,
        1e30,
        -2.5,
    ];
    let mut runs = 0;
    for &(batch, ni, no, s, has_x) in &[
        (2, 5, 3, 1, true),
        (3, 4, 32, 1, true),
        (2, 7, 33, 1, false),
        (2, 3, 64, 1, true),
        (3, 5, 100, 1, true),
        (1, 9, 517, 1, true),
        (2, 3, 40, 2, true),
    ] {
        for (solve, scaled) in [Solve::None, Solve::After, Solve::Before]
            .into_iter()
            .flat_map(|s| [(s, false), (s, true)])
        {
            let dims = Dims {
                batch,
                i: ni,
                o: no,
                s,
            };
            let mut draw = |n: usize| -> Vec<f32> {
                (0..n)
                    .map(|_| {
                        if rng.random_range(0..20) == 0 {
                            special[rng.random_range(0..special.len())]
                        } else {
                            rng.random_range(-1.5..1.5)
                        }
                    })
                    .collect()
            };
            let e0: Vec<bf16> = draw(batch * ni * no * s)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let g0 = draw(ni * no);
            let (x, d, df, g, scale) = (
                draw(batch * ni),
                draw(batch * no * s * s),
                draw(batch * no * s),
                draw(batch * no * s),
                draw(ni * no),
            );
            let ops = Operands {
                x: has_x.then_some(&x[..]),
                d: &d,
                df: &df,
                g: Some(&g),
                scale: scaled.then_some(&scale[..]),
            };
            let (mut ew, mut gw) = (e0.clone(), g0.clone());
            crate::kernels::without_avx512(|| fused(dims, &mut ew, &mut gw, ops, solve, 1));
            let want: Vec<u32> = ew
                .iter()
                .map(|v| v.to_bits() as u32)
                .chain(gw.iter().map(|v| v.to_bits()))
                .collect();
            for threads in [1, 2, 3] {
                let (mut e, mut gk) = (e0.clone(), g0.clone());
                pool.install(|| fused(dims, &mut e, &mut gk, ops, solve, threads));
                let got: Vec<u32> = e
                    .iter()
                    .map(|v| v.to_bits() as u32)
                    .chain(gk.iter().map(|v| v.to_bits()))
                    .collect();
                for (at, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a == b,
                        "{dims:?} {solve:?} scaled {scaled} threads {threads}: value {at}: {a:#x} vs {b:#x}"
                    );
                }
                runs += 1;
            }
        }
    }
    assert_eq!(runs, 7 * 6 * 3);
    if !super::bf16x::available() {
        eprintln!("no AVX-512 BF16 on this CPU: the generic loop was compared with itself");
    }
}
