//! Binders of the conv primitives on canonical operands, and
//! [`conv_general`] with layouts, padding modes and defaults.

use super::check::{check_dtypes, check_ranks, conv_out_shape, per_axis, Operands};
use super::prims::{Conv, ConvTransposeLhs, ConvTransposeRhs};
use super::{ConvDimensionNumbers, ConvPadding, ConvParams};
use crate::error::{Error, Result};
use crate::graph::bind1;
use crate::kernels::conv::{same_padding, ConvGeometry};
use crate::tensor::Tensor;
use std::sync::Arc;

/// Bind [`Conv`] on canonical operands x `(N, C, s..)`, k `(O, C/G, k..)`.
pub fn conv_raw(x: &Tensor, k: &Tensor, geometry: &ConvGeometry) -> Result<Tensor> {
    bind1(
        Arc::new(Conv {
            geometry: geometry.clone(),
        }),
        &[x.clone(), k.clone()],
    )
}

/// Bind [`ConvTransposeLhs`]: the adjoint of [`conv_raw`] in `x`, whose
/// spatial sizes are `lhs_spatial`.
pub fn conv_transpose_lhs_raw(
    ct: &Tensor,
    k: &Tensor,
    geometry: &ConvGeometry,
    lhs_spatial: &[usize],
) -> Result<Tensor> {
    bind1(
        Arc::new(ConvTransposeLhs {
            geometry: geometry.clone(),
            lhs_spatial: lhs_spatial.to_vec(),
        }),
        &[ct.clone(), k.clone()],
    )
}

/// Bind [`ConvTransposeRhs`]: the adjoint of [`conv_raw`] in `k`, whose
/// spatial sizes are `rhs_spatial`.
pub fn conv_transpose_rhs_raw(
    x: &Tensor,
    ct: &Tensor,
    geometry: &ConvGeometry,
    rhs_spatial: &[usize],
) -> Result<Tensor> {
    bind1(
        Arc::new(ConvTransposeRhs {
            geometry: geometry.clone(),
            rhs_spatial: rhs_spatial.to_vec(),
        }),
        &[x.clone(), ct.clone()],
    )
}

/// Permutations taking the lhs, rhs and output layouts to canonical order
/// (`perm[j]` = axis of the layout that is canonical axis `j`).
pub(crate) fn layout_perms(
    dn: &ConvDimensionNumbers,
    rank: usize,
    shapes: &str,
) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let parse = |spec: &str, which: &str, pair: (char, char)| -> Result<Vec<char>> {
        let cs: Vec<char> = spec.chars().collect();
        if cs.len() != rank {
            return Err(Error::invalid(
                "conv",
                format!(
                    "{which} layout {spec:?} has {} axes but the operands have rank {rank} ({shapes})",
                    cs.len()
                ),
            ));
        }
        for (i, c) in cs.iter().enumerate() {
            if cs[..i].contains(c) {
                return Err(Error::invalid(
                    "conv",
                    format!("{which} layout {spec:?} repeats the axis letter {c:?}"),
                ));
            }
        }
        if !cs.contains(&pair.0) || !cs.contains(&pair.1) {
            return Err(Error::invalid(
                "conv",
                format!(
                    "{which} layout {spec:?} must name the axes {:?} and {:?}",
                    pair.0, pair.1
                ),
            ));
        }
        Ok(cs)
    };
    let lhs = parse(&dn.lhs, "lhs", ('N', 'C'))?;
    let rhs = parse(&dn.rhs, "rhs", ('O', 'I'))?;
    let out = parse(&dn.out, "out", ('N', 'C'))?;
    let spatial: Vec<char> = rhs
        .iter()
        .copied()
        .filter(|&c| c != 'O' && c != 'I')
        .collect();
    let pos = |cs: &[char], c: char| cs.iter().position(|&x| x == c);
    let perm = |cs: &[char], spec: &str, which: &str, pair: (char, char)| -> Result<Vec<usize>> {
        let mut p = vec![
            pos(cs, pair.0).expect("checked"),
            pos(cs, pair.1).expect("checked"),
        ];
        for &c in &spatial {
            p.push(pos(cs, c).ok_or_else(|| {
                Error::invalid(
                    "conv",
                    format!(
                        "{which} layout {spec:?} and rhs layout {:?} must use the same spatial axis letters",
                        dn.rhs
                    ),
                )
            })?);
        }
        Ok(p)
    };
    Ok((
        perm(&lhs, &dn.lhs, "lhs", ('N', 'C'))?,
        perm(&rhs, &dn.rhs, "rhs", ('O', 'I'))?,
        perm(&out, &dn.out, "out", ('N', 'C'))?,
    ))
}

/// General dilated convolution (cross-correlation, like XLA's).
///
/// Operands are laid out as [`ConvParams::dimension_numbers`] says
/// (default channel-first: x `(N, C, s..)`, k `(O, C/G, k..)`, output
/// `(N, O, o..)`); per-axis lists are in the kernel layout's spatial order.
/// SAME padding follows JAX (`kernels::conv::same_padding` with the kernel
/// dilation); with input dilation, the input size used is the dilated size.
///
/// ```
/// use braintrace_core::ops::{conv_general, ConvParams};
/// use braintrace_core::Tensor;
/// let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[1, 1, 4])?;
/// let k = Tensor::from_vec(vec![1.0, -1.0], &[1, 1, 2])?;
/// let y = conv_general(&x, &k, &ConvParams::default_for(1))?;
/// assert_eq!(y.to_vec_f64()?, vec![-1.0, -1.0, -1.0]);
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn conv_general(x: &Tensor, k: &Tensor, p: &ConvParams) -> Result<Tensor> {
    let shapes = Operands::new(&[("input", x.shape()), ("kernel", k.shape())]);
    check_dtypes("conv", &x.aval(), &k.aval())?;
    check_ranks("conv", &shapes, x.shape(), k.shape())?;
    let rank = x.ndim();
    let d = rank - 2;
    let (lp, rp, op) = match &p.dimension_numbers {
        None => {
            let id: Vec<usize> = (0..rank).collect();
            (id.clone(), id.clone(), id)
        }
        Some(dn) => layout_perms(dn, rank, &shapes.to_string())?,
    };
    if p.strides.len() != d {
        return Err(shapes.err(
            "conv",
            format!(
                "window_strides has length {} but there are {d} spatial dims",
                p.strides.len()
            ),
        ));
    }
    let lhs_dilation = per_axis("lhs_dilation", &p.lhs_dilation, d, &shapes)?;
    let rhs_dilation = per_axis("rhs_dilation", &p.rhs_dilation, d, &shapes)?;
    let xc = x.transpose(&lp)?;
    let kc = k.transpose(&rp)?;
    let (xs, ks) = (&xc.shape()[2..], &kc.shape()[2..]);
    let padding = match &p.padding {
        ConvPadding::Valid => vec![(0, 0); d],
        ConvPadding::Same => (0..d)
            .map(|i| {
                let n = if xs[i] == 0 {
                    0
                } else {
                    (xs[i] - 1) * lhs_dilation[i].max(1) + 1
                };
                same_padding(n, ks[i], p.strides[i], rhs_dilation[i])
            })
            .collect(),
        ConvPadding::Explicit(v) => {
            if v.len() != d {
                return Err(shapes.err(
                    "conv",
                    format!(
                        "padding has length {} but there are {d} spatial dims",
                        v.len()
                    ),
                ));
            }
            v.clone()
        }
    };
    let geometry = ConvGeometry {
        strides: p.strides.clone(),
        padding,
        lhs_dilation,
        rhs_dilation,
        feature_group_count: p.feature_group_count,
    };
    // Validate here too, so errors show the shapes as the caller gave them.
    let shapes = match &p.dimension_numbers {
        Some(dn) => shapes.with_extra(format!(
            "; input {:?} ({}) and kernel {:?} ({}), canonically {:?} and {:?}",
            x.shape(),
            dn.lhs,
            k.shape(),
            dn.rhs,
            xc.shape(),
            kc.shape()
        )),
        None => shapes,
    };
    conv_out_shape("conv", &shapes, xc.shape(), kc.shape(), &geometry)?;
    let y = conv_raw(&xc, &kc, &geometry)?;
    // Output axis i of the layout is canonical axis j with op[j] == i.
    let mut inv = vec![0; rank];
    for (j, &i) in op.iter().enumerate() {
        inv[i] = j;
    }
    y.transpose(&inv)
}

impl Tensor {
    /// Convolution of `self` (the input) with the kernel `k`; see [`conv_general`].
    pub fn conv(&self, k: &Tensor, p: &ConvParams) -> Result<Tensor> {
        conv_general(self, k, p)
    }
}
