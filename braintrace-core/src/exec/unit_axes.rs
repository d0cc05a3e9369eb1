//! Reshapes that only add or drop axes of length one (`t[..., 0]` of a
//! trailing state axis of one, an `expand_dims`) whose result only fused
//! loops read, as a value of their loop's shape: the plan does not run
//! them, and the loops read the reshape's operand instead. Its elements
//! are the same, in the same row-major and column-major order, so a value
//! the caller still holds (a trace passed in, a result also returned) is
//! read where it lies instead of copied into its new shape.

use super::*;

/// Whether shapes `a` and `b` differ only by axes of length one.
pub(super) fn unit_axes_only(a: &[usize], b: &[usize]) -> bool {
    a.iter()
        .filter(|&&d| d != 1)
        .eq(b.iter().filter(|&&d| d != 1))
}

/// The reshapes the plan skips (see the module docs), and per skipped
/// result the value the fused loops read instead.
pub(super) fn aliased_reshapes(
    g: &Graph,
    groups: &Groups,
) -> (HashSet<usize>, HashMap<VarId, VarId>) {
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.avals.len()];
    for (i, e) in g.eqns.iter().enumerate() {
        for &v in &e.inputs {
            readers[v].push(i);
        }
    }
    let mut skipped = HashSet::new();
    let mut alias = HashMap::new();
    for (i, e) in g.eqns.iter().enumerate() {
        if e.inputs.len() != 1 || e.outputs.len() != 1 || e.prim.planned() != Some(Planned::Reshape)
        {
            continue;
        }
        let (x, y) = (e.inputs[0], e.outputs[0]);
        let (xa, ya) = (&g.avals[x], &g.avals[y]);
        let fused_reads = !readers[y].is_empty()
            && readers[y].iter().all(|&j| {
                groups.of_eqn[j].is_some() && g.avals[g.eqns[j].outputs[0]].shape() == ya.shape()
            });
        if matches!(ya.dtype(), DType::F32 | DType::F64)
            && xa.dtype() == ya.dtype()
            && unit_axes_only(xa.shape(), ya.shape())
            && fused_reads
            && !g.outvars.contains(&y)
        {
            skipped.insert(i);
            alias.insert(y, x);
        }
    }
    (skipped, alias)
}
