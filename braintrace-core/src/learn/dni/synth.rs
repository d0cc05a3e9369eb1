//! The synthesiser of DNI (braintrace's `SyntheticGradient`): per hidden
//! group one affine map from the group's hidden values at a window's exit
//! to an estimate of the cotangent the truncated future would have sent
//! back, `ĝ = flat(h) W + b`, shaped like the group.
//!
//! A group's values `(V.., S)` (its states stacked on a trailing axis) are
//! flattened over the last two axes, `(V[..-1].., V[-1]·S)` — unit-major,
//! state-minor, as braintrace does — so `W` is `(V[-1]·S, V[-1]·S)` and `b`
//! is `(V[-1]·S,)`, whatever the batch size.

use crate::error::{Error, Result};
use crate::learn::compiler::EtraceGraph;
use crate::learn::state::TensorDict;
use crate::random::Rng;
use crate::tensor::{DType, Tensor};
use std::fmt;

/// A per-hidden-group linear synthesiser of the future cotangent
/// (braintrace's `SyntheticGradient`; see the module docs). Its parameters
/// are not the model's: they never reach a relation, the online loss does
/// not train them (the estimate is a constant to it), and
/// [`train_synthetic_gradient`](super::train_synthetic_gradient) fits them
/// by regression.
///
/// ```
/// use braintrace_core::learn::SyntheticGradient;
/// use braintrace_core::{DType, Tensor};
///
/// // One group of 4 units with one state each, batch 2.
/// let sg = SyntheticGradient::zeros(&[vec![2, 4, 1]], DType::F64)?;
/// assert_eq!(sg.weights()[0].shape(), &[4, 4]);
/// let est = sg.apply(&[Tensor::ones(&[2, 4, 1], DType::F64)])?;
/// assert_eq!(est[0].shape(), &[2, 4, 1]);
/// assert!(est[0].to_vec_f64()?.iter().all(|v| *v == 0.0)); // untrained: exactly zero
/// # Ok::<(), braintrace_core::Error>(())
/// ```
#[derive(Clone)]
pub struct SyntheticGradient {
    shapes: Vec<Vec<usize>>,
    weights: Vec<Tensor>,
    biases: Vec<Tensor>,
}

impl fmt::Debug for SyntheticGradient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyntheticGradient")
            .field("group_shapes", &self.shapes)
            .field("dtype", &self.dtype())
            .finish()
    }
}

const OP: &str = "SyntheticGradient";

/// The flat width `V[-1]·S` of a group shape `(V.., S)`, checked.
fn width(op: &str, g: usize, shape: &[usize]) -> Result<usize> {
    if shape.len() < 2 || shape.contains(&0) {
        return Err(Error::shapes(
            op,
            [shape],
            format!(
                "group_shapes[{g}]: a group's shape is (*varshape, num_state) with at least one \
                 varshape axis and no empty axis"
            ),
        ));
    }
    Ok(shape[shape.len() - 2] * shape[shape.len() - 1])
}

/// `flat(slab) W + b` shaped like `slab` (`(V.., S)`); traced or eager.
pub(crate) fn estimate(w: &Tensor, b: &Tensor, slab: &Tensor) -> Result<Tensor> {
    let shape = slab.shape().to_vec();
    let nd = shape.len();
    let mut flat = shape[..nd - 2].to_vec();
    flat.push(shape[nd - 2] * shape[nd - 1]);
    slab.reshape(&flat)?.matmul(w)?.add(b)?.reshape(&shape)
}

impl SyntheticGradient {
    /// The shape a synthesiser must emit for each hidden group of `graph`,
    /// `(*varshape, num_state)` (braintrace's `group_signal_shapes`).
    pub fn group_shapes(graph: &EtraceGraph) -> Vec<Vec<usize>> {
        graph
            .groups()
            .iter()
            .map(|g| {
                let mut s = g.varshape.clone();
                s.push(g.num_state());
                s
            })
            .collect()
    }

    /// Zero weights and biases (braintrace's default, `scale = 0`): an
    /// untrained synthesiser predicts exactly zero, so DNI starts as the
    /// plain truncated rule. `group_shapes[g]` is group `g`'s
    /// `(*varshape, num_state)`; `dtype` must be the model's.
    pub fn zeros(group_shapes: &[Vec<usize>], dtype: DType) -> Result<Self> {
        crate::learn::float_dtype(OP, "dtype", dtype)?;
        let mut weights = Vec::new();
        let mut biases = Vec::new();
        for (g, s) in group_shapes.iter().enumerate() {
            let w = width(OP, g, s)?;
            weights.push(Tensor::zeros(&[w, w], dtype));
            biases.push(Tensor::zeros(&[w], dtype));
        }
        Ok(SyntheticGradient {
            shapes: group_shapes.to_vec(),
            weights,
            biases,
        })
    }

    /// A zero synthesiser for the groups of `graph`
    /// (`zeros(&group_shapes(graph), dtype)`).
    pub fn for_graph(graph: &EtraceGraph, dtype: DType) -> Result<Self> {
        Self::zeros(&Self::group_shapes(graph), dtype)
    }

    /// Weights drawn `scale · N(0, 1)` from `seed` (row-major, group by
    /// group; our generator, not braintrace's), biases zero: braintrace's
    /// `scale` for a synthesiser live from the start. `scale` must be finite.
    pub fn random(
        group_shapes: &[Vec<usize>],
        scale: f64,
        seed: u64,
        dtype: DType,
    ) -> Result<Self> {
        if !scale.is_finite() {
            return Err(Error::invalid(
                OP,
                format!("scale: must be finite, got {scale}"),
            ));
        }
        let mut sg = Self::zeros(group_shapes, dtype)?;
        let mut rng = Rng::seed(seed);
        for w in &mut sg.weights {
            let n = w.shape()[0];
            let v: Vec<f64> = (0..n * n).map(|_| scale * rng.normal()).collect();
            *w = Tensor::from_vec(v, &[n, n])?.cast(dtype)?;
        }
        Ok(sg)
    }

    /// Given weights and biases (e.g. braintrace's own draws): `weights[g]`
    /// `(w, w)` and `biases[g]` `(w,)` with `w = V[-1]·S` of
    /// `group_shapes[g]`, all of one float dtype.
    pub fn from_values(
        group_shapes: &[Vec<usize>],
        weights: Vec<Tensor>,
        biases: Vec<Tensor>,
    ) -> Result<Self> {
        const FV: &str = "SyntheticGradient::from_values";
        let n = group_shapes.len();
        if weights.len() != n || biases.len() != n {
            return Err(Error::invalid(
                FV,
                format!(
                    "weights, biases: {} and {} given for {n} group(s) (one each per group)",
                    weights.len(),
                    biases.len()
                ),
            ));
        }
        let dtype = match weights.first() {
            Some(w) => w.dtype(),
            None => DType::F64,
        };
        crate::learn::float_dtype(FV, "weights[0]", dtype)?;
        for (g, s) in group_shapes.iter().enumerate() {
            let w = width(FV, g, s)?;
            for (what, t, want) in [
                ("weights", &weights[g], vec![w, w]),
                ("biases", &biases[g], vec![w]),
            ] {
                if t.is_symbolic() || t.shape() != want.as_slice() {
                    return Err(Error::shapes(
                        FV,
                        [t.shape().to_vec(), want],
                        format!(
                            "{what}[{g}] (first) must be a concrete tensor of the shape group {g} \
                             {s:?} needs (second)"
                        ),
                    ));
                }
                if t.dtype() != dtype {
                    return Err(Error::dtype_with(
                        FV,
                        format!("{what}[{g}]"),
                        [dtype],
                        t.dtype(),
                        "every weight and bias must have the first weight's dtype",
                    ));
                }
            }
        }
        Ok(SyntheticGradient {
            shapes: group_shapes.to_vec(),
            weights,
            biases,
        })
    }

    /// Each group's `(*varshape, num_state)`, as made for.
    pub fn shapes(&self) -> &[Vec<usize>] {
        &self.shapes
    }
    /// Whether it fits hidden groups of these shapes: as many groups, each
    /// of the same last two axes `(V[-1], S)` (the leading ones, the batch
    /// among them, are free: the parameters do not depend on them).
    pub fn fits(&self, group_shapes: &[Vec<usize>]) -> bool {
        self.shapes.len() == group_shapes.len()
            && self
                .shapes
                .iter()
                .zip(group_shapes)
                .all(|(a, b)| b.len() >= 2 && a[a.len() - 2..] == b[b.len() - 2..])
    }
    /// The weights, one `(w, w)` per group.
    pub fn weights(&self) -> &[Tensor] {
        &self.weights
    }
    /// The biases, one `(w,)` per group.
    pub fn biases(&self) -> &[Tensor] {
        &self.biases
    }
    /// The parameters' dtype.
    pub fn dtype(&self) -> DType {
        self.weights.first().map_or(DType::F64, Tensor::dtype)
    }

    /// Each group's estimate from its values `group_hiddens[g]` (shaped
    /// like the group, `(*varshape, num_state)`).
    pub fn apply(&self, group_hiddens: &[Tensor]) -> Result<Vec<Tensor>> {
        self.check_slabs("SyntheticGradient::apply", "group_hiddens", group_hiddens)?;
        group_hiddens
            .iter()
            .enumerate()
            .map(|(g, h)| estimate(&self.weights[g], &self.biases[g], h))
            .collect()
    }

    /// The parameters by name, for an optimiser: `synth_w/<g>` and
    /// `synth_b/<g>` (braintrace's `states_dict` keys).
    pub fn params(&self) -> TensorDict {
        let mut d = TensorDict::new();
        for (g, (w, b)) in self.weights.iter().zip(&self.biases).enumerate() {
            d.insert(format!("synth_w/{g}"), w.clone());
            d.insert(format!("synth_b/{g}"), b.clone());
        }
        d
    }

    /// Set parameters by [`params`](Self::params)' names (those given;
    /// each of its parameter's shape, cast to its dtype). Nothing changes
    /// on error.
    pub fn set_params(&mut self, p: &TensorDict) -> Result<()> {
        const SP: &str = "SyntheticGradient::set_params";
        let own = self.params();
        let mut new = Vec::with_capacity(p.len());
        for (k, v) in p {
            let cur = own.get(k).ok_or_else(|| {
                Error::invalid(
                    SP,
                    format!(
                        "`{k}` is not a parameter of the synthesiser (parameters: {})",
                        own.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
            if v.is_symbolic() || v.shape() != cur.shape() {
                return Err(Error::shapes(
                    SP,
                    [v.shape(), cur.shape()],
                    format!(
                        "`{k}` (first) must be a concrete tensor of its parameter's shape (second)"
                    ),
                ));
            }
            new.push((k.clone(), v.cast(self.dtype())?));
        }
        for (k, v) in new {
            let (slot, g) = k.split_once('/').expect("a parameter's name");
            let g: usize = g.parse().expect("a group index");
            if slot == "synth_w" {
                self.weights[g] = v;
            } else {
                self.biases[g] = v;
            }
        }
        Ok(())
    }

    /// The regression `Σ_g mean((ĝ_g(h_g) − y_g)²)` at `hiddens` against
    /// `targets` (both per group, shaped like the group): its value and
    /// its gradient by parameter name.
    pub(crate) fn regression(
        &self,
        hiddens: &[Tensor],
        targets: &[Tensor],
    ) -> Result<(f64, TensorDict)> {
        const RG: &str = "train_synthetic_gradient";
        self.check_slabs(RG, "hiddens", hiddens)?;
        self.check_slabs(RG, "targets", targets)?;
        let mut err = 0.0;
        let mut grads = TensorDict::new();
        for (g, (h, y)) in hiddens.iter().zip(targets).enumerate() {
            let w = self.weights[g].shape()[0];
            let rows = h.shape().iter().product::<usize>() / w;
            let x = h.cast(self.dtype())?.reshape(&[rows, w])?;
            let y = y.cast(self.dtype())?.reshape(&[rows, w])?;
            let d = x.matmul(&self.weights[g])?.add(&self.biases[g])?.sub(&y)?;
            err += d.square()?.mean_all()?.to_vec_f64()?[0];
            let dp = d.mul_scalar(2.0 / (rows * w) as f64)?;
            grads.insert(format!("synth_w/{g}"), x.t()?.matmul(&dp)?);
            grads.insert(format!("synth_b/{g}"), dp.sum(&[0])?);
        }
        Ok((err, grads))
    }

    /// The parameters in order: `W_0, b_0, W_1, b_1, ..`.
    pub(crate) fn tensors(&self) -> Vec<Tensor> {
        self.weights
            .iter()
            .zip(&self.biases)
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect()
    }

    /// [`tensors`](Self::tensors)' list back, for the same shapes (checked
    /// count, shapes and dtype; nothing changes on error).
    pub(crate) fn with_tensors(&self, op: &str, v: &[Tensor]) -> Result<Self> {
        if v.len() != 2 * self.shapes.len() {
            return Err(Error::invalid(
                op,
                format!(
                    "the saved synthesiser has {} tensor(s), this one {}",
                    v.len(),
                    2 * self.shapes.len()
                ),
            ));
        }
        let (w, b): (Vec<Tensor>, Vec<Tensor>) =
            v.chunks(2).map(|c| (c[0].clone(), c[1].clone())).unzip();
        let sg = Self::from_values(&self.shapes, w, b)?;
        if sg.dtype() != self.dtype() {
            return Err(Error::dtype_with(
                op,
                "synthesiser",
                [self.dtype()],
                sg.dtype(),
                "the saved synthesiser's dtype is not this one's",
            ));
        }
        Ok(sg)
    }

    /// One slab per group, each of its group's last two axes.
    fn check_slabs(&self, op: &str, what: &str, v: &[Tensor]) -> Result<()> {
        if v.len() != self.shapes.len() {
            return Err(Error::invalid(
                op,
                format!(
                    "{what}: {} given for {} group(s)",
                    v.len(),
                    self.shapes.len()
                ),
            ));
        }
        for (g, (t, s)) in v.iter().zip(&self.shapes).enumerate() {
            let n = t.ndim();
            if n < 2 || t.shape()[n - 2..] != s[s.len() - 2..] {
                return Err(Error::shapes(
                    op,
                    [t.shape(), s.as_slice()],
                    format!(
                        "{what}[{g}] (first) must end in group {g}'s last two axes (second: \
                         (*varshape, num_state))"
                    ),
                ));
            }
        }
        Ok(())
    }
}
