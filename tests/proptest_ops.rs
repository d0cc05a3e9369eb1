//! No panics, by property test: random calls of the public core ops with
//! random valid and invalid shapes, axes, dtypes, permutations, slices,
//! paddings, conv geometries and arities, run eagerly, traced, under `jit`,
//! `vmap` and `grad`. Every call must return (never panic); every error must
//! name its op; every valid call must agree with a reference computed here by
//! explicit loops in f64 (and traced/jitted/vmapped calls with the eager one).
//!
//! The seed is fixed so a failure reproduces (`BRAINTRACE_PROPTEST_SEED`
//! picks another); the case counts add up to 24,000 per `cargo test`.

use braintrace::ops::index::scatter_add;
use braintrace::ops::shape::broadcast_in_dim;
use braintrace::ops::{conv_general, ConvPadding, ConvParams};
use braintrace::prelude::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A fixed seed (so a failure reproduces), which `BRAINTRACE_PROPTEST_SEED`
/// overrides to explore further.
fn config(cases: u32) -> Config {
    let seed = std::env::var("BRAINTRACE_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_b7ac);
    Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    }
}

// ------------------------------------------------------------------ inputs

/// A dimension: mostly small (0..4), sometimes hostile (so large that a
/// product with anything else overflows, or that no array can have it).
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        12 => 0usize..4,
        1 => Just(usize::MAX),
        1 => Just((1usize << 63) + 1),
        1 => Just((1usize << 62) + 1),
    ]
}

fn small_shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4, 0..=max_rank)
}

fn any_shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..=max_rank)
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![
        4 => Just(DType::F64),
        1 => Just(DType::F32),
        1 => Just(DType::I64),
        1 => Just(DType::Bool),
    ]
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A concrete tensor of a small shape: deterministic values from `seed`.
fn tensor(shape: &[usize], dt: DType, seed: u64) -> Tensor {
    let n = numel(shape);
    let vals: Vec<f64> = (0..n)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
            ((h >> 11) % 2001) as f64 / 1000.0 - 1.0
        })
        .collect();
    let t = Tensor::from_vec(vals, shape).unwrap();
    if dt == DType::Bool {
        t.gt(&Tensor::scalar(0.0)).unwrap()
    } else {
        t.cast(dt).unwrap()
    }
}

// ------------------------------------------------------------------ references

/// Row-major multi-indices of `shape`.
fn multi_indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    if shape.contains(&0) {
        return out;
    }
    let mut ix = vec![0; shape.len()];
    loop {
        out.push(ix.clone());
        let mut k = shape.len();
        loop {
            if k == 0 {
                return out;
            }
            k -= 1;
            ix[k] += 1;
            if ix[k] < shape[k] {
                break;
            }
            ix[k] = 0;
        }
    }
}

fn offset(shape: &[usize], ix: &[usize]) -> usize {
    ix.iter().zip(shape).fold(0, |o, (&i, &d)| o * d + i)
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + y.abs())
        })
}

/// numpy broadcast of two shapes, computed here.
fn broadcast2(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            match (da, db) {
                (x, y) if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// The element of `src` (shape `s`) that broadcasts to `ix` of rank `r`.
fn bcast_at(src: &[f64], s: &[usize], ix: &[usize]) -> f64 {
    let off = ix.len() - s.len();
    let j: Vec<usize> = s
        .iter()
        .enumerate()
        .map(|(k, &d)| if d == 1 { 0 } else { ix[off + k] })
        .collect();
    src[offset(s, &j)]
}

// ------------------------------------------------------------------ checks

/// Run `f`; a panic fails the property. Returns the result.
fn no_panic<T>(
    what: &str,
    f: impl FnOnce() -> Result<T>,
) -> std::result::Result<Result<T>, TestCaseError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| TestCaseError::fail(format!("{what}: panicked")))
}

/// An error must name an op, and its message must contain that name.
fn names_its_op(what: &str, e: &Error) -> std::result::Result<(), TestCaseError> {
    let op = e.op();
    prop_assert!(!op.is_empty(), "{what}: error names no op: {e:?}");
    let msg = e.to_string();
    prop_assert!(
        msg.contains(op),
        "{what}: message `{msg}` does not name `{op}`"
    );
    Ok(())
}

/// Call `f` eagerly, traced (eval_shape) and under jit on `args`: none may
/// panic; errors name their op; when eager succeeds, traced gives its avals
/// and jit its values. Returns the eager outputs.
fn run_all_modes(
    what: &str,
    args: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Clone + 'static,
) -> std::result::Result<Option<Vec<Tensor>>, TestCaseError> {
    let eager = no_panic(what, || f(args))?;
    let avals: Vec<Aval> = args.iter().map(Tensor::aval).collect();
    let traced = no_panic(what, || eval_shape(f.clone(), &avals))?;
    let jitted = no_panic(what, || jit(f.clone())(args))?;
    for r in [
        eager.as_ref().err(),
        traced.as_ref().err(),
        jitted.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    {
        names_its_op(what, r)?;
    }
    match (&eager, &traced, &jitted) {
        (Ok(y), Ok(a), Ok(j)) => {
            let ya: Vec<Aval> = y.iter().map(Tensor::aval).collect();
            prop_assert_eq!(&ya, a, "{}: traced avals differ from eager", what);
            for (p, q) in y.iter().zip(j) {
                prop_assert_eq!(p.aval(), q.aval(), "{}: jit aval", what);
                prop_assert!(
                    close(&vals(p), &vals(q), 1e-12),
                    "{}: jit values differ",
                    what
                );
            }
            Ok(Some(y.clone()))
        }
        (Err(_), Err(_), Err(_)) => Ok(None),
        // Errors that depend on values (an index) or on memory (an
        // allocation) cannot be seen by tracing, which has neither.
        (Err(Error::Index { .. } | Error::Allocation { .. }), Ok(_), Err(_)) => Ok(None),
        // Shape-level checks must agree between eager and traced calls.
        _ => Err(TestCaseError::fail(format!(
            "{what}: eager {:?}, traced {:?}, jit {:?} disagree on success",
            eager.as_ref().map(|_| ()),
            traced.as_ref().map(|_| ()),
            jitted.as_ref().map(|_| ())
        ))),
    }
}

// ------------------------------------------------------------------ elementwise and reductions

const BINARY: [&str; 6] = ["add", "sub", "mul", "div", "maximum", "minimum"];

fn binary(name: &str, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match name {
        "add" => a.add(b),
        "sub" => a.sub(b),
        "mul" => a.mul(b),
        "div" => a.div(b),
        "maximum" => a.maximum(b),
        _ => a.minimum(b),
    }
}

fn binary_ref(name: &str, x: f64, y: f64) -> f64 {
    match name {
        "add" => x + y,
        "sub" => x - y,
        "mul" => x * y,
        "div" => x / y,
        "maximum" => x.max(y),
        _ => x.min(y),
    }
}

proptest! {
    #![proptest_config(config(2500))]

    /// Broadcasting binary ops: agree with an explicit loop; shapes that do
    /// not broadcast, or dtypes that differ, are errors naming the op.
    #[test]
    fn binary_ops_broadcast_like_numpy(
        op in 0..BINARY.len(),
        sa in small_shape(3),
        sb in small_shape(3),
        da in dtype(),
        same_dtype in prop::bool::weighted(0.85),
        db in dtype(),
        seed in any::<u64>(),
    ) {
        let name = BINARY[op];
        let db = if same_dtype { da } else { db };
        let (a, b) = (tensor(&sa, da, seed), tensor(&sb, db, !seed));
        let out = run_all_modes(name, &[a.clone(), b.clone()], move |t: &[Tensor]| {
            Ok(vec![binary(name, &t[0], &t[1])?])
        })?;
        let want_shape = broadcast2(&sa, &sb);
        let valid = want_shape.is_some() && da == db && da.is_float();
        prop_assert_eq!(out.is_some(), valid, "{} {:?} {:?} {:?} {:?}", name, sa, da, sb, db);
        if let (Some(y), Some(shape)) = (out, want_shape) {
            let (av, bv) = (vals(&a), vals(&b));
            let want: Vec<f64> = multi_indices(&shape)
                .iter()
                .map(|ix| binary_ref(name, bcast_at(&av, &sa, ix), bcast_at(&bv, &sb, ix)))
                .collect();
            prop_assert_eq!(y[0].shape(), &shape[..]);
            let tol = if da == DType::F32 { 1e-6 } else { 1e-14 };
            prop_assert!(close(&vals(&y[0]), &want, tol), "{}: {:?} vs {:?}", name, vals(&y[0]), want);
        }
    }

    /// sum and mean over random (possibly repeated or out-of-range) axes.
    #[test]
    fn sum_and_mean_over_axes(
        shape in small_shape(3),
        axes in prop::collection::vec(0usize..5, 0..4),
        mean in any::<bool>(),
        dt in dtype(),
        seed in any::<u64>(),
    ) {
        let x = tensor(&shape, dt, seed);
        let ax = axes.clone();
        let what = if mean { "mean" } else { "sum" };
        let out = run_all_modes(what, std::slice::from_ref(&x), move |t: &[Tensor]| {
            Ok(vec![if mean { t[0].mean(&ax)? } else { t[0].sum(&ax)? }])
        })?;
        let mut sorted = axes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let valid = sorted.iter().all(|&a| a < shape.len()) && (dt.is_float() || sorted.is_empty() && !mean);
        if !valid {
            prop_assert!(out.is_none() || !dt.is_float() && sorted.is_empty(), "{} {:?} {:?} should fail", what, shape, axes);
            return Ok(());
        }
        let Some(y) = out else {
            return Err(TestCaseError::fail(format!("{what} {shape:?} over {axes:?} failed")));
        };
        let kept: Vec<usize> = (0..shape.len()).filter(|i| !sorted.contains(i)).collect();
        let out_shape: Vec<usize> = kept.iter().map(|&i| shape[i]).collect();
        let xv = vals(&x);
        let mut acc = vec![0.0; numel(&out_shape)];
        for ix in multi_indices(&shape) {
            let o: Vec<usize> = kept.iter().map(|&i| ix[i]).collect();
            acc[offset(&out_shape, &o)] += xv[offset(&shape, &ix)];
        }
        if mean {
            let n: usize = sorted.iter().map(|&a| shape[a]).product();
            acc.iter_mut().for_each(|v| *v /= n as f64);
        }
        prop_assert_eq!(y[0].shape(), &out_shape[..]);
        let tol = if dt == DType::F32 { 1e-6 } else { 1e-13 };
        prop_assert!(close(&vals(&y[0]), &acc, tol), "{:?} vs {:?}", vals(&y[0]), acc);
    }
}

// ------------------------------------------------------------------ structural ops

proptest! {
    #![proptest_config(config(2500))]

    /// reshape, broadcast_to, broadcast_in_dim, transpose, squeeze and
    /// expand_dims with hostile target shapes, permutations and axes.
    #[test]
    fn structural_ops_never_panic_and_keep_the_data(
        shape in small_shape(3),
        target in any_shape(3),
        perm in prop::collection::vec(0usize..4, 0..4),
        dims in prop::collection::vec(0usize..4, 0..4),
        axis in 0usize..4,
        which in 0usize..6,
        dt in dtype(),
        seed in any::<u64>(),
    ) {
        let x = tensor(&shape, dt, seed);
        let xv = vals(&x);
        let (t2, p2, d2) = (target.clone(), perm.clone(), dims.clone());
        let name = ["reshape", "broadcast_to", "broadcast_in_dim", "transpose", "squeeze", "expand_dims"][which];
        let out = run_all_modes(name, std::slice::from_ref(&x), move |t: &[Tensor]| {
            Ok(vec![match which {
                0 => t[0].reshape(&t2)?,
                1 => t[0].broadcast_to(&t2)?,
                2 => broadcast_in_dim(&t[0], &t2, &d2)?,
                3 => t[0].transpose(&p2)?,
                4 => t[0].squeeze(&[axis])?,
                _ => t[0].expand_dims(axis)?,
            }])
        })?;
        let Some(y) = out else { return Ok(()) };
        let y = &y[0];
        let yv = vals(y);
        match which {
            0 => {
                prop_assert_eq!(y.shape(), &target[..]);
                prop_assert_eq!(yv, xv);
            }
            1 => {
                prop_assert_eq!(y.shape(), &target[..]);
                let b = broadcast2(&shape, &target);
                prop_assert_eq!(b.as_deref(), Some(&target[..]));
                let want: Vec<f64> = multi_indices(&target).iter().map(|ix| bcast_at(&xv, &shape, ix)).collect();
                prop_assert_eq!(yv, want);
            }
            2 => {
                prop_assert_eq!(dims.len(), shape.len(), "dims {:?} for shape {:?}", dims, shape);
                prop_assert!(dims.windows(2).all(|w| w[0] < w[1]));
                let want: Vec<f64> = multi_indices(&target)
                    .iter()
                    .map(|ix| {
                        let j: Vec<usize> = dims.iter().enumerate().map(|(k, &d)| if shape[k] == 1 { 0 } else { ix[d] }).collect();
                        xv[offset(&shape, &j)]
                    })
                    .collect();
                prop_assert_eq!(y.shape(), &target[..]);
                prop_assert_eq!(yv, want);
            }
            3 => {
                let mut seen = perm.clone();
                seen.sort_unstable();
                prop_assert_eq!(seen, (0..shape.len()).collect::<Vec<_>>());
                let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
                let want: Vec<f64> = multi_indices(&out_shape)
                    .iter()
                    .map(|ix| {
                        let mut src = vec![0; shape.len()];
                        for (i, &p) in perm.iter().enumerate() {
                            src[p] = ix[i];
                        }
                        xv[offset(&shape, &src)]
                    })
                    .collect();
                prop_assert_eq!(y.shape(), &out_shape[..]);
                prop_assert_eq!(yv, want);
            }
            4 => {
                prop_assert!(axis < shape.len() && shape[axis] == 1);
                prop_assert_eq!(yv, xv);
            }
            _ => {
                prop_assert!(axis <= shape.len());
                prop_assert_eq!(y.ndim(), shape.len() + 1);
                prop_assert_eq!(yv, xv);
            }
        }
    }

    /// slice, pad, concatenate/stack and take/scatter_add with random
    /// (often invalid) bounds, paddings, axes, indices and arities.
    #[test]
    fn slicing_padding_and_indexing(
        shape in small_shape(3),
        starts in prop::collection::vec(0usize..5, 0..4),
        limits in prop::collection::vec(0usize..5, 0..4),
        lo in prop::collection::vec(dim(), 0..4),
        hi in prop::collection::vec(0usize..3, 0..4),
        n_parts in 0usize..4,
        axis in 0usize..4,
        idx in prop::collection::vec(-2i64..5, 0..4),
        which in 0usize..6,
        dt in dtype(),
        seed in any::<u64>(),
    ) {
        let x = tensor(&shape, dt, seed);
        let xv = vals(&x);
        let name = ["slice", "pad", "concatenate", "stack", "take", "scatter_add"][which];
        let idx_t = Tensor::from_vec_typed(idx.clone(), &[idx.len()]).unwrap();
        let mut args = vec![x.clone()];
        if which >= 4 {
            args.push(idx_t);
        }
        let (s2, l2, lo2, hi2, sh2) = (starts.clone(), limits.clone(), lo.clone(), hi.clone(), shape.clone());
        let out = run_all_modes(name, &args, move |t: &[Tensor]| {
            Ok(vec![match which {
                0 => t[0].slice(&s2, &l2)?,
                1 => t[0].pad(&lo2, &hi2)?,
                2 => concat(&vec![t[0].clone(); n_parts], axis)?,
                3 => stack(&vec![t[0].clone(); n_parts], axis)?,
                4 => t[0].take(&t[1], axis)?,
                _ => {
                    // Scatter x (as updates) back into a tensor of `sh2` with axis
                    // `axis` replaced: valid when x's shape has the indices' length there.
                    let mut res = sh2.clone();
                    if axis < res.len() {
                        res[axis] = 3;
                    }
                    scatter_add(&t[1], &t[0], axis, &res)?
                }
            }])
        })?;
        let Some(y) = out else { return Ok(()) };
        let (y, yv) = (&y[0], vals(&y[0]));
        match which {
            0 => {
                let out_shape: Vec<usize> = starts.iter().zip(&limits).map(|(s, l)| l - s).collect();
                let want: Vec<f64> = multi_indices(&out_shape)
                    .iter()
                    .map(|ix| {
                        let src: Vec<usize> = ix.iter().zip(&starts).map(|(i, s)| i + s).collect();
                        xv[offset(&shape, &src)]
                    })
                    .collect();
                prop_assert_eq!(y.shape(), &out_shape[..]);
                prop_assert_eq!(yv, want);
            }
            1 => {
                let out_shape: Vec<usize> = (0..shape.len()).map(|i| shape[i] + lo[i] + hi[i]).collect();
                let want: Vec<f64> = multi_indices(&out_shape)
                    .iter()
                    .map(|ix| {
                        let inside = (0..shape.len()).all(|i| ix[i] >= lo[i] && ix[i] < lo[i] + shape[i]);
                        if inside {
                            let src: Vec<usize> = (0..shape.len()).map(|i| ix[i] - lo[i]).collect();
                            xv[offset(&shape, &src)]
                        } else {
                            0.0
                        }
                    })
                    .collect();
                prop_assert_eq!(y.shape(), &out_shape[..]);
                prop_assert_eq!(y.dtype(), dt);
                prop_assert_eq!(yv, want);
            }
            2 | 3 => {
                prop_assert!(n_parts >= 1);
                let mut out_shape = shape.clone();
                if which == 2 {
                    out_shape[axis] *= n_parts;
                } else {
                    out_shape.insert(axis, n_parts);
                }
                let want: Vec<f64> = multi_indices(&out_shape)
                    .iter()
                    .map(|ix| {
                        let mut src = ix.clone();
                        if which == 2 {
                            src[axis] %= shape[axis];
                        } else {
                            src.remove(axis);
                        }
                        xv[offset(&shape, &src)]
                    })
                    .collect();
                prop_assert_eq!(y.shape(), &out_shape[..]);
                prop_assert_eq!(yv, want);
            }
            4 => {
                prop_assert!(idx.iter().all(|&i| i >= 0 && (i as usize) < shape[axis]));
                let mut out_shape = shape.clone();
                out_shape[axis] = idx.len();
                let want: Vec<f64> = multi_indices(&out_shape)
                    .iter()
                    .map(|ix| {
                        let mut src = ix.clone();
                        src[axis] = idx[ix[axis]] as usize;
                        xv[offset(&shape, &src)]
                    })
                    .collect();
                prop_assert_eq!(y.shape(), &out_shape[..]);
                prop_assert_eq!(yv, want);
            }
            _ => {
                prop_assert!(dt.is_float());
                let mut res = shape.clone();
                res[axis] = 3;
                let mut want = vec![0.0; numel(&res)];
                for ix in multi_indices(&shape) {
                    let mut dst = ix.clone();
                    dst[axis] = idx[ix[axis]] as usize;
                    want[offset(&res, &dst)] += xv[offset(&shape, &ix)];
                }
                prop_assert_eq!(y.shape(), &res[..]);
                let tol = if dt == DType::F32 { 1e-6 } else { 1e-13 };
                prop_assert!(close(&yv, &want, tol), "{:?} vs {:?}", yv, want);
            }
        }
    }
}

// ------------------------------------------------------------------ matmul and conv

proptest! {
    #![proptest_config(config(1500))]

    /// matmul with random ranks and sizes: 2-D results agree with a triple loop.
    #[test]
    fn matmul_agrees_with_a_loop(
        sa in small_shape(3),
        sb in small_shape(3),
        dt in prop_oneof![Just(DType::F64), Just(DType::F32), Just(DType::I64)],
        seed in any::<u64>(),
    ) {
        let (a, b) = (tensor(&sa, dt, seed), tensor(&sb, dt, !seed));
        let out = run_all_modes("matmul", &[a.clone(), b.clone()], |t: &[Tensor]| {
            Ok(vec![t[0].matmul(&t[1])?])
        })?;
        if sa.len() == 2 && sb.len() == 2 {
            let valid = sa[1] == sb[0] && dt.is_float();
            prop_assert_eq!(out.is_some(), valid, "{:?} @ {:?} {:?}", sa, sb, dt);
            if let Some(y) = out {
                let (av, bv) = (vals(&a), vals(&b));
                let mut want = vec![0.0; sa[0] * sb[1]];
                for i in 0..sa[0] {
                    for j in 0..sb[1] {
                        for k in 0..sa[1] {
                            want[i * sb[1] + j] += av[i * sa[1] + k] * bv[k * sb[1] + j];
                        }
                    }
                }
                let tol = if dt == DType::F32 { 1e-5 } else { 1e-13 };
                prop_assert!(close(&vals(&y[0]), &want, tol));
            }
        }
    }

    /// conv with random (often invalid) ranks, channels, groups, strides,
    /// dilations and paddings: 1-D results agree with an explicit loop.
    #[test]
    fn conv_geometries(
        n in 0usize..3, c in 0usize..4, o in 0usize..4, w in 0usize..6, kw in 0usize..4,
        rank in 2usize..5,
        groups in 0usize..3,
        stride in 0usize..3,
        lhs_dil in 0usize..3,
        rhs_dil in prop_oneof![4 => 0usize..3, 1 => Just(usize::MAX), 1 => Just(1usize << 62)],
        pad in prop_oneof![
            Just(ConvPadding::Valid),
            Just(ConvPadding::Same),
            (-3i64..4, -3i64..4).prop_map(|(l, h)| ConvPadding::Explicit(vec![(l, h)])),
            Just(ConvPadding::Explicit(vec![(i64::MAX, 1)])),
            Just(ConvPadding::Explicit(vec![(0, 0), (0, 0)])),
        ],
        seed in any::<u64>(),
    ) {
        let cg = if groups == 0 { c } else { c / groups.max(1) };
        let mut xs = vec![n, c, w];
        let mut ks = vec![o, cg, kw];
        while xs.len() < rank {
            xs.push(2);
            ks.push(1);
        }
        xs.truncate(rank);
        ks.truncate(rank);
        let d = rank.saturating_sub(2);
        let p = ConvParams {
            strides: vec![stride; d],
            padding: pad.clone(),
            lhs_dilation: vec![lhs_dil; d],
            rhs_dilation: vec![rhs_dil; d],
            dimension_numbers: None,
            feature_group_count: groups,
        };
        let (x, k) = (tensor(&xs, DType::F64, seed), tensor(&ks, DType::F64, !seed));
        let p2 = p.clone();
        let out = run_all_modes("conv", &[x.clone(), k.clone()], move |t: &[Tensor]| {
            Ok(vec![conv_general(&t[0], &t[1], &p2)?])
        })?;
        // Gradients through conv (its two transposes) must not panic either.
        let p3 = p.clone();
        let g = no_panic("grad conv", || {
            grad(move |t: &[Tensor]| conv_general(&t[0], &t[1], &p3)?.sum_all())(&[x.clone(), k.clone()])
        })?;
        if let Err(e) = &g {
            names_its_op("grad conv", e)?;
        }
        prop_assert_eq!(out.is_some(), g.is_ok());
        // Reference: 1-D, one group, explicit padding/valid, no lhs dilation.
        let simple = rank == 3 && groups == 1 && lhs_dil == 1 && stride >= 1 && (1..3).contains(&rhs_dil);
        let (plo, phi) = match &pad {
            ConvPadding::Valid => (0, 0),
            ConvPadding::Explicit(v) if v.len() == 1 && v[0].0.abs() < 10 => v[0],
            _ => return Ok(()),
        };
        if !simple || c != cg {
            return Ok(());
        }
        let Some(y) = out else {
            return Err(TestCaseError::fail(format!("conv {xs:?} {ks:?} {p:?} failed")));
        };
        let (xv, kv) = (vals(&x), vals(&k));
        let padded = w as i64 + plo + phi;
        // The dilated kernel size; a zero-size kernel spans 0 (kernels/conv.rs).
        let span = if kw == 0 { 0 } else { (kw as i64 - 1) * rhs_dil as i64 + 1 };
        let ow = if padded < span { 0 } else { ((padded - span) / stride as i64 + 1) as usize };
        let mut want = vec![0.0; n * o * ow];
        for b in 0..n {
            for oc in 0..o {
                for p_ in 0..ow {
                    let mut acc = 0.0;
                    for ic in 0..c {
                        for u in 0..kw {
                            let pos = (p_ * stride + u * rhs_dil) as i64 - plo;
                            if pos >= 0 && (pos as usize) < w {
                                acc += xv[(b * c + ic) * w + pos as usize] * kv[(oc * c + ic) * kw + u];
                            }
                        }
                    }
                    want[(b * o + oc) * ow + p_] = acc;
                }
            }
        }
        prop_assert_eq!(y[0].shape(), &[n, o, ow][..]);
        prop_assert!(close(&vals(&y[0]), &want, 1e-12), "{:?} vs {:?}", vals(&y[0]), want);
    }
}

// ------------------------------------------------------------------ transforms

proptest! {
    #![proptest_config(config(1500))]

    /// vmap of a random op over a random axis equals the loop over slices;
    /// grad of its sum equals central differences in f64; bad in_axes and
    /// arities are errors naming the transform.
    #[test]
    fn vmap_and_grad_of_random_ops(
        shape in prop::collection::vec(1usize..4, 1..4),
        in_axis in 0usize..4,
        which in 0usize..7,
        extra_args in 0usize..2,
        seed in any::<u64>(),
    ) {
        let f = move |t: &[Tensor]| -> Result<Vec<Tensor>> {
            let x = &t[0];
            Ok(vec![match which {
                0 => x.tanh()?,
                1 => x.mul(x)?.sum(&[0])?,
                2 => x.exp()?.mean_all()?,
                3 => x.pad(&vec![1; x.ndim()], &vec![0; x.ndim()])?,
                4 => x.slice(&vec![0; x.ndim()], x.shape())?.sigmoid()?,
                5 => x.transpose(&(0..x.ndim()).rev().collect::<Vec<_>>())?,
                _ => x.div_scalar(3.0)?.softplus()?,
            }])
        };
        let x = tensor(&shape, DType::F64, seed);
        let mut args = vec![x.clone()];
        args.extend((0..extra_args).map(|_| x.clone()));
        let mapped = no_panic("vmap", || vmap(f, vec![Some(in_axis)])(&args))?;
        let valid = in_axis < shape.len() && extra_args == 0;
        if let Err(e) = &mapped {
            names_its_op("vmap", e)?;
        }
        if !valid {
            prop_assert!(mapped.is_err(), "vmap should refuse axis {} of {:?} with {} args", in_axis, shape, args.len());
            return Ok(());
        }
        // Reference: loop over slices, stack.
        let per: Result<Vec<Tensor>> = (0..shape[in_axis])
            .map(|i| Ok(f(&[x.index_axis(in_axis, i)?])?.remove(0)))
            .collect();
        match (&mapped, per) {
            (Ok(m), Ok(per)) => {
                let want = stack(&per, 0).unwrap();
                prop_assert_eq!(m[0].shape(), want.shape());
                prop_assert!(close(&vals(&m[0]), &vals(&want), 1e-12));
            }
            (Err(_), Err(_)) => {}
            (m, p) => return Err(TestCaseError::fail(format!("vmap {:?} vs loop {:?}", m.as_ref().map(|_| ()), p.map(|_| ())))),
        }
        // grad of the sum against central differences.
        let g = no_panic("grad", || grad(move |t: &[Tensor]| f(t)?.remove(0).sum_all())(std::slice::from_ref(&x)))?;
        let g = match g {
            Ok(g) => g,
            Err(e) => return Err(TestCaseError::fail(format!("grad failed: {e}"))),
        };
        let xv = vals(&x);
        let h = 1e-6;
        for i in 0..xv.len() {
            let at = |d: f64| {
                let mut v = xv.clone();
                v[i] += d;
                f(&[Tensor::from_vec(v, &shape).unwrap()]).unwrap()[0].sum_all().unwrap().item().unwrap()
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let got = vals(&g[0])[i];
            prop_assert!((got - fd).abs() <= 1e-6 * (1.0 + fd.abs()), "grad[{}] {} vs fd {}", i, got, fd);
        }
    }

    /// Constructors and conversions with hostile shapes and lengths.
    #[test]
    fn constructors_with_hostile_shapes(
        shape in any_shape(3),
        len in 0usize..10,
        dt in dtype(),
    ) {
        let r = no_panic("from_vec", || Tensor::from_vec(vec![0.5; len], &shape))?;
        let possible = shape.iter().filter(|&&d| d != 0).try_fold(1usize, |a, &d| a.checked_mul(d)).is_some_and(|n| n <= isize::MAX as usize);
        match &r {
            Ok(t) => {
                prop_assert!(possible && numel(&shape) == len);
                prop_assert_eq!(t.shape(), &shape[..]);
            }
            Err(e) => {
                names_its_op("from_vec", e)?;
                prop_assert!(!(possible && numel(&shape) == len));
                let msg = e.to_string();
                prop_assert!(!msg.ends_with(&format!("{len} elements given, the shape holds {len}")), "{}", msg);
            }
        }
        let z = no_panic("try_zeros", || Tensor::try_zeros("init", &shape, dt))?;
        if let Err(e) = &z {
            names_its_op("try_zeros", e)?;
            prop_assert_eq!(e.op(), "init");
        } else {
            prop_assert!(possible);
        }
        // Avals of any shape trace through an elementwise op without panicking.
        let a = Aval::new(&shape, DType::F64);
        let t = no_panic("eval_shape", || eval_shape(|t: &[Tensor]| Ok(vec![t[0].tanh()?.mean_all()?]), &[a]))?;
        if let Err(e) = &t {
            names_its_op("eval_shape", e)?;
        }
    }
}

// ------------------------------------------------------------------ primitives and sequences

use braintrace::graph::{bind, Primitive};
use braintrace::ops::elementwise::{
    Binary, BinaryOp, Cast, Compare, CompareOp, Scalar, ScalarOp, Select, Unary, UnaryOp,
};
use braintrace::ops::index::{ScatterAdd, Take};
use braintrace::ops::linalg::Matmul;
use braintrace::ops::shape::{BroadcastInDim, Concat, Pad, ReduceSum, Reshape, SliceOp, Transpose};
use std::sync::Arc;

/// A core primitive with random (often invalid) parameters.
fn primitive(which: usize, v: &[usize], w: &[usize], axis: usize, dt: DType) -> Arc<dyn Primitive> {
    match which {
        0 => Arc::new(Unary(UnaryOp::Tanh)),
        1 => Arc::new(Binary(BinaryOp::Mul)),
        2 => Arc::new(Scalar {
            op: ScalarOp::Div,
            value: 0.5,
        }),
        3 => Arc::new(Compare(CompareOp::Le)),
        4 => Arc::new(Select),
        5 => Arc::new(Cast(dt)),
        6 => Arc::new(Reshape { shape: v.to_vec() }),
        7 => Arc::new(Transpose { perm: v.to_vec() }),
        8 => Arc::new(BroadcastInDim {
            shape: v.to_vec(),
            dims: w.to_vec(),
        }),
        9 => Arc::new(ReduceSum { axes: v.to_vec() }),
        10 => Arc::new(SliceOp {
            starts: v.to_vec(),
            limits: w.to_vec(),
        }),
        11 => Arc::new(Pad {
            lo: v.to_vec(),
            hi: w.to_vec(),
        }),
        12 => Arc::new(Matmul),
        13 => Arc::new(Take { axis }),
        14 => Arc::new(ScatterAdd {
            axis,
            shape: v.to_vec(),
        }),
        _ => Arc::new(Concat { axis }),
    }
}

proptest! {
    #![proptest_config(config(1000))]

    /// Core primitives bound directly with random arities, operand shapes
    /// and dtypes, and random parameters (including hostile sizes): eager,
    /// traced and jitted, nothing panics and every error names its op.
    #[test]
    fn primitives_with_random_arity_and_params(
        which in 0usize..16,
        v in prop::collection::vec(dim(), 0..4),
        w in prop::collection::vec(0usize..4, 0..4),
        axis in 0usize..4,
        shapes in prop::collection::vec(small_shape(3), 0..4),
        dts in prop::collection::vec(dtype(), 4),
        seed in any::<u64>(),
    ) {
        let p = primitive(which, &v, &w, axis, dts[3]);
        let args: Vec<Tensor> = shapes.iter().enumerate().map(|(i, s)| tensor(s, dts[i], seed ^ i as u64)).collect();
        let name = p.name();
        let p2 = p.clone();
        run_all_modes(&name, &args, move |t: &[Tensor]| bind(p2.clone(), t))?;
    }

    /// A random sequence of ops applied one after another: eager, traced and
    /// jitted agree (or all refuse), and vmap over a leading axis equals the
    /// loop over its slices.
    #[test]
    fn random_sequences_of_ops(
        shape in prop::collection::vec(1usize..4, 1..4),
        ops in prop::collection::vec((0usize..10, 0usize..4), 1..6),
        seed in any::<u64>(),
    ) {
        let ops2 = ops.clone();
        let f = move |t: &[Tensor]| -> Result<Vec<Tensor>> {
            let mut x = t[0].clone();
            for &(op, a) in &ops2 {
                x = match op {
                    0 => x.sin()?,
                    1 => x.mul_scalar(1.5)?.add(&x)?,
                    2 => x.sum(&[a])?,
                    3 => x.expand_dims(a)?,
                    4 => x.transpose(&(0..x.ndim()).rev().collect::<Vec<_>>())?,
                    5 => x.pad(&vec![a % 2; x.ndim()], &vec![1; x.ndim()])?,
                    6 => x.reshape(&[x.size()])?,
                    7 => x.slice_axis(a, 0, 1)?,
                    8 => concat(&[x.clone(), x.square()?], a)?,
                    _ => x.mean(&[a])?.softplus()?,
                };
            }
            Ok(vec![x])
        };
        let x = tensor(&shape, DType::F64, seed);
        let out = run_all_modes("sequence", std::slice::from_ref(&x), f.clone())?;
        let mapped = no_panic("vmap sequence", || vmap(f.clone(), vec![Some(0)])(std::slice::from_ref(&x)))?;
        if let Err(e) = &mapped {
            names_its_op("vmap sequence", e)?;
        }
        let per: Result<Vec<Tensor>> = (0..shape[0]).map(|i| Ok(f(&[x.index_axis0(i)?])?.remove(0))).collect();
        match (mapped, per) {
            (Ok(m), Ok(per)) => {
                let want = stack(&per, 0).unwrap();
                prop_assert_eq!(m[0].shape(), want.shape());
                prop_assert!(close(&vals(&m[0]), &vals(&want), 1e-12));
            }
            (Err(_), Err(_)) => {}
            (m, p) => return Err(TestCaseError::fail(format!(
                "vmap {:?} vs loop {:?} (eager on the batch: {})",
                m.map(|_| ()), p.map(|_| ()), out.is_some()
            ))),
        }
    }
}

// ------------------------------------------------------------------ layouts and fast paths

/// A tensor of logical shape `shape` held in a non-standard layout: a
/// standard tensor of the permuted shape, transposed back. Returns it with
/// its row-major values, computed here from the base's by explicit index
/// arithmetic (not through the layout code under test).
fn strided(shape: &[usize], perm: &[usize], dt: DType, seed: u64) -> (Tensor, Vec<f64>) {
    let base_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let base = tensor(&base_shape, dt, seed);
    let bv = vals(&base);
    // base axis i is logical axis perm[i]: transpose by the inverse.
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    let t = base.transpose(&inv).unwrap();
    let v = multi_indices(shape)
        .iter()
        .map(|ix| {
            let b: Vec<usize> = perm.iter().map(|&p| ix[p]).collect();
            bv[offset(&base_shape, &b)]
        })
        .collect();
    (t, v)
}

/// A permutation of `0..n` from a seed (identity for `seed == 0`).
fn perm_of(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut s = seed;
    for i in (1..n).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        p.swap(i, (s >> 33) as usize % (i + 1));
    }
    p
}

/// The shape of the second operand of a broadcasting binary op: one of the
/// kinds the flat kernels recognise (same, scalar, trailing block, leading
/// block with unit tail) or a random unit mask (the general path).
fn operand_shape(out: &[usize], kind: usize, cut: usize, mask: u32) -> Vec<usize> {
    let r = out.len();
    let cut = cut.min(r);
    match kind {
        0 => out.to_vec(),
        1 => vec![],
        2 => vec![1; cut],
        3 => out[cut..].to_vec(),
        4 => {
            let mut s = out[..cut].to_vec();
            s.extend(std::iter::repeat_n(1, r - cut));
            s
        }
        _ => (0..r)
            .map(|i| if mask >> i & 1 == 1 { 1 } else { out[i] })
            .collect(),
    }
}

proptest! {
    #![proptest_config(config(1500))]

    /// Binary ops with scalar, bias-row, column and unit-mask broadcasting,
    /// either operand possibly transposed, agree with an explicit loop.
    #[test]
    fn binary_fast_paths_agree_with_a_loop(
        out in prop::collection::vec(1usize..5, 0..5),
        kind in 0usize..6,
        cut in 0usize..5,
        mask in any::<u32>(),
        swap in any::<bool>(),
        pa in any::<u64>(),
        pb in any::<u64>(),
        op in 0..BINARY.len(),
        f32_ in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dt = if f32_ { DType::F32 } else { DType::F64 };
        let name = BINARY[op];
        let sb = operand_shape(&out, kind, cut, mask);
        let (a, av) = strided(&out, &perm_of(out.len(), pa % 3), dt, seed);
        let (b, bv) = strided(&sb, &perm_of(sb.len(), pb % 3), dt, !seed);
        let (sa, sb, a, b, av, bv) = if swap {
            (sb, out.clone(), b, a, bv, av)
        } else {
            (out.clone(), sb, a, b, av, bv)
        };
        let y = run_all_modes(name, &[a, b], move |t: &[Tensor]| Ok(vec![binary(name, &t[0], &t[1])?]))?;
        let Some(y) = y else {
            return Err(TestCaseError::fail(format!("{name} {sa:?} {sb:?} failed")));
        };
        let want: Vec<f64> = multi_indices(&out)
            .iter()
            .map(|ix| binary_ref(name, bcast_at(&av, &sa, ix), bcast_at(&bv, &sb, ix)))
            .collect();
        prop_assert_eq!(y[0].shape(), &out[..]);
        let tol = if f32_ { 1e-6 } else { 1e-14 };
        prop_assert!(close(&vals(&y[0]), &want, tol), "{} {:?} {:?}: {:?} vs {:?}", name, sa, sb, vals(&y[0]), want);
    }

    /// sum over any set of axes (adjacent or not) of inputs with unit axes,
    /// in standard or transposed layouts, agrees with an explicit loop.
    #[test]
    fn sum_of_unit_axes_and_strided_inputs(
        shape in prop::collection::vec(prop_oneof![2 => Just(1usize), 3 => 1usize..5, 1 => Just(0usize)], 0..6),
        mask in any::<u32>(),
        p in any::<u64>(),
        f32_ in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dt = if f32_ { DType::F32 } else { DType::F64 };
        let axes: Vec<usize> = (0..shape.len()).filter(|i| mask >> i & 1 == 1).collect();
        let (x, xv) = strided(&shape, &perm_of(shape.len(), p % 4), dt, seed);
        let ax = axes.clone();
        let y = run_all_modes("sum", &[x], move |t: &[Tensor]| Ok(vec![t[0].sum(&ax)?]))?;
        let Some(y) = y else {
            return Err(TestCaseError::fail(format!("sum {shape:?} over {axes:?} failed")));
        };
        let kept: Vec<usize> = (0..shape.len()).filter(|i| !axes.contains(i)).collect();
        let out_shape: Vec<usize> = kept.iter().map(|&i| shape[i]).collect();
        let mut acc = vec![0.0; numel(&out_shape)];
        for ix in multi_indices(&shape) {
            let o: Vec<usize> = kept.iter().map(|&i| ix[i]).collect();
            acc[offset(&out_shape, &o)] += xv[offset(&shape, &ix)];
        }
        prop_assert_eq!(y[0].shape(), &out_shape[..]);
        let tol = if f32_ { 1e-5 } else { 1e-13 };
        prop_assert!(close(&vals(&y[0]), &acc, tol), "{:?} over {:?}: {:?} vs {:?}", shape, axes, vals(&y[0]), acc);
    }

    /// Ops on a transposed (non-standard) operand: reshape, unary and
    /// scalar ops, cast, slice, broadcast_in_dim, concatenate and stack
    /// (with size-1 parts on the last axis) keep the logical values.
    #[test]
    fn ops_on_strided_operands_keep_the_values(
        shape in prop::collection::vec(1usize..4, 1..5),
        p in any::<u64>(),
        which in 0usize..9,
        axis in 0usize..5,
        n_parts in 1usize..4,
        dt in dtype(),
        seed in any::<u64>(),
    ) {
        let perm = perm_of(shape.len(), p % 5 + 1);
        let (x, xv) = strided(&shape, &perm, dt, seed);
        let r = shape.len();
        let axis = axis % (r + 1);
        let name = ["reshape", "tanh", "mul_scalar", "cast", "slice", "broadcast_in_dim", "concatenate", "stack", "logistic"][which];
        let float = dt.is_float();
        if (1..=2).contains(&which) || which == 8 {
            prop_assume!(float);
        }
        let sh = shape.clone();
        let y = run_all_modes(name, std::slice::from_ref(&x), move |t: &[Tensor]| {
            let x = &t[0];
            Ok(vec![match which {
                0 => x.reshape(&[numel(&sh)])?,
                1 => x.tanh()?,
                2 => x.mul_scalar(-2.5)?,
                3 => x.cast(if float { DType::I64 } else { DType::F64 })?,
                4 => x.slice(&vec![0; sh.len()], &sh.iter().map(|&d| d.div_ceil(2)).collect::<Vec<_>>())?,
                5 => {
                    let mut out = vec![2];
                    out.extend(&sh);
                    broadcast_in_dim(x, &out, &(1..=sh.len()).collect::<Vec<_>>())?
                }
                6 => {
                    // Parts of size 1 along the last axis, and x itself.
                    let last = sh.len() - 1;
                    let mut parts = vec![x.slice_axis(last, 0, 1)?; n_parts];
                    parts.push(x.clone());
                    concat(&parts, last)?
                }
                7 => stack(&vec![x.clone(); n_parts], axis)?,
                _ => x.sigmoid()?,
            }])
        })?;
        let Some(y) = y else {
            return Err(TestCaseError::fail(format!("{name} on {shape:?} (perm {perm:?}) failed")));
        };
        let yv = vals(&y[0]);
        let want: Vec<f64> = match which {
            0 => xv.clone(),
            1 => xv.iter().map(|v| v.tanh()).collect(),
            2 => xv.iter().map(|v| v * -2.5).collect(),
            3 => xv.iter().map(|&v| if float { v as i64 as f64 } else { v }).collect(),
            4 => {
                let lim: Vec<usize> = shape.iter().map(|&d| d.div_ceil(2)).collect();
                multi_indices(&lim).iter().map(|ix| xv[offset(&shape, ix)]).collect()
            }
            5 => [xv.clone(), xv.clone()].concat(),
            6 => {
                let last = r - 1;
                let mut out = shape.clone();
                out[last] += n_parts;
                multi_indices(&out)
                    .iter()
                    .map(|ix| {
                        let mut src = ix.clone();
                        src[last] = ix[last].saturating_sub(n_parts);
                        xv[offset(&shape, &src)]
                    })
                    .collect()
            }
            7 => {
                let mut out = shape.clone();
                out.insert(axis, n_parts);
                multi_indices(&out)
                    .iter()
                    .map(|ix| {
                        let mut src = ix.clone();
                        src.remove(axis);
                        xv[offset(&shape, &src)]
                    })
                    .collect()
            }
            _ => xv.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
        };
        let tol = if dt == DType::F32 { 1e-6 } else { 1e-14 };
        prop_assert!(close(&yv, &want, tol), "{} on {:?} (perm {:?}): {:?} vs {:?}", name, shape, perm, yv, want);
    }

    /// Batched matmul with transposed (strided) operands agrees with a loop.
    #[test]
    fn batched_matmul_of_strided_operands(
        batch in prop::collection::vec(1usize..3, 1..3),
        m in 1usize..4,
        k in 1usize..4,
        n in 1usize..4,
        ta in any::<bool>(),
        tb in any::<bool>(),
        f32_ in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dt = if f32_ { DType::F32 } else { DType::F64 };
        let r = batch.len() + 2;
        let swap_last = |t: bool| -> Vec<usize> {
            let mut p: Vec<usize> = (0..r).collect();
            if t {
                p.swap(r - 2, r - 1);
            }
            p
        };
        let mut sa = batch.clone();
        sa.extend([m, k]);
        let mut sb = batch.clone();
        sb.extend([k, n]);
        let (a, av) = strided(&sa, &swap_last(ta), dt, seed);
        let (b, bv) = strided(&sb, &swap_last(tb), dt, !seed);
        let y = run_all_modes("matmul", &[a, b], |t: &[Tensor]| Ok(vec![t[0].matmul(&t[1])?]))?;
        let Some(y) = y else {
            return Err(TestCaseError::fail(format!("matmul {sa:?} @ {sb:?} failed")));
        };
        let nb = numel(&batch);
        let mut want = vec![0.0; nb * m * n];
        for q in 0..nb {
            for i in 0..m {
                for j in 0..n {
                    for l in 0..k {
                        want[(q * m + i) * n + j] += av[(q * m + i) * k + l] * bv[(q * k + l) * n + j];
                    }
                }
            }
        }
        let tol = if f32_ { 1e-5 } else { 1e-13 };
        prop_assert!(close(&vals(&y[0]), &want, tol));
    }
}
