//! Backpropagation through time over an unrolled sequence, through the
//! core's `vjp`: the exact gradient online learners approximate, for tests
//! and for users who want to compare.

use super::algorithm::Reduction;
use super::state::{step_values, Model, ModelState, TensorDict};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::transform::vjp;

/// The result of [`bptt_grad`].
#[derive(Clone, Debug)]
pub struct Bptt {
    /// Gradient of the reduced loss per parameter key.
    pub grads: TensorDict,
    /// Per-step losses `(T,)`.
    pub losses: Tensor,
    /// Per-step outputs `(T, *out)`.
    pub outputs: Tensor,
    /// Per hidden path, the state after each step `(T, *state)`.
    pub hidden: TensorDict,
}

/// Unroll `model` from `state` over `xs` (`(T, *input)`), compute
/// `Σ_t loss(out_t, ys[t])` reduced by `reduction`, and its exact gradient
/// with respect to every parameter. `state` is not changed.
pub fn bptt_grad<M, L>(
    model: &M,
    state: &ModelState,
    xs: &Tensor,
    ys: &Tensor,
    loss: L,
    reduction: Reduction,
) -> Result<Bptt>
where
    M: Model + ?Sized,
    L: Fn(&Tensor, &Tensor) -> Result<Tensor>,
{
    if xs.ndim() == 0 || ys.ndim() == 0 || xs.shape()[0] != ys.shape()[0] || xs.shape()[0] == 0 {
        return Err(Error::shapes(
            "bptt_grad",
            [xs.shape(), ys.shape()],
            "xs and ys must be time-major with the same, non-zero number of steps",
        ));
    }
    let t_len = xs.shape()[0];
    let dtype = state.dtype();
    let (pinfo, hinfo) = (state.param_infos(), state.hidden_infos());
    let nh = hinfo.len();
    let f = |params: &[Tensor]| -> Result<Vec<Tensor>> {
        let mut h = state.hidden_values().to_vec();
        let mut total: Option<Tensor> = None;
        let (mut losses, mut outs) = (Vec::new(), Vec::new());
        let mut hs: Vec<Vec<Tensor>> = vec![Vec::new(); nh];
        for t in 0..t_len {
            let x = xs.index_axis0(t)?.cast(dtype)?;
            let y = ys.index_axis0(t)?.cast(dtype)?;
            let (out, new_h) = step_values(model, pinfo, params, hinfo, &h, &x)?;
            let l = loss(&out, &y)?;
            if !l.shape().is_empty() {
                return Err(Error::shapes(
                    "bptt_grad",
                    [l.shape()],
                    "the loss must be a scalar",
                ));
            }
            total = Some(match total {
                Some(s) => s.add(&l)?,
                None => l.clone(),
            });
            losses.push(l);
            outs.push(out);
            for (k, v) in new_h.iter().enumerate() {
                hs[k].push(v.clone());
            }
            h = new_h;
        }
        let total = total.expect("T > 0");
        let total = match reduction {
            Reduction::Mean => total.mul_scalar(1.0 / t_len as f64)?,
            Reduction::Sum => total,
        };
        let mut v = vec![
            total,
            crate::ops::stack(&losses, 0)?,
            crate::ops::stack(&outs, 0)?,
        ];
        for s in hs {
            v.push(crate::ops::stack(&s, 0)?);
        }
        Ok(v)
    };
    let (vals, pull) = vjp(f, state.param_values())?;
    let mut cts = vec![vals[0].ones_like()];
    cts.extend(vals[1..].iter().map(Tensor::zeros_like));
    let g = pull.apply(&cts)?;
    Ok(Bptt {
        grads: pinfo
            .iter()
            .zip(g)
            .map(|(p, g)| (p.key.clone(), g))
            .collect(),
        losses: vals[1].clone(),
        outputs: vals[2].clone(),
        hidden: hinfo
            .iter()
            .zip(&vals[3..])
            .map(|(h, v)| (h.path.clone(), v.clone()))
            .collect(),
    })
}
