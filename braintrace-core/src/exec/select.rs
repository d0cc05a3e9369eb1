//! Kernel selection: how the plan runs each equation that is not fused
//! (a planned matrix product, a layout change, a join, a sum, or `eval`).

use super::*;

/// How equation `i` is planned (it is not fused).
/// How the plan runs equation `i`; a product whose right operand is a
/// program input or constant takes the next of `panel_slots`.
pub(super) fn kernel_of(g: &Graph, i: usize, panel_slots: &mut usize) -> Kernel {
    let e = &g.eqns[i];
    let float = |v: &VarId| matches!(g.avals[*v].dtype(), DType::F32 | DType::F64);
    if planned_matmul(g, i) {
        let right = e.inputs[1];
        let kept = g.invars.contains(&right) || g.constvars.contains(&right);
        let panels = kept.then(|| next_slot(panel_slots));
        return Kernel::Matmul {
            panels,
            transposed: false,
        };
    }
    let planned = e.prim.planned();
    if let Some(Planned::Transpose { perm }) = planned {
        let r = g.avals[e.inputs[0]].ndim();
        let mut seen = vec![false; r];
        let permutation = perm.len() == r
            && perm
                .iter()
                .all(|&k| k < r && !std::mem::replace(&mut seen[k], true));
        if e.inputs.len() == 1 && e.outputs.len() == 1 && float(&e.inputs[0]) && permutation {
            return Kernel::Transpose;
        }
    }
    if let Some(Planned::Concat { axis }) = planned {
        let dtype = g.avals[e.outputs[0]].dtype();
        if e.outputs.len() == 1
            && !e.inputs.is_empty()
            && float(&e.outputs[0])
            && e.inputs.iter().all(|&v| g.avals[v].dtype() == dtype)
            && axis < g.avals[e.outputs[0]].ndim()
        {
            return Kernel::Concat { axis };
        }
    }
    if e.inputs.len() == 1
        && e.outputs.len() == 1
        && matches!(planned, Some(Planned::Sum { .. }))
        && float(&e.inputs[0])
        && g.avals[e.outputs[0]].dtype() == g.avals[e.inputs[0]].dtype()
        && g.avals[e.outputs[0]].size() == 1
    {
        return Kernel::SumAll;
    }
    if e.inputs.len() == 1
        && e.outputs.len() == 1
        && planned == Some(Planned::Reshape)
        && float(&e.inputs[0])
        && g.avals[e.inputs[0]].size() == g.avals[e.outputs[0]].size()
    {
        return Kernel::Reshape;
    }
    Kernel::Eval
}

/// The next free slot of [`Pool::panels`] (`slots` counts those taken).
pub(super) fn next_slot(slots: &mut usize) -> usize {
    *slots += 1;
    *slots - 1
}

/// Whether equation `i` is a product the plan runs itself
/// ([`Kernel::Matmul`]): two 2-D float operands of one dtype, at most
/// [`MAX_PLANNED_MATMUL`] results, and a contraction longer than one (an
/// outer product is fused, see [`outer_product`]).
pub(super) fn planned_matmul(g: &Graph, i: usize) -> bool {
    let e = &g.eqns[i];
    !outer_product(g, i)
        && e.inputs.len() == 2
        && e.outputs.len() == 1
        && e.prim.planned() == Some(Planned::Matmul)
        && e.inputs.iter().all(|&v| {
            g.avals[v].ndim() == 2 && matches!(g.avals[v].dtype(), DType::F32 | DType::F64)
        })
        && g.avals[e.inputs[0]].dtype() == g.avals[e.inputs[1]].dtype()
        && g.avals[e.outputs[0]].size() <= MAX_PLANNED_MATMUL
}

/// The transposes the plan does not run: `r = transpose(w)` (2-D) of a
/// program input or constant `w`, read only once, as the right operand of
/// a product planned as [`Kernel::Matmul`] (`x @ wᵀ`, a readout's backward
/// pass). That product reads `w` itself and multiplies by `wᵀ`: its
/// [`sgemm`] panels are packed from `w`'s transposed view and kept from
/// call to call like a weight's, instead of a copy of `wᵀ` and its packing
/// on every call. Returns the elided transposes and, per product, its `w`.
pub(super) fn elided_transposes(g: &Graph) -> (HashSet<usize>, HashMap<usize, VarId>) {
    let mut reads = vec![0usize; g.avals.len()];
    let mut reader = vec![usize::MAX; g.avals.len()];
    for (i, e) in g.eqns.iter().enumerate() {
        for &v in &e.inputs {
            reads[v] += 1;
            reader[v] = i;
        }
    }
    for &v in &g.outvars {
        reads[v] += 1;
    }
    let mut elided = HashSet::new();
    let mut weight_t = HashMap::new();
    for (i, e) in g.eqns.iter().enumerate() {
        let Some(Planned::Transpose { perm }) = e.prim.planned() else {
            continue;
        };
        if e.inputs.len() != 1 || e.outputs.len() != 1 || perm != [1, 0] {
            continue;
        }
        let (w, r) = (e.inputs[0], e.outputs[0]);
        let kept = g.invars.contains(&w) || g.constvars.contains(&w);
        // Read once, and by an equation (not only as a result).
        let j = reader[r];
        if !kept || reads[r] != 1 || j == usize::MAX || g.avals[w].ndim() != 2 {
            continue;
        }
        let m = &g.eqns[j];
        if planned_matmul(g, j) && m.inputs[1] == r && m.inputs[0] != r {
            elided.insert(i);
            weight_t.insert(j, w);
        }
    }
    (elided, weight_t)
}
