//! Losses and metrics for training: mean squared error, softmax
//! cross-entropy (integer labels or class probabilities), binary
//! cross-entropy with logits, and argmax/accuracy.
//!
//! The losses are written with traced ops, so they work inside a learner's
//! step (`Learner::etrace_grad(xs, ys, loss, ..)`) and under `grad`. Each
//! returns the mean over all leading (batch) axes, a 0-d tensor, as
//! braintrace's examples take `mean` of braintools' per-example losses.
//! Classes are on the last axis.

use crate::error::{Error, Result};
use crate::ops::softmax_xent;
use crate::tensor::Tensor;

/// Mean squared error `mean((pred − target)²)` (shapes broadcast).
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    pred.sub(target)?.square()?.mean_all()
}

fn last_axis(op: &str, x: &Tensor) -> Result<usize> {
    match x.ndim() {
        0 => Err(Error::shapes(
            op,
            [x.shape()],
            "logits need a class axis (rank >= 1)",
        )),
        n => Ok(n - 1),
    }
}

/// The largest entry along the last axis, kept as an axis of size 1 and
/// cut from the derivative: it only shifts the exponentials so none
/// overflows, and the log-sum-exp's value and gradient do not depend on
/// the shift.
fn row_max(x: &Tensor, axis: usize) -> Result<Tensor> {
    let c = x.shape()[axis];
    let mut m = x.slice_axis(axis, 0, 1)?;
    for j in 1..c {
        m = m.maximum(&x.slice_axis(axis, j, j + 1)?)?;
    }
    m.stop_gradient()
}

/// `log softmax` along the last axis, `x − logsumexp(x)`, computed with
/// the largest entry subtracted first (no overflow for large logits).
pub fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    let ax = last_axis("log_softmax", logits)?;
    if logits.shape()[ax] == 0 {
        return Err(Error::shapes(
            "log_softmax",
            [logits.shape()],
            "no classes on the last axis",
        ));
    }
    let z = logits.sub(&row_max(logits, ax)?)?;
    let lse = z.exp()?.sum(&[ax])?.log()?.expand_dims(ax)?;
    z.sub(&lse)
}

/// Softmax cross-entropy against class probabilities (`targets` of the
/// logits' shape): `mean over rows of −Σ_c p_c log softmax(x)_c`.
pub fn softmax_cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if logits.shape() != targets.shape() {
        return Err(Error::shapes(
            "softmax_cross_entropy",
            [logits.shape(), targets.shape()],
            "logits and target probabilities must have the same shape",
        ));
    }
    let ax = last_axis("softmax_cross_entropy", logits)?;
    let per_row = targets.mul(&log_softmax(logits)?)?.sum(&[ax])?.neg()?;
    per_row.mean_all()
}

/// Softmax cross-entropy against integer class labels: `labels` has the
/// logits' shape without the class axis and holds class indices (an
/// integer or a float tensor of whole numbers, so targets can be a
/// learner's float `ys`). Concrete labels outside `[0, classes)` or not
/// whole are refused.
pub fn softmax_cross_entropy_with_integer_labels(
    logits: &Tensor,
    labels: &Tensor,
) -> Result<Tensor> {
    let op = "softmax_cross_entropy_with_integer_labels";
    let ax = last_axis(op, logits)?;
    check_labels(op, labels, logits.shape()[ax])?;
    if labels.shape() != &logits.shape()[..ax] {
        return Err(Error::shapes(
            op,
            [logits.shape(), labels.shape()],
            "labels must have the logits' shape without the class axis",
        ));
    }
    // One `softmax_xent` equation per row block (and one in the backward
    // pass) rather than the one-hot and log-softmax in core ops: the same
    // sums, a few dozen fewer equations per step.
    softmax_xent(logits, labels)?.mean_all()
}

/// Concrete `labels` must be class indices in `[0, classes)`.
fn check_labels(op: &str, labels: &Tensor, classes: usize) -> Result<()> {
    if !labels.is_symbolic() {
        let vals = labels.to_vec_f64()?;
        if let Some(bad) = vals
            .iter()
            .find(|&&v| !(v >= 0.0 && v < classes as f64 && v.fract() == 0.0))
        {
            return Err(Error::invalid(
                op,
                format!("label {bad} is not a class index in [0, {classes})"),
            ));
        }
    }
    Ok(())
}

/// Binary cross-entropy with logits, `mean(max(x, 0) − x·t + log(1 + e^−|x|))`
/// (the stable form of `−t log σ(x) − (1 − t) log(1 − σ(x))`); `targets`
/// of the logits' shape, in `[0, 1]`.
pub fn sigmoid_binary_cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if logits.shape() != targets.shape() {
        return Err(Error::shapes(
            "sigmoid_binary_cross_entropy",
            [logits.shape(), targets.shape()],
            "logits and targets must have the same shape",
        ));
    }
    logits
        .relu()?
        .sub(&logits.mul(targets)?)?
        .add(&logits.abs()?.neg()?.softplus()?)?
        .mean_all()
}

/// The index of the largest entry of each row (last axis; the first on
/// ties, as numpy's `argmax`). Needs a concrete tensor.
pub fn argmax(x: &Tensor) -> Result<Vec<usize>> {
    let ax = last_axis("argmax", x)?;
    let c = x.shape()[ax];
    if c == 0 {
        return Err(Error::shapes(
            "argmax",
            [x.shape()],
            "no entries on the last axis",
        ));
    }
    let v = x.to_vec_f64()?;
    Ok(v.chunks(c)
        .map(|row| {
            let mut best = 0;
            for (j, &a) in row.iter().enumerate() {
                // NaN is the largest, as numpy counts it.
                if a > row[best] || (a.is_nan() && !row[best].is_nan()) {
                    best = j;
                }
            }
            best
        })
        .collect())
}

/// The fraction of rows whose argmax equals the label (`labels` of the
/// logits' shape without the class axis, class indices). Concrete tensors.
pub fn accuracy(logits: &Tensor, labels: &Tensor) -> Result<f64> {
    let ax = last_axis("accuracy", logits)?;
    if labels.shape() != &logits.shape()[..ax] {
        return Err(Error::shapes(
            "accuracy",
            [logits.shape(), labels.shape()],
            "labels must have the logits' shape without the class axis",
        ));
    }
    let pred = argmax(logits)?;
    let lab = labels.to_vec_f64()?;
    if pred.is_empty() {
        return Err(Error::shapes("accuracy", [logits.shape()], "no rows"));
    }
    let hits = pred
        .iter()
        .zip(&lab)
        .filter(|(&p, &l)| p as f64 == l)
        .count();
    Ok(hits as f64 / pred.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::init::Rng;
    use crate::tensor::DType;
    use crate::transform::grad;

    fn draw(shape: &[usize], seed: u64, scale: f64) -> Tensor {
        let mut r = Rng::seed(seed);
        let n = shape.iter().product();
        Tensor::from_vec((0..n).map(|_| scale * r.normal()).collect(), shape).unwrap()
    }

    /// `grad f` at `x` against central differences of `f` (f64).
    fn check_fd(f: impl Fn(&Tensor) -> Result<Tensor>, x: &Tensor) {
        let g = grad(|a: &[Tensor]| f(&a[0]))(std::slice::from_ref(x)).unwrap()[0]
            .to_vec_f64()
            .unwrap();
        let v = x.to_vec_f64().unwrap();
        let eps = 1e-6;
        for i in 0..v.len() {
            let at = |d: f64| {
                let mut w = v.clone();
                w[i] += d;
                f(&Tensor::from_vec(w, x.shape()).unwrap())
                    .unwrap()
                    .item()
                    .unwrap()
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (fd - g[i]).abs() <= 1e-7 * (1.0 + fd.abs()),
                "element {i}: grad {} vs finite difference {fd}",
                g[i]
            );
        }
    }

    /// Cross-entropy of one row by the textbook formula.
    fn ce_row(x: &[f64], p: &[f64]) -> f64 {
        let lse = x.iter().map(|a| a.exp()).sum::<f64>().ln();
        -x.iter().zip(p).map(|(a, q)| q * (a - lse)).sum::<f64>()
    }

    #[test]
    fn values_match_explicit_loops() {
        let x = draw(&[3, 4], 1, 1.5);
        let p = draw(&[3, 4], 2, 1.0).softplus().unwrap();
        let (xv, pv) = (x.to_vec_f64().unwrap(), p.to_vec_f64().unwrap());
        let want: f64 = (0..3)
            .map(|r| ce_row(&xv[r * 4..r * 4 + 4], &pv[r * 4..r * 4 + 4]))
            .sum::<f64>()
            / 3.0;
        let got = softmax_cross_entropy(&x, &p).unwrap().item().unwrap();
        assert!((got - want).abs() < 1e-13, "{got} vs {want}");

        let labels = Tensor::from_vec(vec![2.0, 0.0, 3.0], &[3]).unwrap();
        let want: f64 = [2usize, 0, 3]
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                let mut oh = [0.0; 4];
                oh[c] = 1.0;
                ce_row(&xv[r * 4..r * 4 + 4], &oh)
            })
            .sum::<f64>()
            / 3.0;
        let got = softmax_cross_entropy_with_integer_labels(&x, &labels)
            .unwrap()
            .item()
            .unwrap();
        assert!((got - want).abs() < 1e-13, "{got} vs {want}");

        let t = draw(&[3, 4], 3, 1.0).sigmoid().unwrap();
        let tv = t.to_vec_f64().unwrap();
        let want: f64 = xv
            .iter()
            .zip(&tv)
            .map(|(a, b)| {
                let s = 1.0 / (1.0 + (-a).exp());
                -b * s.ln() - (1.0 - b) * (1.0 - s).ln()
            })
            .sum::<f64>()
            / 12.0;
        let got = sigmoid_binary_cross_entropy(&x, &t)
            .unwrap()
            .item()
            .unwrap();
        assert!((got - want).abs() < 1e-13, "{got} vs {want}");

        let y = draw(&[3, 4], 4, 1.0);
        let want: f64 = xv
            .iter()
            .zip(y.to_vec_f64().unwrap())
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            / 12.0;
        assert!((mse(&x, &y).unwrap().item().unwrap() - want).abs() < 1e-13);
    }

    #[test]
    fn large_logits_stay_finite() {
        // exp(1000) overflows; the shifted form gives the exact answer.
        let x = Tensor::from_vec(vec![1000.0, 999.0, -1000.0], &[1, 3]).unwrap();
        let l = Tensor::from_vec(vec![1.0], &[1]).unwrap();
        let got = softmax_cross_entropy_with_integer_labels(&x, &l)
            .unwrap()
            .item()
            .unwrap();
        let want = 1.0 + (1.0 + (-1.0f64).exp()).ln();
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        let t = Tensor::from_vec(vec![0.0, 1.0, 1.0], &[1, 3]).unwrap();
        let b = sigmoid_binary_cross_entropy(&x, &t)
            .unwrap()
            .item()
            .unwrap();
        // Per element: 1000 (x = 1000, t = 0), 0, 1000 (x = −1000, t = 1).
        assert!((b - 2000.0 / 3.0).abs() < 1e-9, "{b}");
    }

    #[test]
    fn gradients_match_finite_differences() {
        let x = draw(&[2, 3, 5], 5, 2.0);
        let p = draw(&[2, 3, 5], 6, 1.0).softplus().unwrap();
        check_fd(|a| softmax_cross_entropy(a, &p), &x);
        let labels = Tensor::from_vec(vec![0.0, 4.0, 2.0, 1.0, 3.0, 4.0], &[2, 3]).unwrap();
        check_fd(
            |a| softmax_cross_entropy_with_integer_labels(a, &labels),
            &x,
        );
        let t = draw(&[2, 3, 5], 7, 1.0).sigmoid().unwrap();
        check_fd(|a| sigmoid_binary_cross_entropy(a, &t), &x);
        let y = draw(&[2, 3, 5], 8, 1.0);
        check_fd(|a| mse(a, &y), &x);
        check_fd(|a| log_softmax(a)?.mul(&y)?.sum_all(), &x);
    }

    /// The integer-label loss as the one-hot written with core ops and
    /// `softmax_cross_entropy` (the composition `softmax_xent` replaces).
    fn xent_by_core_ops(x: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let c = *x.shape().last().unwrap();
        let ids = Tensor::from_vec((0..c).map(|k| k as f64).collect(), &[c])?;
        let oh = labels
            .expand_dims(labels.ndim())?
            .eq_elem(&ids)?
            .cast(x.dtype())?;
        softmax_cross_entropy(x, &oh)
    }

    #[test]
    fn softmax_xent_matches_core_ops_under_transforms() {
        use crate::transform::{jit, jvp, vjp, vmap};
        let x = draw(&[3, 2, 5], 11, 3.0);
        let labels = Tensor::from_vec(vec![0.0, 4.0, 2.0, 1.0, 3.0, 3.0], &[3, 2]).unwrap();
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            assert_eq!(a.shape(), b.shape(), "{what}");
            for (u, v) in a.to_vec_f64().unwrap().iter().zip(b.to_vec_f64().unwrap()) {
                assert!(
                    (u - v).abs() <= 1e-13 * (1.0 + v.abs()),
                    "{what}: {u} vs {v}"
                );
            }
        };
        let fused = |a: &[Tensor]| -> Result<Vec<Tensor>> {
            Ok(vec![softmax_cross_entropy_with_integer_labels(
                &a[0], &a[1],
            )?])
        };
        let core =
            |a: &[Tensor]| -> Result<Vec<Tensor>> { Ok(vec![xent_by_core_ops(&a[0], &a[1])?]) };
        let args = [x.clone(), labels.clone()];
        // Values, eagerly and under jit (labels symbolic, so not checked).
        close(&fused(&args).unwrap()[0], &core(&args).unwrap()[0], "value");
        close(
            &jit(fused)(&args).unwrap()[0],
            &core(&args).unwrap()[0],
            "jit value",
        );
        // Reverse mode (the transposed linear map), under jit too.
        let gf = grad(|a: &[Tensor]| softmax_cross_entropy_with_integer_labels(&a[0], &labels));
        let gc = grad(|a: &[Tensor]| xent_by_core_ops(&a[0], &labels));
        let want = gc(std::slice::from_ref(&x)).unwrap();
        close(&gf(std::slice::from_ref(&x)).unwrap()[0], &want[0], "grad");
        let jg = jit(|a: &[Tensor]| {
            grad(|b: &[Tensor]| softmax_cross_entropy_with_integer_labels(&b[0], &a[1]))(&a[..1])
        });
        close(&jg(&args).unwrap()[0], &want[0], "jit grad");
        // Forward mode (the linear map) and its transpose agree: ⟨J t, c⟩ = ⟨t, Jᵀ c⟩.
        let rows =
            |a: &[Tensor]| -> Result<Vec<Tensor>> { Ok(vec![softmax_xent(&a[0], &labels)?]) };
        let t = draw(&[3, 2, 5], 12, 1.0);
        let (_, jt) = jvp(rows, std::slice::from_ref(&x), std::slice::from_ref(&t)).unwrap();
        let ct = draw(&[3, 2], 13, 1.0);
        let (_, back) = vjp(rows, std::slice::from_ref(&x)).unwrap();
        let jct = back.apply(std::slice::from_ref(&ct)).unwrap();
        let dot = |a: &Tensor, b: &Tensor| a.mul(b).unwrap().sum_all().unwrap().item().unwrap();
        let (l, r) = (dot(&jt[0], &ct), dot(&t, &jct[0]));
        assert!((l - r).abs() <= 1e-12 * (1.0 + l.abs()), "{l} vs {r}");
        // Batched: over the logits only, and over both.
        let per = |a: &[Tensor]| -> Result<Vec<Tensor>> { Ok(vec![softmax_xent(&a[0], &a[1])?]) };
        let core_rows = |a: &Tensor, l: &Tensor| -> Tensor {
            let c = *a.shape().last().unwrap();
            let ids = Tensor::from_vec((0..c).map(|k| k as f64).collect(), &[c]).unwrap();
            let oh = l
                .expand_dims(l.ndim())
                .unwrap()
                .eq_elem(&ids)
                .unwrap()
                .cast(a.dtype())
                .unwrap();
            oh.mul(&log_softmax(a).unwrap())
                .unwrap()
                .sum(&[a.ndim() - 1])
                .unwrap()
                .neg()
                .unwrap()
        };
        let l2 = Tensor::from_vec(vec![1.0, 4.0], &[2]).unwrap();
        let b1 = vmap(per, vec![Some(0), None])(&[x.clone(), l2.clone()]).unwrap();
        close(&b1[0], &core_rows(&x, &l2), "vmap logits");
        let b2 = vmap(per, vec![Some(0), Some(0)])(&args).unwrap();
        close(&b2[0], &core_rows(&x, &labels), "vmap both");
        // One equation forward, one backward.
        let g = crate::transform::make_graph(fused, &[x.aval(), labels.aval()]).unwrap();
        assert_eq!(
            g.eqns
                .iter()
                .filter(|e| e.prim.name() == "softmax_xent")
                .count(),
            1
        );
    }

    #[test]
    fn softmax_xent_in_f32_and_second_order_is_an_error() {
        let x = draw(&[4, 3], 14, 2.0);
        let labels = Tensor::from_vec(vec![0.0, 2.0, 1.0, 1.0], &[4]).unwrap();
        let want = grad(|a: &[Tensor]| xent_by_core_ops(&a[0], &labels))(std::slice::from_ref(&x))
            .unwrap()[0]
            .to_vec_f64()
            .unwrap();
        let x32 = x.cast(DType::F32).unwrap();
        let f = |a: &[Tensor]| softmax_cross_entropy_with_integer_labels(&a[0], &labels);
        let got = grad(f)(std::slice::from_ref(&x32)).unwrap()[0].clone();
        assert_eq!(got.dtype(), DType::F32);
        for (u, v) in got.to_vec_f64().unwrap().iter().zip(&want) {
            assert!((u - v).abs() < 1e-6, "{u} vs {v}");
        }
        let gg = grad(|a: &[Tensor]| grad(f)(a)?[0].sum_all())(std::slice::from_ref(&x));
        let e = gg.unwrap_err().to_string();
        assert!(e.contains("softmax_xent_linear"), "{e}");
        // Bad operands of the primitive itself: typed errors.
        assert!(matches!(
            softmax_xent(&x, &Tensor::from_vec(vec![0.0; 3], &[3]).unwrap()),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            softmax_xent(&labels, &Tensor::from_vec(vec![0.0; 2], &[2]).unwrap()),
            Err(Error::Shape { .. })
        ));
        // Integer logits: a dtype error.
        let xi = Tensor::from_vec(vec![1.0, 2.0], &[1, 2])
            .unwrap()
            .cast(DType::I64)
            .unwrap();
        let l1 = Tensor::from_vec(vec![0.0], &[1]).unwrap();
        assert!(matches!(softmax_xent(&xi, &l1), Err(Error::DType { .. })));
    }

    #[test]
    fn argmax_and_accuracy() {
        let x = Tensor::from_vec(vec![0.1, 0.7, 0.7, 3.0, -1.0, 2.0], &[2, 3]).unwrap();
        assert_eq!(argmax(&x).unwrap(), vec![1, 0]);
        let l = Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap();
        assert_eq!(accuracy(&x, &l).unwrap(), 0.5);
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let x = draw(&[2, 3], 9, 1.0);
        let e = softmax_cross_entropy_with_integer_labels(
            &x,
            &Tensor::from_vec(vec![0.0, 3.0], &[2]).unwrap(),
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::Invalid { op, .. } if op.contains("integer_labels")),
            "{e}"
        );
        let e = softmax_cross_entropy_with_integer_labels(
            &x,
            &Tensor::from_vec(vec![0.0, 1.0, 2.0], &[3]).unwrap(),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        let e = softmax_cross_entropy(&x, &draw(&[2, 4], 1, 1.0)).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        let e = sigmoid_binary_cross_entropy(&x, &draw(&[3, 2], 1, 1.0)).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        assert!(accuracy(&x, &Tensor::from_vec(vec![0.0], &[1]).unwrap()).is_err());
        assert!(log_softmax(&Tensor::scalar(1.0)).is_err());
    }
}
