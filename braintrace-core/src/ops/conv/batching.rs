//! Batching helpers of the conv primitives: folding a vmap axis into the
//! batch axis, or into feature groups when the kernel is batched.

use crate::error::Result;
use crate::graph::Primitive;
use crate::kernels::conv::ConvGeometry;
use crate::ops::shape::broadcast_in_dim;
use crate::tensor::{Aval, Tensor};

/// `(B, N, ..) -> (B*N, ..)`.
pub(super) fn fold_batch(x: &Tensor) -> Result<Tensor> {
    let s = x.shape();
    let mut sh = vec![s[0] * s[1]];
    sh.extend(&s[2..]);
    x.reshape(&sh)
}

/// `(B*N, ..) -> (B, N, ..)`.
pub(super) fn unfold_batch(y: &Tensor, size: usize) -> Result<Tensor> {
    let s = y.shape();
    let mut sh = vec![size, s[0] / size];
    sh.extend(&s[1..]);
    y.reshape(&sh)
}

/// `(B, N, C, ..)` (or unbatched `(N, C, ..)`, broadcast) -> `(N, B*C, ..)`.
pub(super) fn lhs_to_groups(x: &Tensor, batched: bool, size: usize) -> Result<Tensor> {
    let x = if batched {
        x.clone()
    } else {
        let mut sh = vec![size];
        sh.extend(x.shape());
        let dims: Vec<usize> = (1..=x.ndim()).collect();
        broadcast_in_dim(x, &sh, &dims)?
    };
    let mut perm: Vec<usize> = (0..x.ndim()).collect();
    perm.swap(0, 1);
    let xt = x.transpose(&perm)?;
    let s = xt.shape();
    let mut sh = vec![s[0], s[1] * s[2]];
    sh.extend(&s[3..]);
    xt.reshape(&sh)
}

/// `(N, B*O, ..) -> (B, N, O, ..)`.
pub(super) fn lhs_from_groups(y: &Tensor, size: usize) -> Result<Tensor> {
    let s = y.shape();
    let mut sh = vec![s[0], size, s[1] / size];
    sh.extend(&s[2..]);
    let y = y.reshape(&sh)?;
    let mut perm: Vec<usize> = (0..y.ndim()).collect();
    perm.swap(0, 1);
    y.transpose(&perm)
}

/// `(B, O, I, ..)` (or unbatched `(O, I, ..)`, broadcast) -> `(B*O, I, ..)`.
pub(super) fn rhs_to_groups(k: &Tensor, batched: bool, size: usize) -> Result<Tensor> {
    if batched {
        return fold_batch(k);
    }
    let mut sh = vec![size];
    sh.extend(k.shape());
    let dims: Vec<usize> = (1..=k.ndim()).collect();
    fold_batch(&broadcast_in_dim(k, &sh, &dims)?)
}

pub(super) fn scaled_groups(g: &ConvGeometry, size: usize) -> ConvGeometry {
    ConvGeometry {
        feature_group_count: g.feature_group_count * size,
        ..g.clone()
    }
}

/// Batching with a batch of size 0: zeros of the right shape.
pub(super) fn batch_empty(
    prim: &dyn Primitive,
    args: &[Tensor],
    batched: &[bool],
) -> Result<(Vec<Tensor>, Vec<bool>)> {
    let avals: Vec<Aval> = args
        .iter()
        .zip(batched)
        .map(|(a, &b)| {
            let av = a.aval();
            if b {
                av.with_shape(&av.shape()[1..])
            } else {
                av
            }
        })
        .collect();
    let outs = prim.abstract_eval(&avals)?;
    let n = outs.len();
    let outs = outs
        .into_iter()
        .map(|o| {
            let mut sh = vec![0];
            sh.extend(o.shape());
            Tensor::zeros(&sh, o.dtype())
        })
        .collect();
    Ok((outs, vec![true; n]))
}
