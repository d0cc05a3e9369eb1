//! Shape rules and operand checks shared by the conv primitives and
//! [`conv_general`](super::conv_general).

use crate::error::{Error, Result};
use crate::kernels::conv::ConvGeometry;
use crate::tensor::Aval;

pub(super) fn fmt_list<T: std::fmt::Debug>(v: &[T]) -> String {
    format!("{v:?}").replace(' ', "")
}

pub(super) fn geometry_params(g: &ConvGeometry) -> Vec<(String, String)> {
    vec![
        ("window_strides".into(), fmt_list(&g.strides)),
        ("padding".into(), fmt_list(&g.padding)),
        ("lhs_dilation".into(), fmt_list(&g.lhs_dilation)),
        ("rhs_dilation".into(), fmt_list(&g.rhs_dilation)),
        (
            "feature_group_count".into(),
            g.feature_group_count.to_string(),
        ),
    ]
}

/// The operands of a conv op as its shape errors report them: each one's
/// role and shape (typed in the error), plus context such as the layouts.
pub(crate) struct Operands {
    roles: Vec<(&'static str, Vec<usize>)>,
    extra: String,
}

impl Operands {
    pub(super) fn new(roles: &[(&'static str, &[usize])]) -> Self {
        Operands {
            roles: roles.iter().map(|&(r, s)| (r, s.to_vec())).collect(),
            extra: String::new(),
        }
    }
    pub(super) fn with_extra(mut self, extra: String) -> Self {
        self.extra = extra;
        self
    }
    /// An [`Error::Shape`] of `op` with these operands' shapes.
    pub(super) fn err(&self, op: &str, reason: impl std::fmt::Display) -> Error {
        let roles: Vec<&str> = self.roles.iter().map(|(r, _)| *r).collect();
        Error::shapes(
            op,
            self.roles.iter().map(|(_, s)| s),
            format!("{reason} (operands: {}{})", roles.join(", "), self.extra),
        )
    }
}

impl std::fmt::Display for Operands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (r, s)) in self.roles.iter().enumerate() {
            if i > 0 {
                f.write_str(" and ")?;
            }
            write!(f, "{r} {s:?}")?;
        }
        f.write_str(&self.extra)
    }
}

/// Both operands floats of one dtype.
pub(super) fn check_dtypes(op: &str, a: &Aval, b: &Aval) -> Result<()> {
    if a.dtype() != b.dtype() || !a.dtype().is_float() {
        return Err(Error::dtype_pair(
            op,
            (a.dtype(), a.shape()),
            (b.dtype(), b.shape()),
            true,
            "operands must be floats of one dtype (f32 or f64)",
        ));
    }
    Ok(())
}

/// Checks the rank of the N-carrying operand (`>= 3`) and that the other
/// operand has the same rank.
pub(super) fn check_ranks(op: &str, shapes: &Operands, a: &[usize], b: &[usize]) -> Result<()> {
    if a.len() < 3 {
        return Err(shapes.err(
            op,
            "operands must have rank >= 3 (batch, feature and at least one spatial axis)",
        ));
    }
    if a.len() != b.len() {
        return Err(shapes.err(op, format!("rank mismatch ({} vs {})", a.len(), b.len())));
    }
    Ok(())
}

/// Checks a geometry for `d` spatial dims.
pub(super) fn check_geometry(
    op: &str,
    shapes: &Operands,
    g: &ConvGeometry,
    d: usize,
) -> Result<()> {
    for (name, len) in [
        ("window_strides", g.strides.len()),
        ("padding", g.padding.len()),
        ("lhs_dilation", g.lhs_dilation.len()),
        ("rhs_dilation", g.rhs_dilation.len()),
    ] {
        if len != d {
            return Err(shapes.err(
                op,
                format!("{name} has length {len} but there are {d} spatial dims"),
            ));
        }
    }
    for (name, v) in [
        ("window_strides", &g.strides),
        ("lhs_dilation", &g.lhs_dilation),
        ("rhs_dilation", &g.rhs_dilation),
    ] {
        if v.contains(&0) {
            return Err(Error::invalid(
                op,
                format!("{name} must be >= 1, got {v:?} (shapes {shapes})"),
            ));
        }
    }
    if g.feature_group_count == 0 {
        return Err(Error::invalid(
            op,
            format!("feature_group_count must be >= 1 (shapes {shapes})"),
        ));
    }
    Ok(())
}

/// The canonical output shape `(N, O, o..)` of `Conv(x, k)`; validates everything.
pub(super) fn conv_out_shape(
    op: &str,
    shapes: &Operands,
    x: &[usize],
    k: &[usize],
    g: &ConvGeometry,
) -> Result<Vec<usize>> {
    check_ranks(op, shapes, x, k)?;
    let d = x.len() - 2;
    check_geometry(op, shapes, g, d)?;
    let groups = g.feature_group_count;
    let (n, c, o) = (x[0], x[1], k[0]);
    if c % groups != 0 {
        return Err(shapes.err(
            op,
            format!("feature_group_count {groups} does not divide the {c} input channels"),
        ));
    }
    if o % groups != 0 {
        return Err(shapes.err(
            op,
            format!("feature_group_count {groups} does not divide the {o} output channels"),
        ));
    }
    if k[1] != c / groups {
        return Err(shapes.err(op, format!(
                "channel mismatch: the kernel has {} input channels but the input has {c} channels / {groups} group(s) = {}",
                k[1],
                c / groups
            )));
    }
    let ys = g.output_spatial(&x[2..], &k[2..]).map_err(|e| match e {
        Error::Invalid { reason, .. } => shapes.err(op, reason),
        other => other,
    })?;
    let mut out = vec![n, o];
    out.extend(ys);
    crate::tensor::checked_size(op, &out)?;
    Ok(out)
}

/// A transpose's stored spatial sizes must match the operands' spatial rank.
pub(super) fn check_spatial_len(
    op: &str,
    shapes: &Operands,
    name: &str,
    sizes: &[usize],
    d: usize,
) -> Result<()> {
    if sizes.len() != d {
        return Err(shapes.err(
            op,
            format!(
                "{name} has length {} but there are {d} spatial dims",
                sizes.len()
            ),
        ));
    }
    Ok(())
}

/// A transpose's cotangent must have the shape of the conv output `y`.
pub(super) fn check_cotangent_shape(
    op: &str,
    shapes: &Operands,
    y: &[usize],
    ct: &[usize],
) -> Result<()> {
    if y != ct {
        return Err(shapes.err(
            op,
            format!("the cotangent must have the conv output shape {y:?}"),
        ));
    }
    Ok(())
}

/// Per-axis list of length `d`, or all ones when empty.
pub(super) fn per_axis(name: &str, v: &[usize], d: usize, shapes: &Operands) -> Result<Vec<usize>> {
    if v.is_empty() {
        return Ok(vec![1; d]);
    }
    if v.len() != d {
        return Err(shapes.err(
            "conv",
            format!(
                "{name} has length {} but there are {d} spatial dims",
                v.len()
            ),
        ));
    }
    Ok(v.to_vec())
}
