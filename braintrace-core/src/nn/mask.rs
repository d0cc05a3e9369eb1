//! A layer's fixed arrays (`w_mask`, `w_sign`): their checks, and a
//! weight transform multiplied by a mask (used by [`Linear`](super::Linear)
//! and the weight-structured layers of `wlayers`).

use crate::error::{Error, Result};
use crate::etp::ElemFn;
use crate::tensor::Tensor;
use std::hash::{Hash, Hasher};

/// A fixed array of a layer (`w_mask`, `w_sign`): it must broadcast to
/// `shape` and hold finite values.
pub(crate) fn check_mask(op: &str, name: &str, m: &Tensor, shape: &[usize]) -> Result<()> {
    let fits = m.ndim() <= shape.len()
        && m.shape()
            .iter()
            .rev()
            .zip(shape.iter().rev())
            .all(|(&a, &b)| a == b || a == 1);
    if !fits {
        return Err(Error::shapes(
            op,
            [m.shape(), shape],
            format!("{name} (first) must broadcast to the weight's shape (second)"),
        ));
    }
    let v = m.to_vec_f64()?;
    if let Some(bad) = v.iter().find(|x| !x.is_finite()) {
        return Err(Error::invalid(
            op,
            format!("{name} must be finite, got {bad}"),
        ));
    }
    Ok(())
}

/// A name for a fixed array, by its shape and values (transforms are
/// compared by name, so two different masks must not share one).
pub(crate) fn content_name(m: &Tensor) -> Result<String> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.shape().hash(&mut h);
    for v in m.to_vec_f64()? {
        v.to_bits().hash(&mut h);
    }
    Ok(format!("{:?}#{:016x}", m.shape(), h.finish()))
}

/// `f(w) ⊙ mask` as one element-wise transform (`f` = identity when `None`).
pub(crate) fn masked(f: Option<ElemFn>, mask: &Tensor) -> Result<ElemFn> {
    let name = format!(
        "{}mask{}",
        f.as_ref()
            .map(|f| format!("{}*", f.name()))
            .unwrap_or_default(),
        content_name(mask)?
    );
    let (m1, m2) = (mask.clone(), mask.clone());
    let (f1, f2) = (f.clone(), f);
    Ok(ElemFn::new(
        &name,
        move |w| crate::etp::apply_fn(&f1, w)?.mul(&m1.cast(w.dtype())?),
        move |w| {
            let m = m2.cast(w.dtype())?;
            match &f2 {
                Some(f) => f.derivative(w)?.mul(&m),
                None => m.broadcast_to(w.shape()),
            }
        },
    ))
}
