//! Broadcast operands, outer products and skipped unit-axis reshapes in
//! fused loops ([`super::broadcast`], [`super::unit_axes`]): the same bits
//! as the interpreter, and what the plan runs.

use super::tests::{check, fused_groups, random_array};
use super::*;
use crate::graph::trace;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// `t` in row-major or (`column_major`) column-major memory order.
fn lay(a: ArrayD<f64>, column_major: bool) -> Tensor {
    if column_major {
        Tensor::from_array(
            a.reversed_axes()
                .as_standard_layout()
                .reversed_axes()
                .to_owned(),
        )
    } else {
        Tensor::from_array(a)
    }
}

/// How many equations the plan runs outside fused loops, by primitive name.
fn unfused(p: &Plan, name: &str) -> usize {
    p.steps
        .iter()
        .filter(|s| matches!(s, Step::Eqn { eqn, .. } if p.graph.eqns[*eqn].prim.name() == name))
        .count()
}

#[test]
fn spread_fill_is_the_broadcast_by_index() {
    // Every element of a block against the operand's element at the
    // loop index with the broadcast axes set to 0, in both orders, for
    // blocks that start and end inside runs, and blocks of more runs than
    // are remembered.
    let cases: [(&[usize], &[usize]); 6] = [
        (&[3, 1, 5], &[3, 4, 5]),
        (&[3, 4, 1], &[3, 4, 5]),
        (&[4, 1], &[3, 4, 5]),
        (&[1, 1, 5], &[2, 3, 5]),
        (&[2, 1, 3, 1], &[2, 4, 3, 2]),
        (&[1, 7], &[6, 7]),
    ];
    for (a, out) in cases {
        let size: usize = out.iter().product();
        let mut full = vec![1; out.len() - a.len()];
        full.extend_from_slice(a);
        let n: usize = a.iter().product();
        let s = Spread::new(a, out);
        for order in [Order::C, Order::F] {
            // The operand's elements in `order`: element `k` is `k`.
            let src: Vec<f64> = (0..n).map(|k| k as f64).collect();
            let at = |p: usize| -> f64 {
                // Loop index of element `p` in `order`, then the operand's.
                let r = out.len();
                let axes: Vec<usize> = match order {
                    Order::C => (0..r).rev().collect(),
                    Order::F => (0..r).collect(),
                };
                let (mut rem, mut off, mut step) = (p, 0, 1);
                let mut idx = vec![0; r];
                for &k in &axes {
                    idx[k] = rem % out[k];
                    rem /= out[k];
                }
                for &k in &axes {
                    let i = if full[k] == 1 { 0 } else { idx[k] };
                    off += i * step;
                    step *= full[k];
                }
                off as f64
            };
            // One buffer filled block after block, as a loop does: an
            // identical block is left as it is, any other written.
            let (mut held, mut last) = (Vec::new(), Runs::default());
            for start in [0, 1, 4, 5, 7, size / 2, size - 1] {
                for len in [1, 2, 5, 9, size] {
                    let len = len.min(size - start);
                    let mut got = vec![f64::NAN; len];
                    s.fill(&mut got, &src, (start, order), &mut Runs::default());
                    let want: Vec<f64> = (start..start + len).map(at).collect();
                    assert_eq!(got, want, "{a:?} in {out:?}, {order:?}, {start}+{len}");
                    for _ in 0..2 {
                        held.resize(len, f64::NAN);
                        s.fill(&mut held, &src, (start, order), &mut last);
                        assert_eq!(held, want, "{a:?} in {out:?}, {order:?}, {start}+{len}");
                    }
                }
            }
        }
    }
}

#[test]
fn plan_fuses_middle_axis_broadcasts_and_outer_products() {
    // D-RTRL's trace update and solve, as the rules write them:
    // `t * h[:, None, :] + x[:, :, None] @ d[:, None, :]` (an outer
    // product: a contraction of one), then `Σ_b new * g[:, None, :]`; in
    // row- and column-major loops, shapes whose blocks hold a whole number
    // of runs (remembered fills) or not.
    let mut rng = StdRng::seed_from_u64(21);
    for (b, i, o) in [(3, 16, 128), (5, 37, 13)] {
        assert!(b * i * o > BLOCK);
        for column_major in [false, true] {
            let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
            let t = lay(arr(&[b, i, o]), column_major);
            let (h, x) = (
                Tensor::from_array(arr(&[b, 1, o])),
                Tensor::from_array(arr(&[b, i, 1])),
            );
            let (d, g) = (
                Tensor::from_array(arr(&[b, 1, o])),
                Tensor::from_array(arr(&[b, 1, o])),
            );
            let s = Tensor::from_array(arr(&[i, 1]));
            let args = vec![t, h, x, d, g, s];
            let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
            let gr = trace(
                |a: &[Tensor]| {
                    let outer = a[2].matmul(&a[3])?;
                    let new = a[0].mul(&a[1])?.add(&outer)?.add(&a[5])?;
                    let grad = new.mul(&a[4])?.sum(&[0])?;
                    Ok(vec![new, grad])
                },
                &avals,
            )
            .unwrap();
            let p = check(gr, &args, "broadcasts");
            // The update (mul, outer product, two adds) and the solve's
            // product, each one loop; the outer product is no matmul step.
            assert_eq!(fused_groups(&p), vec![5], "{b}x{i}x{o} {column_major}");
            assert_eq!(unfused(&p, "matmul"), 0);
            assert_eq!(unfused(&p, "mul"), 0);
            // The solve's sum over the batch is added up by the loop.
            assert_eq!(unfused(&p, "reduce_sum"), 0);
        }
    }
}

#[test]
fn plan_fuses_a_two_dimensional_outer_product() {
    let mut rng = StdRng::seed_from_u64(22);
    let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
    let (x, d, c) = (
        Tensor::from_array(arr(&[40, 1])),
        Tensor::from_array(arr(&[1, 30])),
        Tensor::from_array(arr(&[40, 30])),
    );
    let args = vec![x, d, c];
    let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
    let g = trace(
        |a: &[Tensor]| Ok(vec![a[0].matmul(&a[1])?.add(&a[2])?.tanh()?]),
        &avals,
    )
    .unwrap();
    let p = check(g, &args, "outer");
    assert_eq!(fused_groups(&p), vec![3]);
    assert_eq!(unfused(&p, "matmul"), 0);
}

#[test]
fn plan_reads_through_unit_axis_reshapes() {
    // A trace with a trailing state axis of one, `t[..., 0]`, read by a
    // fused loop (and held by the caller): the loop reads `t` itself, no
    // reshape runs; the new trace gets its axis back (a reshape of the
    // loop's own result), and a reshape also read elsewhere still runs.
    let mut rng = StdRng::seed_from_u64(23);
    for column_major in [false, true] {
        let mut arr = |shape: &[usize]| random_array(&mut rng, shape);
        let t = lay(arr(&[4, 30, 20, 1]), column_major);
        let h = Tensor::from_array(arr(&[4, 1, 20]));
        let args = vec![t, h];
        let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
        let g = trace(
            |a: &[Tensor]| {
                let t0 = a[0].index_axis(3, 0)?;
                let new = t0.mul(&a[1])?.exp()?;
                Ok(vec![new.expand_dims(3)?])
            },
            &avals,
        )
        .unwrap();
        let p = check(g, &args, "unit axes");
        assert_eq!(fused_groups(&p), vec![2]);
        // Only the new trace's reshape runs.
        assert_eq!(unfused(&p, "reshape"), 1, "{column_major}");
        let g2 = trace(
            |a: &[Tensor]| {
                let t0 = a[0].index_axis(3, 0)?;
                Ok(vec![t0.mul(&a[1])?, t0.sum(&[0])?])
            },
            &avals,
        )
        .unwrap();
        let p2 = check(g2, &args, "unit axes read elsewhere");
        assert_eq!(unfused(&p2, "reshape"), 1, "{column_major}");
    }
}

#[test]
fn plan_takes_sums_over_leading_axes_in_the_loop() {
    // Sums over leading axes of a loop's result nothing else reads are
    // added up block by block (rows longer and shorter than a block, a
    // column-major operand); a sum over another axis, or of a value also
    // returned, runs as its own step. The same bits as the interpreter.
    let mut rng = StdRng::seed_from_u64(24);
    for (shape, axes, taken) in [
        (vec![4, 30, 20], vec![0], true),
        (vec![4, 30, 20], vec![0, 1], true),
        (vec![3, 2, 700], vec![0], true),
        (vec![1, 30, 20], vec![0], true),
        (vec![4, 30, 20], vec![1], false),
        (vec![4, 30, 20], vec![0, 2], false),
    ] {
        for column_major in [false, true] {
            let mut arr = |s: &[usize]| random_array(&mut rng, s);
            let x = lay(arr(&shape), column_major);
            let h = Tensor::from_array(arr(&[shape[0], 1, shape[2]]));
            let args = vec![x, h];
            let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
            let axes2 = axes.clone();
            let g = trace(
                |a: &[Tensor]| {
                    let y = a[0].mul(&a[1])?.tanh()?;
                    Ok(vec![y.sum(&axes2)?, a[0].exp()?])
                },
                &avals,
            )
            .unwrap();
            let p = check(g, &args, "sums");
            let what = format!("{shape:?} {axes:?} {column_major}");
            assert_eq!(unfused(&p, "reduce_sum"), usize::from(!taken), "{what}");
            let axes2 = axes.clone();
            let returned = trace(
                |a: &[Tensor]| {
                    let y = a[0].mul(&a[1])?;
                    Ok(vec![y.sum(&axes2)?, y])
                },
                &avals,
            )
            .unwrap();
            let p = check(returned, &args, "sums of a returned value");
            assert_eq!(unfused(&p, "reduce_sum"), 1, "{what}");
        }
    }
}
