//! Acceptance tests of every core op reachable through `Tensor` methods (and
//! `scatter_add`): forward values against explicit loops / hand formulas,
//! JVP and VJP against central finite differences in f64 (relative error
//! <= 1e-6, including broadcasting cases), and vmap against an explicit
//! loop over the mapped axis (axis 0 and non-zero axes, some operands
//! unmapped).

mod common;

use braintrace::ops::index::scatter_add;
use braintrace::prelude::*;
use common::*;

type Fv = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>>;
/// Per-example shapes of two operands and their in_axes.
type VmapCase = (Vec<usize>, Vec<usize>, Vec<Option<usize>>);
/// A reference comparison.
type CmpRef = fn(f64, f64) -> bool;

/// Lift a one-operand tensor function to the transform signature.
fn f1(g: impl Fn(&Tensor) -> Result<Tensor> + 'static) -> Fv {
    Box::new(move |a: &[Tensor]| Ok(vec![g(&a[0])?]))
}

/// Lift a two-operand tensor function to the transform signature.
fn f2(g: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + 'static) -> Fv {
    Box::new(move |a: &[Tensor]| Ok(vec![g(&a[0], &a[1])?]))
}

/// Forward check of an element-wise unary op against `reference`.
#[track_caller]
fn check_unary_forward(name: &str, f: &Fv, x: &Tensor, reference: fn(f64) -> f64) {
    let y = f(std::slice::from_ref(x)).unwrap().remove(0);
    assert_eq!(y.shape(), x.shape(), "{name}: shape");
    assert_eq!(y.dtype(), DType::F64, "{name}: dtype");
    let want: Vec<f64> = v(x).into_iter().map(reference).collect();
    assert_allclose(&format!("{name}: forward"), &v(&y), &want, 1e-13, 1e-15);
}

/// The full battery for an element-wise one-operand op.
#[track_caller]
fn unary_battery(name: &str, f: Fv, reference: fn(f64) -> f64, gen: Gen, seed: u64) {
    let mut rng = Lcg::new(seed);
    let dummy = Tensor::scalar(0.0);
    for shape in [&[2usize, 3][..], &[][..], &[5][..]] {
        let x = gen.make(&mut rng, shape, &dummy);
        check_unary_forward(name, &f, &x, reference);
        check_grads(&format!("{name} {shape:?}"), &*f, &[x], &mut rng);
    }
    let ex = gen.make(&mut rng, &[2, 3], &dummy);
    for ax in [0, 1, 2] {
        check_vmap_from_examples(
            name,
            &*f,
            std::slice::from_ref(&ex),
            &[gen],
            &[Some(ax)],
            &mut rng,
        );
    }
}

macro_rules! unary_tests {
    ($($test:ident: $op:expr, $reference:expr, $gen:expr;)*) => {$(
        #[test]
        fn $test() {
            unary_battery(stringify!($test), f1($op), $reference, $gen, line!() as u64);
        }
    )*};
}

/// `erf` by its Maclaurin series `2/√π Σ (−1)ⁿ x^{2n+1} / (n! (2n+1))`
/// (alternating; accurate to ~1e-16 for the |x| < 1 the battery draws),
/// another algorithm than the op's.
fn erf_maclaurin(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..60 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * std::f64::consts::FRAC_2_SQRT_PI
}

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

unary_tests! {
    unary_neg: Tensor::neg, |x| -x, Gen::Normal;
    unary_exp: Tensor::exp, f64::exp, Gen::Normal;
    unary_log: Tensor::log, f64::ln, Gen::Positive;
    unary_tanh: Tensor::tanh, f64::tanh, Gen::Normal;
    unary_sigmoid: Tensor::sigmoid, sigmoid_ref, Gen::Normal;
    unary_relu: Tensor::relu, |x| if x > 0.0 { x } else { 0.0 }, Gen::AwayFromZero;
    unary_sqrt: Tensor::sqrt, f64::sqrt, Gen::Positive;
    unary_abs: Tensor::abs, f64::abs, Gen::AwayFromZero;
    unary_sin: Tensor::sin, f64::sin, Gen::Normal;
    unary_cos: Tensor::cos, f64::cos, Gen::Normal;
    unary_square: Tensor::square, |x| x * x, Gen::Normal;
    unary_reciprocal: Tensor::reciprocal, |x| 1.0 / x, Gen::AwayFromZero;
    unary_softplus: Tensor::softplus, |x| (1.0 + x.exp()).ln(), Gen::Normal;
    unary_atan: Tensor::atan, |x| x.atan(), Gen::Normal;
    unary_erf: Tensor::erf, erf_maclaurin, Gen::Normal;
    scalar_mul: |x: &Tensor| x.mul_scalar(1.7), |x| 1.7 * x, Gen::Normal;
    scalar_mul_negative: |x: &Tensor| x.mul_scalar(-0.6), |x| -0.6 * x, Gen::Normal;
    scalar_add: |x: &Tensor| x.add_scalar(-0.3), |x| x - 0.3, Gen::Normal;
    scalar_rsub: |x: &Tensor| x.rsub_scalar(2.0), |x| 2.0 - x, Gen::Normal;
    scalar_rdiv: |x: &Tensor| x.rdiv_scalar(1.5), |x| 1.5 / x, Gen::AwayFromZero;
    scalar_pow_fractional: |x: &Tensor| x.pow_scalar(2.5), |x| x.powf(2.5), Gen::Positive;
    scalar_pow_negative_exponent: |x: &Tensor| x.pow_scalar(-1.5), |x| x.powf(-1.5), Gen::Positive;
    scalar_pow_integer_negative_base: |x: &Tensor| x.pow_scalar(3.0), |x| x * x * x, Gen::AwayFromZero;
    scalar_max: |x: &Tensor| x.max_scalar(0.0), |x| x.max(0.0), Gen::AwayFromZero;
    scalar_max_shifted: |x: &Tensor| x.max_scalar(0.5), |x| x.max(0.5), Gen::Lattice(0.0);
    scalar_min: |x: &Tensor| x.min_scalar(0.0), |x| x.min(0.0), Gen::AwayFromZero;
    scalar_min_shifted: |x: &Tensor| x.min_scalar(-0.5), |x| x.min(-0.5), Gen::Lattice(0.0);
    composite_sub_scalar: |x: &Tensor| x.sub_scalar(0.25), |x| x - 0.25, Gen::Normal;
    composite_div_scalar: |x: &Tensor| x.div_scalar(4.0), |x| x / 4.0, Gen::Normal;
}

/// Large-magnitude inputs: the stable kernels must not overflow.
#[test]
fn unary_extreme_inputs_are_finite() {
    let x = t(vec![-800.0, -40.0, 0.0, 40.0, 800.0], &[5]);
    let s = v(&x.sigmoid().unwrap());
    assert_allclose(
        "sigmoid",
        &s,
        &[0.0, sigmoid_ref(-40.0), 0.5, 1.0, 1.0],
        1e-15,
        1e-300,
    );
    let sp = v(&x.softplus().unwrap());
    assert_allclose(
        "softplus",
        &sp,
        &[0.0, (-40f64).exp(), 2f64.ln(), 40.0, 800.0],
        1e-15,
        1e-300,
    );
    let (_, g) = jvp(
        |a: &[Tensor]| Ok(vec![a[0].softplus()?]),
        std::slice::from_ref(&x),
        &[x.ones_like()],
    )
    .unwrap();
    let want: Vec<f64> = v(&x).into_iter().map(sigmoid_ref).collect();
    assert_allclose("softplus'", &v(&g[0]), &want, 1e-15, 1e-300);
}

// ------------------------------------------------------------------ binary

/// Broadcasting shape cases `(a, b)`, including scalar-shaped operands.
fn binary_shapes() -> Vec<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    vec![
        (vec![2, 3], vec![2, 3], vec![2, 3]),
        (vec![3, 1], vec![1, 4], vec![3, 4]),
        (vec![2, 3], vec![3], vec![2, 3]),
        (vec![3], vec![2, 3], vec![2, 3]),
        (vec![], vec![2, 3], vec![2, 3]),
        (vec![2, 3], vec![], vec![2, 3]),
        (vec![], vec![], vec![]),
        (vec![4, 1, 3], vec![2, 1], vec![4, 2, 3]),
    ]
}

#[track_caller]
fn binary_battery(name: &str, f: Fv, reference: fn(f64, f64) -> f64, ga: Gen, gb: Gen, seed: u64) {
    let mut rng = Lcg::new(seed);
    let dummy = Tensor::scalar(0.0);
    for (sa, sb, so) in binary_shapes() {
        let a = ga.make(&mut rng, &sa, &dummy);
        let b = gb.make(&mut rng, &sb, &dummy);
        let y = f(&[a.clone(), b.clone()]).unwrap().remove(0);
        assert_eq!(y.shape(), so.as_slice(), "{name}: {sa:?} with {sb:?}");
        let want = ref_binary(&a, &b, &so, reference);
        assert_allclose(
            &format!("{name} {sa:?},{sb:?}: forward"),
            &v(&y),
            &want,
            1e-13,
            1e-15,
        );
        check_grads(&format!("{name} {sa:?},{sb:?}"), &*f, &[a, b], &mut rng);
    }
    // vmap: both mapped, one unmapped, non-zero axes, broadcasting examples.
    let cases: Vec<VmapCase> = vec![
        (vec![2, 3], vec![2, 3], vec![Some(0), Some(0)]),
        (vec![2, 3], vec![2, 3], vec![Some(1), Some(2)]),
        (vec![2, 3], vec![2, 3], vec![Some(2), None]),
        (vec![2, 3], vec![2, 3], vec![None, Some(1)]),
        (vec![3, 1], vec![1, 4], vec![Some(0), Some(0)]),
        (vec![3, 1], vec![1, 4], vec![Some(1), None]),
        (vec![3, 1], vec![1, 4], vec![None, Some(2)]),
        (vec![2, 3], vec![3], vec![Some(1), Some(0)]),
        (vec![2, 3], vec![3], vec![None, Some(1)]),
        (vec![], vec![2, 3], vec![Some(0), Some(1)]),
        (vec![2, 3], vec![], vec![Some(2), Some(0)]),
        (vec![], vec![2], vec![Some(0), None]),
    ];
    for (sa, sb, axes) in cases {
        let a = ga.make(&mut rng, &sa, &dummy);
        let b = gb.make(&mut rng, &sb, &dummy);
        check_vmap_from_examples(
            &format!("{name} {sa:?},{sb:?}"),
            &*f,
            &[a, b],
            &[ga, gb],
            &axes,
            &mut rng,
        );
    }
}

macro_rules! binary_tests {
    ($($test:ident: $op:expr, $reference:expr, $ga:expr, $gb:expr;)*) => {$(
        #[test]
        fn $test() {
            binary_battery(stringify!($test), f2($op), $reference, $ga, $gb, line!() as u64);
        }
    )*};
}

binary_tests! {
    binary_add: Tensor::add, |a, b| a + b, Gen::Normal, Gen::Normal;
    binary_sub: Tensor::sub, |a, b| a - b, Gen::Normal, Gen::Normal;
    binary_mul: Tensor::mul, |a, b| a * b, Gen::Normal, Gen::Normal;
    binary_div: Tensor::div, |a, b| a / b, Gen::Normal, Gen::AwayFromZero;
    binary_maximum: Tensor::maximum, f64::max, Gen::Lattice(0.5), Gen::Lattice(0.0);
    binary_minimum: Tensor::minimum, f64::min, Gen::Lattice(0.0), Gen::Lattice(0.5);
    binary_pow: Tensor::pow, f64::powf, Gen::Positive, Gen::Normal;
}

/// The same operand on both sides: tangents from both operands add up.
#[test]
fn binary_same_operand_twice() {
    let mut rng = Lcg::new(5);
    let x = rng.positive(&[2, 3]);
    for (name, f) in [
        ("x*x", f1(|x| x.mul(x))),
        ("x/x+x", f1(|x| x.div(x)?.add(x))),
        ("x^x", f1(|x| x.pow(x))),
        ("x-x*2", f1(|x| x.sub(&x.mul_scalar(2.0)?))),
    ] {
        check_grads(name, &*f, std::slice::from_ref(&x), &mut rng);
    }
}

// ------------------------------------------------------------------ matmul

/// numpy matmul by explicit loops: 1-D promotion, broadcast leading dims.
fn ref_matmul(a: &Tensor, b: &Tensor) -> (Vec<usize>, Vec<f64>) {
    let (mut sa, mut sb) = (a.shape().to_vec(), b.shape().to_vec());
    let (a1, b1) = (sa.len() == 1, sb.len() == 1);
    if a1 {
        sa.insert(0, 1);
    }
    if b1 {
        sb.push(1);
    }
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    assert_eq!(k, sb[rb - 2]);
    let la = &sa[..ra - 2];
    let lb = &sb[..rb - 2];
    let r = la.len().max(lb.len());
    let mut lead = vec![1; r];
    for (i, l) in lead.iter_mut().enumerate() {
        let da = if i + la.len() >= r {
            la[i + la.len() - r]
        } else {
            1
        };
        let db = if i + lb.len() >= r {
            lb[i + lb.len() - r]
        } else {
            1
        };
        *l = da.max(db);
    }
    let (av, bv) = (v(a), v(b));
    let nb: usize = lead.iter().product();
    let mut out = Vec::new();
    for bi in 0..nb {
        let li = unravel(bi, &lead);
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let mut ia = li.clone();
                    ia.extend([i, p]);
                    let mut ib = li.clone();
                    ib.extend([p, j]);
                    s += bcast_at(&av, &sa, &ia) * bcast_at(&bv, &sb, &ib);
                }
                out.push(s);
            }
        }
    }
    let mut shape = lead;
    if !a1 {
        shape.push(m);
    }
    if !b1 {
        shape.push(n);
    }
    (shape, out)
}

fn matmul_f() -> Fv {
    f2(Tensor::matmul)
}

#[test]
fn matmul_forward_and_grads() {
    let mut rng = Lcg::new(77);
    let cases: Vec<(Vec<usize>, Vec<usize>, Vec<usize>)> = vec![
        (vec![4], vec![4], vec![]),
        (vec![3, 4], vec![4], vec![3]),
        (vec![4], vec![4, 2], vec![2]),
        (vec![3, 4], vec![4, 2], vec![3, 2]),
        (vec![2, 3, 4], vec![2, 4, 5], vec![2, 3, 5]),
        (vec![2, 3, 4], vec![4, 5], vec![2, 3, 5]),
        (vec![3, 4], vec![2, 4, 5], vec![2, 3, 5]),
        (vec![2, 1, 3, 4], vec![3, 4, 2], vec![2, 3, 3, 2]),
        (vec![2, 3, 4], vec![4], vec![2, 3]),
        (vec![4], vec![2, 4, 3], vec![2, 3]),
    ];
    let f = matmul_f();
    for (sa, sb, so) in cases {
        let a = rng.normal(&sa);
        let b = rng.normal(&sb);
        let y = a.matmul(&b).unwrap();
        let (rs, rv) = ref_matmul(&a, &b);
        assert_eq!(rs, so, "reference shape");
        assert_eq!(y.shape(), so.as_slice(), "matmul {sa:?} @ {sb:?}: shape");
        assert_allclose(
            &format!("matmul {sa:?} @ {sb:?}"),
            &v(&y),
            &rv,
            1e-12,
            1e-12,
        );
        check_grads(&format!("matmul {sa:?} @ {sb:?}"), &*f, &[a, b], &mut rng);
    }
}

#[test]
fn matmul_vmap() {
    let mut rng = Lcg::new(78);
    let f = matmul_f();
    let cases: Vec<VmapCase> = vec![
        (vec![3, 4], vec![4, 2], vec![Some(0), None]),
        (vec![3, 4], vec![4, 2], vec![None, Some(0)]),
        (vec![3, 4], vec![4, 2], vec![Some(0), Some(0)]),
        (vec![3, 4], vec![4, 2], vec![Some(1), Some(2)]),
        (vec![3, 4], vec![4, 2], vec![Some(2), None]),
        (vec![4], vec![4], vec![Some(0), Some(1)]),
        (vec![4], vec![4, 2], vec![Some(1), None]),
        (vec![3, 4], vec![4], vec![None, Some(0)]),
        (vec![3, 4], vec![4], vec![Some(1), Some(1)]),
        (vec![2, 3, 4], vec![4, 5], vec![Some(1), None]),
        (vec![2, 3, 4], vec![4, 5], vec![Some(3), Some(0)]),
        (vec![3, 4], vec![2, 4, 5], vec![None, Some(2)]),
    ];
    for (sa, sb, axes) in cases {
        let a = rng.normal(&sa);
        let b = rng.normal(&sb);
        check_vmap_from_examples(
            &format!("matmul {sa:?} @ {sb:?}"),
            &*f,
            &[a, b],
            &[Gen::Normal, Gen::Normal],
            &axes,
            &mut rng,
        );
    }
}

// ------------------------------------------------------------------ structural ops

/// Reference by gathering: each output element is the input element at
/// `src(out_index)`, or 0 when `None`.
fn ref_gather(
    x: &Tensor,
    out_shape: &[usize],
    src: impl Fn(&[usize]) -> Option<Vec<usize>>,
) -> Vec<f64> {
    let xv = v(x);
    let st = strides(x.shape());
    let n: usize = out_shape.iter().product();
    (0..n)
        .map(|k| match src(&unravel(k, out_shape)) {
            Some(i) => xv[i.iter().zip(&st).map(|(a, b)| a * b).sum::<usize>()],
            None => 0.0,
        })
        .collect()
}

/// Run forward check (`want_shape`, `want`), FD grads and vmap over each of
/// the example's axes (0..=rank) for a one-operand op.
#[track_caller]
fn unary_structural(
    name: &str,
    f: Fv,
    x: &Tensor,
    want_shape: &[usize],
    want: &[f64],
    rng: &mut Lcg,
) {
    let y = f(std::slice::from_ref(x)).unwrap().remove(0);
    assert_tensor(&format!("{name}: forward"), &y, want_shape, want);
    check_grads(name, &*f, std::slice::from_ref(x), rng);
    for ax in 0..=x.ndim() {
        check_vmap_from_examples(
            name,
            &*f,
            std::slice::from_ref(x),
            &[Gen::Normal],
            &[Some(ax)],
            rng,
        );
    }
}

#[test]
fn transpose_op() {
    let mut rng = Lcg::new(10);
    for (shape, perm) in [
        (vec![2, 3], vec![1, 0]),
        (vec![2, 3, 4], vec![2, 0, 1]),
        (vec![2, 3, 4], vec![0, 2, 1]),
        (vec![2, 3, 4], vec![1, 2, 0]),
        (vec![2, 3], vec![0, 1]),
    ] {
        let x = rng.normal(&shape);
        let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let want = ref_gather(&x, &out, |o| {
            let mut i = vec![0; o.len()];
            for (k, &p) in perm.iter().enumerate() {
                i[p] = o[k];
            }
            Some(i)
        });
        let p2 = perm.clone();
        unary_structural(
            &format!("transpose {perm:?}"),
            f1(move |x| x.transpose(&p2)),
            &x,
            &out,
            &want,
            &mut rng,
        );
    }
    let x = rng.normal(&[2, 3, 4]);
    let want = ref_gather(&x, &[2, 4, 3], |o| Some(vec![o[0], o[2], o[1]]));
    unary_structural("t()", f1(Tensor::t), &x, &[2, 4, 3], &want, &mut rng);
}

#[test]
fn reshape_expand_squeeze() {
    let mut rng = Lcg::new(11);
    let x = rng.normal(&[2, 3, 2]);
    let xv = v(&x);
    for target in [
        vec![12],
        vec![6, 2],
        vec![2, 6],
        vec![3, 2, 2],
        vec![1, 12, 1],
        vec![2, 3, 2],
    ] {
        let tg = target.clone();
        unary_structural(
            &format!("reshape {target:?}"),
            f1(move |x| x.reshape(&tg)),
            &x,
            &target,
            &xv,
            &mut rng,
        );
    }
    for axis in 0..=3 {
        let mut s = vec![2, 3, 2];
        s.insert(axis, 1);
        unary_structural(
            &format!("expand_dims {axis}"),
            f1(move |x| x.expand_dims(axis)),
            &x,
            &s,
            &xv,
            &mut rng,
        );
    }
    let y = rng.normal(&[1, 3, 1, 2]);
    let yv = v(&y);
    for (axes, s) in [
        (vec![0], vec![3, 1, 2]),
        (vec![2], vec![1, 3, 2]),
        (vec![0, 2], vec![3, 2]),
        (vec![2, 0], vec![3, 2]),
    ] {
        let a2 = axes.clone();
        unary_structural(
            &format!("squeeze {axes:?}"),
            f1(move |x| x.squeeze(&a2)),
            &y,
            &s,
            &yv,
            &mut rng,
        );
    }
    let s = rng.normal(&[]);
    unary_structural(
        "reshape scalar",
        f1(|x| x.reshape(&[1, 1])),
        &s,
        &[1, 1],
        &v(&s),
        &mut rng,
    );
}

#[test]
fn broadcast_to_op() {
    let mut rng = Lcg::new(12);
    for (shape, target) in [
        (vec![3, 1], vec![2, 3, 4]),
        (vec![4], vec![3, 4]),
        (vec![], vec![2, 2]),
        (vec![1, 1], vec![3, 2]),
        (vec![2, 1, 3], vec![2, 4, 3]),
        (vec![2, 3], vec![2, 3]),
    ] {
        let x = rng.normal(&shape);
        let xv = v(&x);
        let n: usize = target.iter().product();
        let want: Vec<f64> = (0..n)
            .map(|k| bcast_at(&xv, &shape, &unravel(k, &target)))
            .collect();
        let tg = target.clone();
        unary_structural(
            &format!("broadcast_to {shape:?}->{target:?}"),
            f1(move |x| x.broadcast_to(&tg)),
            &x,
            &target,
            &want,
            &mut rng,
        );
    }
}

/// Sum over `axes` by explicit loops.
fn ref_sum(x: &Tensor, axes: &[usize]) -> (Vec<usize>, Vec<f64>) {
    let sh = x.shape();
    let out: Vec<usize> = (0..sh.len())
        .filter(|i| !axes.contains(i))
        .map(|i| sh[i])
        .collect();
    let mut acc = vec![0.0; out.iter().product()];
    let ost = strides(&out);
    for (k, val) in v(x).into_iter().enumerate() {
        let idx = unravel(k, sh);
        let oi: Vec<usize> = (0..sh.len())
            .filter(|i| !axes.contains(i))
            .map(|i| idx[i])
            .collect();
        acc[oi.iter().zip(&ost).map(|(a, b)| a * b).sum::<usize>()] += val;
    }
    (out, acc)
}

#[test]
fn sum_mean_ops() {
    let mut rng = Lcg::new(13);
    let x = rng.normal(&[2, 3, 4]);
    for axes in [
        vec![0],
        vec![1],
        vec![2],
        vec![0, 2],
        vec![2, 0],
        vec![0, 1, 2],
        vec![],
    ] {
        let (s, want) = ref_sum(&x, &axes);
        let a2 = axes.clone();
        unary_structural(
            &format!("sum {axes:?}"),
            f1(move |x| x.sum(&a2)),
            &x,
            &s,
            &want,
            &mut rng,
        );
        let n: usize = axes.iter().map(|&a| x.shape()[a]).product();
        let mean: Vec<f64> = want.iter().map(|w| w / n as f64).collect();
        let a2 = axes.clone();
        unary_structural(
            &format!("mean {axes:?}"),
            f1(move |x| x.mean(&a2)),
            &x,
            &s,
            &mean,
            &mut rng,
        );
    }
    let total: f64 = v(&x).iter().sum();
    unary_structural("sum_all", f1(Tensor::sum_all), &x, &[], &[total], &mut rng);
    unary_structural(
        "mean_all",
        f1(Tensor::mean_all),
        &x,
        &[],
        &[total / 24.0],
        &mut rng,
    );
    let s = rng.normal(&[]);
    unary_structural(
        "sum_all scalar",
        f1(Tensor::sum_all),
        &s,
        &[],
        &v(&s),
        &mut rng,
    );
}

#[test]
fn slice_ops() {
    let mut rng = Lcg::new(14);
    let x = rng.normal(&[4, 5, 3]);
    let (st, li) = (vec![1, 0, 1], vec![3, 4, 3]);
    let want = ref_gather(&x, &[2, 4, 2], |o| Some(vec![o[0] + 1, o[1], o[2] + 1]));
    unary_structural(
        "slice",
        f1(move |x| x.slice(&st, &li)),
        &x,
        &[2, 4, 2],
        &want,
        &mut rng,
    );
    for axis in 0..3 {
        let mut s = x.shape().to_vec();
        s[axis] = 2;
        let want = ref_gather(&x, &s, |o| {
            let mut i = o.to_vec();
            i[axis] += 1;
            Some(i)
        });
        unary_structural(
            &format!("slice_axis {axis}"),
            f1(move |x| x.slice_axis(axis, 1, 3)),
            &x,
            &s,
            &want,
            &mut rng,
        );
        let mut s: Vec<usize> = x.shape().to_vec();
        s.remove(axis);
        let want = ref_gather(&x, &s, |o| {
            let mut i = o.to_vec();
            i.insert(axis, 2);
            Some(i)
        });
        unary_structural(
            &format!("index_axis {axis}"),
            f1(move |x| x.index_axis(axis, 2)),
            &x,
            &s,
            &want,
            &mut rng,
        );
    }
    // Empty slice: shape with a zero dimension.
    let e = x.slice_axis(1, 2, 2).unwrap();
    assert_eq!(e.shape(), &[4, 0, 3]);
}

#[test]
fn pad_op() {
    let mut rng = Lcg::new(15);
    let x = rng.normal(&[2, 3]);
    for (lo, hi) in [
        (vec![1, 0], vec![0, 2]),
        (vec![0, 0], vec![0, 0]),
        (vec![2, 1], vec![1, 1]),
    ] {
        let out = vec![2 + lo[0] + hi[0], 3 + lo[1] + hi[1]];
        let want = ref_gather(&x, &out, |o| {
            let (i, j) = (
                o[0] as isize - lo[0] as isize,
                o[1] as isize - lo[1] as isize,
            );
            (i >= 0 && j >= 0 && i < 2 && j < 3).then(|| vec![i as usize, j as usize])
        });
        let (l2, h2) = (lo.clone(), hi.clone());
        unary_structural(
            &format!("pad {lo:?} {hi:?}"),
            f1(move |x| x.pad(&l2, &h2)),
            &x,
            &out,
            &want,
            &mut rng,
        );
    }
}

#[test]
fn concat_and_stack() {
    let mut rng = Lcg::new(16);
    let a = rng.normal(&[2, 3]);
    let b = rng.normal(&[2, 1]);
    let c = rng.normal(&[2, 2]);
    let (av, bv, cv) = (v(&a), v(&b), v(&c));
    // axis 1
    let f: Fv = Box::new(|x: &[Tensor]| Ok(vec![concat(x, 1)?]));
    let y = f(&[a.clone(), b.clone(), c.clone()]).unwrap().remove(0);
    let mut want = Vec::new();
    for i in 0..2 {
        want.extend(&av[i * 3..i * 3 + 3]);
        want.push(bv[i]);
        want.extend(&cv[i * 2..i * 2 + 2]);
    }
    assert_tensor("concat axis 1", &y, &[2, 6], &want);
    check_grads(
        "concat axis 1",
        &*f,
        &[a.clone(), b.clone(), c.clone()],
        &mut rng,
    );
    for axes in [
        vec![Some(0), Some(0), Some(0)],
        vec![Some(2), None, Some(1)],
        vec![None, Some(0), None],
    ] {
        check_vmap_from_examples(
            "concat axis 1",
            &*f,
            &[a.clone(), b.clone(), c.clone()],
            &[Gen::Normal; 3],
            &axes,
            &mut rng,
        );
    }
    // axis 0
    let d = rng.normal(&[1, 3]);
    let f0: Fv = Box::new(|x: &[Tensor]| Ok(vec![concat(x, 0)?]));
    let y = f0(&[a.clone(), d.clone()]).unwrap().remove(0);
    let mut want = av.clone();
    want.extend(v(&d));
    assert_tensor("concat axis 0", &y, &[3, 3], &want);
    check_grads("concat axis 0", &*f0, &[a.clone(), d.clone()], &mut rng);
    check_vmap_from_examples(
        "concat axis 0",
        &*f0,
        &[a.clone(), d.clone()],
        &[Gen::Normal; 2],
        &[Some(1), None],
        &mut rng,
    );
    // stack
    let p = rng.normal(&[2, 3]);
    for axis in 0..=2 {
        let fs: Fv = Box::new(move |x: &[Tensor]| Ok(vec![stack(x, axis)?]));
        let y = fs(&[a.clone(), p.clone()]).unwrap().remove(0);
        let (s, want) = nd_stack(&[a.clone(), p.clone()], axis);
        assert_tensor(&format!("stack {axis}"), &y, &s, &want);
        check_grads(
            &format!("stack {axis}"),
            &*fs,
            &[a.clone(), p.clone()],
            &mut rng,
        );
        for axes in [vec![Some(0), Some(1)], vec![None, Some(2)]] {
            check_vmap_from_examples(
                &format!("stack {axis}"),
                &*fs,
                &[a.clone(), p.clone()],
                &[Gen::Normal; 2],
                &axes,
                &mut rng,
            );
        }
    }
}

/// numpy take by explicit loops.
fn ref_take(x: &Tensor, idx: &Tensor, axis: usize) -> (Vec<usize>, Vec<f64>) {
    let iv: Vec<usize> = v(idx).into_iter().map(|i| i as usize).collect();
    let mut out = x.shape()[..axis].to_vec();
    out.extend(idx.shape());
    out.extend(&x.shape()[axis + 1..]);
    let r = idx.ndim();
    let ist = strides(idx.shape());
    let want = ref_gather(x, &out, |o| {
        let k: usize = o[axis..axis + r].iter().zip(&ist).map(|(a, b)| a * b).sum();
        let mut i = o[..axis].to_vec();
        i.push(iv[k]);
        i.extend(&o[axis + r..]);
        Some(i)
    });
    (out, want)
}

#[test]
fn take_op() {
    let mut rng = Lcg::new(17);
    let x = rng.normal(&[4, 3, 2]);
    for axis in 0..3 {
        let bound = x.shape()[axis];
        for ishape in [vec![], vec![5], vec![2, 2]] {
            let idx = rng.indices(&ishape, bound);
            let (s, want) = ref_take(&x, &idx, axis);
            let name = format!("take axis {axis} idx {ishape:?}");
            // Indices captured as a constant.
            let i2 = idx.clone();
            unary_structural(
                &name,
                f1(move |x| x.take(&i2, axis)),
                &x,
                &s,
                &want,
                &mut rng,
            );
            // Indices as an (integer, undifferentiated) argument.
            let f = f2(move |x, i| x.take(i, axis));
            check_grads(
                &format!("{name} (idx arg)"),
                &*f,
                &[x.clone(), idx.clone()],
                &mut rng,
            );
            for axes in [
                vec![Some(0), None],
                vec![None, Some(0)],
                vec![Some(1), Some(0)],
            ] {
                check_vmap_from_examples(
                    &name,
                    &*f,
                    &[x.clone(), idx.clone()],
                    &[Gen::Normal, Gen::Index(bound)],
                    &axes,
                    &mut rng,
                );
            }
        }
    }
    // Duplicate indices accumulate in the gradient.
    let x = t(vec![1.0, 2.0, 3.0], &[3]);
    let idx = Tensor::from_vec_typed(vec![2i64, 0, 2, 2], &[4]).unwrap();
    let g = grad(move |a: &[Tensor]| a[0].take(&idx, 0)?.sum_all())(&[x]).unwrap();
    assert_tensor("take grad with duplicates", &g[0], &[3], &[1.0, 0.0, 3.0]);
}

/// scatter_add by explicit loops.
fn ref_scatter(idx: &Tensor, upd: &Tensor, axis: usize, shape: &[usize]) -> Vec<f64> {
    let iv: Vec<usize> = v(idx).into_iter().map(|i| i as usize).collect();
    let mut out = vec![0.0; shape.iter().product()];
    let ost = strides(shape);
    let r = idx.ndim();
    let ist = strides(idx.shape());
    for (k, u) in v(upd).into_iter().enumerate() {
        let o = unravel(k, upd.shape());
        let j: usize = o[axis..axis + r].iter().zip(&ist).map(|(a, b)| a * b).sum();
        let mut dst = o[..axis].to_vec();
        dst.push(iv[j]);
        dst.extend(&o[axis + r..]);
        out[dst.iter().zip(&ost).map(|(a, b)| a * b).sum::<usize>()] += u;
    }
    out
}

#[test]
fn scatter_add_op() {
    let mut rng = Lcg::new(18);
    let shape = [4usize, 3];
    for axis in 0..2 {
        for ishape in [vec![], vec![5], vec![2, 3]] {
            let idx = rng.indices(&ishape, shape[axis]);
            let mut us = shape[..axis].to_vec();
            us.extend(&ishape);
            us.extend(&shape[axis + 1..]);
            let upd = rng.normal(&us);
            let want = ref_scatter(&idx, &upd, axis, &shape);
            let name = format!("scatter_add axis {axis} idx {ishape:?}");
            let f: Fv =
                Box::new(move |a: &[Tensor]| Ok(vec![scatter_add(&a[0], &a[1], axis, &shape)?]));
            let y = f(&[idx.clone(), upd.clone()]).unwrap().remove(0);
            assert_tensor(&name, &y, &shape, &want);
            check_grads(&name, &*f, &[idx.clone(), upd.clone()], &mut rng);
            for axes in [
                vec![None, Some(0)],
                vec![None, Some(us.len())],
                vec![Some(0), Some(0)],
                vec![Some(0), None],
            ] {
                check_vmap_from_examples(
                    &name,
                    &*f,
                    &[idx.clone(), upd.clone()],
                    &[Gen::Index(shape[axis]), Gen::Normal],
                    &axes,
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn where_select() {
    let mut rng = Lcg::new(19);
    for (sc, sa, sb, so) in [
        (vec![2, 3], vec![2, 3], vec![2, 3], vec![2, 3]),
        (vec![2, 1], vec![1, 3], vec![2, 3], vec![2, 3]),
        (vec![3], vec![2, 3], vec![], vec![2, 3]),
    ] {
        let cv: Vec<bool> = (0..sc.iter().product())
            .map(|_| rng.below(2) == 1)
            .collect();
        let cond = Tensor::from_vec_typed(cv.clone(), &sc).unwrap();
        let a = rng.normal(&sa);
        let b = rng.normal(&sb);
        let f: Fv = Box::new(|x: &[Tensor]| Ok(vec![where_(&x[0], &x[1], &x[2])?]));
        let y = f(&[cond.clone(), a.clone(), b.clone()]).unwrap().remove(0);
        let cf: Vec<f64> = cv.iter().map(|&c| if c { 1.0 } else { 0.0 }).collect();
        let (av, bv) = (v(&a), v(&b));
        let n: usize = so.iter().product();
        let want: Vec<f64> = (0..n)
            .map(|k| {
                let i = unravel(k, &so);
                if bcast_at(&cf, &sc, &i) != 0.0 {
                    bcast_at(&av, &sa, &i)
                } else {
                    bcast_at(&bv, &sb, &i)
                }
            })
            .collect();
        let name = format!("where {sc:?} {sa:?} {sb:?}");
        assert_tensor(&name, &y, &so, &want);
        check_grads(&name, &*f, &[cond.clone(), a.clone(), b.clone()], &mut rng);
        let cond_args = |rng: &mut Lcg, axes: &[Option<usize>]| -> Vec<Tensor> {
            // Build the batched bool condition from random 0/1 indices.
            let mut s = sc.clone();
            if let Some(ax) = axes[0] {
                s.insert(ax, 3);
            }
            let n: usize = s.iter().product();
            let c: Vec<bool> = (0..n).map(|_| rng.below(2) == 1).collect();
            let c = Tensor::from_vec_typed(c, &s).unwrap();
            let mk = |rng: &mut Lcg, x: &Tensor, ax: Option<usize>| match ax {
                Some(ax) => batched_like(rng, x, ax, 3, Gen::Normal),
                None => x.clone(),
            };
            vec![c, mk(rng, &a, axes[1]), mk(rng, &b, axes[2])]
        };
        for axes in [
            vec![Some(0), Some(0), Some(0)],
            vec![Some(1), None, None],
            vec![None, Some(1), None],
            vec![None, None, Some(0)],
            vec![Some(0), Some(2), None],
        ] {
            let args = cond_args(&mut rng, &axes);
            check_vmap(&name, &*f, &args, &axes);
        }
    }
    // Condition computed inside the function from the input.
    let x = rng.away_from_zero(&[2, 3]);
    let f = f1(|x| where_(&x.gt(&x.zeros_like())?, &x.square()?, &x.mul_scalar(-3.0)?));
    let want: Vec<f64> = v(&x)
        .iter()
        .map(|&x| if x > 0.0 { x * x } else { -3.0 * x })
        .collect();
    unary_structural("where(x>0, x^2, -3x)", f, &x, &[2, 3], &want, &mut rng);
}

#[test]
fn cast_f32_f64() {
    let mut rng = Lcg::new(20);
    // Multiples of 1/64 in [-2, 2]: exact in f32, and x ± 2^-10 too.
    let xv: Vec<f64> = (0..6)
        .map(|_| (rng.below(257) as f64 - 128.0) / 64.0)
        .collect();
    let x = t(xv.clone(), &[2, 3]);
    let x32 = x.cast(DType::F32).unwrap();
    assert_eq!(x32.dtype(), DType::F32);
    assert_eq!(x32.shape(), &[2, 3]);
    assert_eq!(v(&x32), xv);
    let back = x32.cast(DType::F64).unwrap();
    assert_eq!(back.dtype(), DType::F64);
    assert_eq!(v(&back), xv);
    // f64 -> f32 -> f64 round trip, times a weight: exact finite differences.
    let w = t(vec![0.5, -1.25, 2.0, 0.75, -0.5, 1.5], &[2, 3]);
    let f: Fv =
        Box::new(|a: &[Tensor]| Ok(vec![a[0].cast(DType::F32)?.cast(DType::F64)?.mul(&a[1])?]));
    check_grads_h(
        "cast f64->f32->f64",
        &*f,
        &[x.clone(), w.clone()],
        &mut rng,
        1.0 / 1024.0,
    );
    for axes in [vec![Some(0), None], vec![Some(2), Some(1)]] {
        check_vmap_from_examples(
            "cast",
            &*f,
            &[x.clone(), w.clone()],
            &[Gen::Normal; 2],
            &axes,
            &mut rng,
        );
    }
    // Gradient with respect to an f32 input: sum(cast(x32)^2) -> 2 x, as f32.
    let g =
        grad(|a: &[Tensor]| a[0].cast(DType::F64)?.square()?.sum_all())(std::slice::from_ref(&x32))
            .unwrap();
    assert_eq!(g[0].dtype(), DType::F32);
    assert_eq!(v(&g[0]), xv.iter().map(|x| 2.0 * x).collect::<Vec<_>>());
    // JVP of a cast: the tangent is cast too.
    let (y, ty) = jvp(
        |a: &[Tensor]| Ok(vec![a[0].cast(DType::F32)?]),
        std::slice::from_ref(&x),
        std::slice::from_ref(&w),
    )
    .unwrap();
    assert_eq!(y[0].dtype(), DType::F32);
    assert_eq!(ty[0].dtype(), DType::F32);
    assert_eq!(v(&ty[0]), v(&w));
}

#[test]
fn stop_gradient_op() {
    let mut rng = Lcg::new(21);
    let x = rng.normal(&[2, 3]);
    let xv = v(&x);
    let y = x.stop_gradient().unwrap();
    assert_tensor("stop_gradient forward", &y, &[2, 3], &xv);
    // d/dx [x * sg(x)] = sg(x) = x (hand formula; FD would see 2x).
    let f = |a: &[Tensor]| Ok(vec![a[0].mul(&a[0].stop_gradient()?)?]);
    let tan = rng.normal(&[2, 3]);
    let (_, ty) = jvp(f, std::slice::from_ref(&x), std::slice::from_ref(&tan)).unwrap();
    let want: Vec<f64> = xv.iter().zip(v(&tan)).map(|(x, t)| x * t).collect();
    assert_allclose("stop_gradient jvp", &v(&ty[0]), &want, 1e-14, 1e-15);
    let g =
        grad(|a: &[Tensor]| a[0].mul(&a[0].stop_gradient()?)?.sum_all())(std::slice::from_ref(&x))
            .unwrap();
    assert_allclose("stop_gradient grad", &v(&g[0]), &xv, 1e-14, 1e-15);
    let g = grad(|a: &[Tensor]| a[0].stop_gradient()?.sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_tensor("grad through stop_gradient only", &g[0], &[2, 3], &[0.0; 6]);
    let (_, ty) = jvp(
        |a: &[Tensor]| Ok(vec![a[0].stop_gradient()?]),
        std::slice::from_ref(&x),
        std::slice::from_ref(&tan),
    )
    .unwrap();
    assert_tensor("stop_gradient tangent", &ty[0], &[2, 3], &[0.0; 6]);
    for ax in 0..3 {
        check_vmap_from_examples(
            "stop_gradient",
            &*f1(Tensor::stop_gradient),
            std::slice::from_ref(&x),
            &[Gen::Normal],
            &[Some(ax)],
            &mut rng,
        );
    }
}

/// Comparisons produce bool tensors with numpy broadcasting.
#[test]
fn comparisons_forward_and_vmap() {
    let mut rng = Lcg::new(22);
    let a = rng.lattice(&[2, 3], 0.0);
    let b = rng.lattice(&[3], 0.5);
    type Cmp = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let ops: [(&str, Cmp, CmpRef); 6] = [
        ("gt", Tensor::gt, |x, y| x > y),
        ("ge", Tensor::ge, |x, y| x >= y),
        ("lt", Tensor::lt, |x, y| x < y),
        ("le", Tensor::le, |x, y| x <= y),
        ("eq", Tensor::eq_elem, |x, y| x == y),
        ("ne", Tensor::ne_elem, |x, y| x != y),
    ];
    for (name, op, r) in ops {
        let y = op(&a, &b).unwrap();
        assert_eq!(y.dtype(), DType::Bool, "{name}");
        let want = ref_binary(&a, &b, &[2, 3], |x, y| if r(x, y) { 1.0 } else { 0.0 });
        assert_tensor(name, &y, &[2, 3], &want);
        let f = f2(op);
        check_vmap_from_examples(
            name,
            &*f,
            &[a.clone(), b.clone()],
            &[Gen::Lattice(0.0), Gen::Lattice(0.5)],
            &[Some(1), None],
            &mut rng,
        );
    }
    let y = a.eq_elem(&a).unwrap();
    assert_eq!(v(&y), vec![1.0; 6]);
}

/// A composite of many ops at once, through jvp, vjp and vmap.
#[test]
fn composite_expression() {
    let mut rng = Lcg::new(23);
    let f: Fv = Box::new(|a: &[Tensor]| {
        let (x, w, b) = (&a[0], &a[1], &a[2]);
        let h = x.matmul(w)?.add(b)?.tanh()?;
        let s = h.sigmoid()?.mul(&h.exp()?)?.sum(&[1])?;
        Ok(vec![s, h.square()?.mean_all()?])
    });
    let args = [rng.normal(&[3, 4]), rng.normal(&[4, 2]), rng.normal(&[2])];
    check_grads("composite", &*f, &args, &mut rng);
    check_vmap_from_examples(
        "composite",
        &*f,
        &args,
        &[Gen::Normal; 3],
        &[Some(0), None, Some(0)],
        &mut rng,
    );
    check_vmap_from_examples(
        "composite",
        &*f,
        &args,
        &[Gen::Normal; 3],
        &[Some(2), Some(1), None],
        &mut rng,
    );
}

/// Scalar ops at parameter values where a careless derivative formula
/// divides by zero.
#[test]
fn scalar_op_derivatives_at_degenerate_parameters() {
    let x = t(vec![0.0, 0.5, -2.0], &[3]);
    // 0 / x == 0 for x != 0: derivative 0 (not NaN).
    let xn = t(vec![0.25, 0.5, -2.0], &[3]);
    let g =
        grad(|a: &[Tensor]| a[0].rdiv_scalar(0.0)?.sum_all())(std::slice::from_ref(&xn)).unwrap();
    assert_tensor("d(0/x)", &g[0], &[3], &[0.0, 0.0, 0.0]);
    // x^0 == 1 everywhere: derivative 0, also at x = 0.
    let g = grad(|a: &[Tensor]| a[0].pow_scalar(0.0)?.sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_tensor("d(x^0)", &g[0], &[3], &[0.0, 0.0, 0.0]);
    // x^1 at 0: derivative 1.
    let g = grad(|a: &[Tensor]| a[0].pow_scalar(1.0)?.sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_tensor("d(x^1)", &g[0], &[3], &[1.0, 1.0, 1.0]);
    // x^2 at 0: derivative 0 (by hand: 2x).
    let g = grad(|a: &[Tensor]| a[0].pow_scalar(2.0)?.sum_all())(std::slice::from_ref(&x)).unwrap();
    assert_tensor("d(x^2)", &g[0], &[3], &[0.0, 1.0, -4.0]);
}

#[test]
fn maximum_and_minimum_split_the_gradient_at_ties() {
    let a = Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3]).unwrap();
    let b = Tensor::from_vec(vec![1.0, 5.0, 0.0], &[3]).unwrap();
    let g =
        braintrace::grad(|x: &[Tensor]| x[0].maximum(&x[1])?.sum_all())(&[a.clone(), b.clone()])
            .unwrap();
    assert_eq!(g[0].to_vec_f64().unwrap(), vec![0.5, 0.0, 1.0]);
    assert_eq!(g[1].to_vec_f64().unwrap(), vec![0.5, 1.0, 0.0]);
    let g = braintrace::grad(|x: &[Tensor]| x[0].minimum(&x[1])?.sum_all())(&[a, b]).unwrap();
    assert_eq!(g[0].to_vec_f64().unwrap(), vec![0.5, 1.0, 0.0]);
    assert_eq!(g[1].to_vec_f64().unwrap(), vec![0.5, 0.0, 1.0]);
}

#[test]
fn transposed_data_reads_back_in_row_major_order() {
    let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let t = x.transpose(&[1, 0]).unwrap();
    assert_eq!(t.to_vec_f64().unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let a = t.to_array_f64().unwrap();
    assert!(a.is_standard_layout());
    assert_eq!(a.as_slice().unwrap(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert!(t.to_array_f32().unwrap().is_standard_layout());
}
