//! Shared helpers of the core acceptance tests: a small deterministic LCG
//! for random data, central finite differences, explicit-loop vmap
//! references working on raw ndarray data, and closeness assertions.
//!
//! Nothing here computes an expected value with the code under test: finite
//! differences only *evaluate* the function being differentiated, and the
//! vmap reference slices and stacks with ndarray directly.

#![allow(dead_code)]

mod fixtures;
#[allow(unused_imports)]
pub use fixtures::*;

use braintrace::{jvp, vjp, vmap, ArrayData, DType, Result, Tensor};
use ndarray::{ArrayD, Axis};

// ------------------------------------------------------------------ random data

/// A 64-bit linear congruential generator (Knuth's MMIX constants).
pub struct Lcg(u64);

impl Lcg {
    /// A generator with a seed.
    pub fn new(seed: u64) -> Self {
        let mut g = Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1));
        g.next_u64();
        g
    }
    /// 31 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.next_u64() as f64 / (1u64 << 31) as f64
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// `n` values uniform in [-1, 1).
    pub fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.range(-1.0, 1.0)).collect()
    }
    /// An f64 tensor uniform in [-1, 1).
    pub fn normal(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        let v = self.vec(n);
        t(v, shape)
    }
    /// An f64 tensor uniform in [lo, hi).
    pub fn uniform(&mut self, shape: &[usize], lo: f64, hi: f64) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|_| self.range(lo, hi)).collect();
        t(v, shape)
    }
    /// Positive values in [0.5, 1.5): safe for log, sqrt, pow, reciprocal.
    pub fn positive(&mut self, shape: &[usize]) -> Tensor {
        self.uniform(shape, 0.5, 1.5)
    }
    /// Values with 0.2 <= |x| < 1.2, random sign: away from the kinks of
    /// abs, relu, max at 0.
    pub fn away_from_zero(&mut self, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|_| {
                let m = self.range(0.2, 1.2);
                if self.below(2) == 0 {
                    m
                } else {
                    -m
                }
            })
            .collect();
        t(v, shape)
    }
    /// See [`Gen::Lattice`].
    pub fn lattice(&mut self, shape: &[usize], offset: f64) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|_| (self.below(5) as f64 - 2.0) + offset + self.range(-0.2, 0.2))
            .collect();
        t(v, shape)
    }
    /// i64 indices in [0, bound).
    pub fn indices(&mut self, shape: &[usize], bound: usize) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<i64> = (0..n).map(|_| self.below(bound) as i64).collect();
        Tensor::from_vec_typed(v, shape).expect("index tensor")
    }
}

/// An f64 tensor from data (panics on a length mismatch: test input only).
pub fn t(data: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(data, shape).expect("test tensor")
}

/// The data of a tensor as f64.
pub fn v(x: &Tensor) -> Vec<f64> {
    x.to_vec_f64().expect("concrete tensor")
}

/// Euclidean dot product.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "dot of vectors of different lengths");
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f64]) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

// ------------------------------------------------------------------ closeness

/// Relative error `||got - want|| / ||want||` (absolute when `want` is ~0).
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(
        got.len(),
        want.len(),
        "length mismatch: got {} values, want {}",
        got.len(),
        want.len()
    );
    let d: Vec<f64> = got.iter().zip(want).map(|(a, b)| a - b).collect();
    let nw = norm(want);
    if got.iter().chain(want).any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    if nw < 1e-12 {
        norm(&d)
    } else {
        norm(&d) / nw
    }
}

/// Assert relative error at most `tol`.
#[track_caller]
pub fn assert_rel(what: &str, got: &[f64], want: &[f64], tol: f64) {
    let e = rel_err(got, want);
    assert!(
        e <= tol,
        "{what}: relative error {e:.3e} > {tol:.1e}\n  got  {got:?}\n  want {want:?}"
    );
}

/// Assert element-wise `|a - b| <= atol + rtol |b|`.
#[track_caller]
pub fn assert_allclose(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: length mismatch ({} vs {})",
        got.len(),
        want.len()
    );
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= atol + rtol * b.abs() && a.is_finite() == b.is_finite(),
            "{what}: element {i}: got {a}, want {b}\n  got  {got:?}\n  want {want:?}"
        );
    }
}

/// Assert a tensor's shape and values (element-wise, tight tolerance).
#[track_caller]
pub fn assert_tensor(what: &str, got: &Tensor, shape: &[usize], want: &[f64]) {
    assert_eq!(got.shape(), shape, "{what}: shape");
    assert_allclose(what, &v(got), want, 1e-12, 1e-12);
}

// ------------------------------------------------------------------ finite differences

/// Function type used by the checkers.
pub type F<'a> = &'a dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>;

fn flat_outputs(f: F, args: &[Tensor]) -> Vec<f64> {
    f(args)
        .expect("function evaluates")
        .iter()
        .filter(|o| o.dtype().is_float())
        .flat_map(v)
        .collect()
}

/// Which arguments are differentiated: the f64 ones.
fn diff_args(args: &[Tensor]) -> Vec<bool> {
    args.iter().map(|a| a.dtype() == DType::F64).collect()
}

/// Central finite-difference Jacobian: one column per element of each f64
/// argument (in argument order), rows = all float outputs flattened.
pub fn fd_jacobian(f: F, args: &[Tensor], h: f64) -> Vec<Vec<f64>> {
    let mut cols = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if a.dtype() != DType::F64 {
            continue;
        }
        let base = v(a);
        for k in 0..base.len() {
            let shifted = |delta: f64| {
                let mut d = base.clone();
                d[k] += delta;
                let mut ar = args.to_vec();
                ar[i] = t(d, a.shape());
                flat_outputs(f, &ar)
            };
            let p = shifted(h);
            let m = shifted(-h);
            cols.push(p.iter().zip(&m).map(|(p, m)| (p - m) / (2.0 * h)).collect());
        }
    }
    cols
}

/// `J v` from the FD columns.
fn jac_vec(cols: &[Vec<f64>], x: &[f64], m: usize) -> Vec<f64> {
    let mut out = vec![0.0; m];
    for (c, &xi) in cols.iter().zip(x) {
        for (o, ci) in out.iter_mut().zip(c) {
            *o += ci * xi;
        }
    }
    out
}

/// `Jᵀ u` from the FD columns.
fn jac_t_vec(cols: &[Vec<f64>], u: &[f64]) -> Vec<f64> {
    cols.iter().map(|c| dot(c, u)).collect()
}

/// Check `jvp` and `vjp` of `f` at `args` against central finite
/// differences (relative error <= 1e-6), with random tangents and
/// cotangents. Non-f64 arguments (indices, masks) are not differentiated
/// (they get zero tangents of their own dtype).
#[track_caller]
pub fn check_grads(name: &str, f: F, args: &[Tensor], rng: &mut Lcg) {
    check_grads_h(name, f, args, rng, 1e-5)
}

/// [`check_grads`] with an explicit finite-difference step.
#[track_caller]
pub fn check_grads_h(name: &str, f: F, args: &[Tensor], rng: &mut Lcg, h: f64) {
    let diff = diff_args(args);
    let y0 = f(args).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let m: usize = y0
        .iter()
        .filter(|o| o.dtype().is_float())
        .map(Tensor::size)
        .sum();
    let cols = fd_jacobian(f, args, h);
    assert!(
        !cols.is_empty() && m > 0,
        "{name}: nothing to differentiate"
    );
    for trial in 0..2 {
        // JVP with a random tangent.
        let tangents: Vec<Tensor> = args
            .iter()
            .zip(&diff)
            .map(|(a, &d)| {
                if d {
                    rng.normal(a.shape())
                } else {
                    a.zeros_like()
                }
            })
            .collect();
        let (outs, touts) =
            jvp(f, args, &tangents).unwrap_or_else(|e| panic!("{name}: jvp failed: {e}"));
        assert_eq!(outs.len(), y0.len(), "{name}: jvp primal output count");
        for (o, y) in outs.iter().zip(&y0) {
            assert_eq!(o.shape(), y.shape(), "{name}: jvp primal shape");
            assert_allclose(&format!("{name}: jvp primal"), &v(o), &v(y), 1e-12, 1e-12);
        }
        for (o, tt) in outs.iter().zip(&touts) {
            assert_eq!(
                o.aval(),
                tt.aval(),
                "{name}: tangent aval equals output aval"
            );
        }
        let flat_t: Vec<f64> = tangents
            .iter()
            .zip(&diff)
            .filter(|(_, &d)| d)
            .flat_map(|(t, _)| v(t))
            .collect();
        let want = jac_vec(&cols, &flat_t, m);
        let got: Vec<f64> = outs
            .iter()
            .zip(&touts)
            .filter(|(o, _)| o.dtype().is_float())
            .flat_map(|(_, t)| v(t))
            .collect();
        assert_rel(&format!("{name}: jvp #{trial} vs FD"), &got, &want, 1e-6);

        // VJP with a random cotangent.
        let (outs, pb) = vjp(f, args).unwrap_or_else(|e| panic!("{name}: vjp failed: {e}"));
        for (o, y) in outs.iter().zip(&y0) {
            assert_allclose(&format!("{name}: vjp primal"), &v(o), &v(y), 1e-12, 1e-12);
        }
        let cts: Vec<Tensor> = outs.iter().map(|o| rng.normal(o.shape())).collect();
        let flat_u: Vec<f64> = cts.iter().flat_map(v).collect();
        let g = pb
            .apply(&cts)
            .unwrap_or_else(|e| panic!("{name}: pullback failed: {e}"));
        assert_eq!(g.len(), args.len(), "{name}: one cotangent per argument");
        for (gi, a) in g.iter().zip(args) {
            assert_eq!(
                gi.aval(),
                a.aval(),
                "{name}: cotangent aval equals argument aval"
            );
        }
        let got: Vec<f64> = g
            .iter()
            .zip(&diff)
            .filter(|(_, &d)| d)
            .flat_map(|(g, _)| v(g))
            .collect();
        let want = jac_t_vec(&cols, &flat_u);
        assert_rel(&format!("{name}: vjp #{trial} vs FD"), &got, &want, 1e-6);
    }
}

// ------------------------------------------------------------------ explicit-loop vmap

/// Element `i` of `x` along `axis`, sliced with ndarray (not the library).
pub fn nd_index(x: &Tensor, axis: usize, i: usize) -> Tensor {
    fn idx<T: Clone>(a: &ArrayD<T>, axis: usize, i: usize) -> ArrayD<T> {
        a.index_axis(Axis(axis), i).to_owned()
    }
    let d = match x.data().expect("concrete") {
        ArrayData::F32(a) => ArrayData::F32(idx(a, axis, i)),
        ArrayData::F64(a) => ArrayData::F64(idx(a, axis, i)),
        ArrayData::I64(a) => ArrayData::I64(idx(a, axis, i)),
        ArrayData::Bool(a) => ArrayData::Bool(idx(a, axis, i)),
    };
    Tensor::from_data(d)
}

/// Stack f64 values of equal-shaped tensors along a new `axis` with ndarray.
pub fn nd_stack(xs: &[Tensor], axis: usize) -> (Vec<usize>, Vec<f64>) {
    let arrs: Vec<ArrayD<f64>> = xs
        .iter()
        .map(|x| x.to_array_f64().expect("concrete"))
        .collect();
    let views: Vec<_> = arrs.iter().map(|a| a.view()).collect();
    let s = ndarray::stack(Axis(axis), &views).expect("equal shapes");
    let s = s.as_standard_layout().into_owned();
    (s.shape().to_vec(), s.iter().copied().collect())
}

/// Random tensor like `x` with an extra axis of size `n` inserted at `axis`
/// (for building mapped arguments).
pub fn batched_like(rng: &mut Lcg, x: &Tensor, axis: usize, n: usize, gen: Gen) -> Tensor {
    let mut sh = x.shape().to_vec();
    sh.insert(axis, n);
    gen.make(rng, &sh, x)
}

/// How to draw random data for a batched argument.
#[derive(Clone, Copy, Debug)]
pub enum Gen {
    /// Uniform in [-1, 1).
    Normal,
    /// In [0.5, 1.5).
    Positive,
    /// |x| in [0.2, 1.2).
    AwayFromZero,
    /// Indices below the bound.
    Index(usize),
    /// `k + offset + u`, k integer in [-2, 2], u in [-0.2, 0.2): two
    /// lattices with offsets 0 and 0.5 never come closer than 0.1 (keeps
    /// max/min away from ties).
    Lattice(f64),
}

impl Gen {
    /// Draw a tensor of `shape` (dtype like `like` for indices).
    pub fn make(self, rng: &mut Lcg, shape: &[usize], _like: &Tensor) -> Tensor {
        match self {
            Gen::Normal => rng.normal(shape),
            Gen::Positive => rng.positive(shape),
            Gen::AwayFromZero => rng.away_from_zero(shape),
            Gen::Index(b) => rng.indices(shape, b),
            Gen::Lattice(off) => rng.lattice(shape, off),
        }
    }
}

/// Check `vmap(f, in_axes)(args)` against an explicit loop over the mapped
/// axis that evaluates `f` on each example and stacks the results on axis 0.
#[track_caller]
pub fn check_vmap(name: &str, f: F, args: &[Tensor], in_axes: &[Option<usize>]) {
    let n = args
        .iter()
        .zip(in_axes)
        .find_map(|(a, ax)| ax.map(|ax| a.shape()[ax]))
        .expect("some argument is mapped");
    let got = vmap(f, in_axes.to_vec())(args)
        .unwrap_or_else(|e| panic!("{name}: vmap {in_axes:?} failed: {e}"));
    let mut per: Vec<Vec<Tensor>> = Vec::new();
    for i in 0..n {
        let ex: Vec<Tensor> = args
            .iter()
            .zip(in_axes)
            .map(|(a, ax)| match ax {
                Some(ax) => nd_index(a, *ax, i),
                None => a.clone(),
            })
            .collect();
        let outs = f(&ex).unwrap_or_else(|e| panic!("{name}: example {i} failed: {e}"));
        if per.is_empty() {
            per = vec![Vec::new(); outs.len()];
        }
        for (k, o) in outs.into_iter().enumerate() {
            per[k].push(o);
        }
    }
    assert_eq!(got.len(), per.len(), "{name}: vmap output count");
    for (k, (g, p)) in got.iter().zip(&per).enumerate() {
        let (shape, want) = nd_stack(p, 0);
        assert_eq!(
            g.shape(),
            shape.as_slice(),
            "{name}: vmap {in_axes:?} output {k} shape"
        );
        assert_eq!(g.dtype(), p[0].dtype(), "{name}: vmap output {k} dtype");
        assert_allclose(
            &format!("{name}: vmap {in_axes:?} output {k}"),
            &v(g),
            &want,
            1e-12,
            1e-12,
        );
    }
}

/// Build mapped arguments from per-example `examples` and `in_axes`, then run
/// [`check_vmap`]. `gens[i]` says how to draw the batched data of argument i.
#[track_caller]
pub fn check_vmap_from_examples(
    name: &str,
    f: F,
    examples: &[Tensor],
    gens: &[Gen],
    in_axes: &[Option<usize>],
    rng: &mut Lcg,
) {
    let n = 3;
    let args: Vec<Tensor> = examples
        .iter()
        .zip(gens)
        .zip(in_axes)
        .map(|((x, &g), ax)| match ax {
            Some(ax) => batched_like(rng, x, *ax, n, g),
            None => x.clone(),
        })
        .collect();
    check_vmap(name, f, &args, in_axes);
}

// ------------------------------------------------------------------ references

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Multi-index of a flat row-major position.
pub fn unravel(mut k: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for i in (0..shape.len()).rev() {
        idx[i] = k % shape[i];
        k /= shape[i];
    }
    idx
}

/// Value of `x` (row-major data of `shape`) at the numpy-broadcast position
/// `out_idx` of an output of rank `out_idx.len()`.
pub fn bcast_at(x: &[f64], shape: &[usize], out_idx: &[usize]) -> f64 {
    let off = out_idx.len() - shape.len();
    let st = strides(shape);
    let mut k = 0;
    for i in 0..shape.len() {
        let j = if shape[i] == 1 { 0 } else { out_idx[off + i] };
        k += j * st[i];
    }
    x[k]
}

/// Reference binary op with numpy broadcasting, by explicit loops.
pub fn ref_binary(
    a: &Tensor,
    b: &Tensor,
    out_shape: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let (av, bv) = (v(a), v(b));
    let n: usize = out_shape.iter().product();
    (0..n)
        .map(|k| {
            let idx = unravel(k, out_shape);
            f(
                bcast_at(&av, a.shape(), &idx),
                bcast_at(&bv, b.shape(), &idx),
            )
        })
        .collect()
}
