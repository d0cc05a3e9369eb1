//! Fusion: element-wise equations grouped into loops (which equations join
//! which group, and each group's program of block operations).

use super::*;
use crate::graph::BlockOp;

/// The variables a step reads from the environment.
pub(super) fn step_reads(step: &Step) -> Vec<VarId> {
    match step {
        Step::Eqn { inputs, .. } => inputs.iter().map(|&(v, _)| v).collect(),
        Step::Fused(f) => f
            .inputs
            .iter()
            .copied()
            .chain(f.scalars.iter().chain(&f.rows).map(|&(v, _)| v))
            .collect(),
    }
}

// ---------------------------------------------------------------- grouping

pub(super) struct Groups {
    /// The equations of each group, in order.
    pub(super) members: Vec<Vec<usize>>,
    /// The group of each equation (`None`: not fused).
    pub(super) of_eqn: Vec<Option<usize>>,
}

impl Groups {
    pub(super) fn last_member(&self, k: usize) -> usize {
        *self.members[k].last().expect("groups are never empty")
    }
}

/// The element-wise kernel of equation `i` if it can be fused: one float
/// output, at most [`MAX_ARITY`] operands of the output's dtype, each of
/// the output's shape, a single element, or broadcast to it
/// ([`broadcasts_to`]). (A product with a contraction of one,
/// [`outer_product`], is fused too, without a kernel of its own.)
pub(super) fn fusable(g: &Graph, i: usize) -> Option<&dyn Elementwise> {
    let e = &g.eqns[i];
    let k = e.prim.elementwise()?;
    if e.outputs.len() != 1 || e.inputs.len() != k.arity() || e.inputs.len() > MAX_ARITY {
        return None;
    }
    let out = &g.avals[e.outputs[0]];
    if !matches!(out.dtype(), DType::F32 | DType::F64) {
        return None;
    }
    let sh = out.shape();
    let ok = e.inputs.iter().all(|&v| {
        let a = &g.avals[v];
        // The output's shape, one element, or broadcast to it (a trailing
        // part of its shape, a row, or with axes of one).
        a.dtype() == out.dtype()
            && (a.shape() == sh || a.size() == 1 || broadcasts_to(a.shape(), sh))
    });
    ok.then_some(k)
}

/// The core op a primitive's element-wise kernel computes, as the
/// primitive says (see [`Elementwise::block_op`]).
fn block_op(p: &dyn Primitive) -> Option<BlockOp> {
    p.elementwise().and_then(|k| k.block_op())
}

/// The op of a binary element-wise primitive.
pub(super) fn binary_op(p: &dyn Primitive) -> Option<BinaryOp> {
    match block_op(p)? {
        BlockOp::Binary(b) => Some(b),
        _ => None,
    }
}

/// How a fused loop runs a (not folded) equation of primitive `p`.
pub(super) fn core_kind(p: &dyn Primitive) -> OpKind {
    match block_op(p) {
        Some(BlockOp::Unary(u)) => OpKind::Unary(u),
        Some(BlockOp::Binary(b)) => OpKind::Binary(b),
        Some(BlockOp::Scalar(op, value)) => OpKind::Scalar(op, value),
        Some(BlockOp::Surrogate(s)) => OpKind::Surrogate(s),
        None => OpKind::Eqn,
    }
}

/// The factor of a `mul_scalar` primitive.
pub(super) fn mul_scalar_of(p: &dyn Primitive) -> Option<f64> {
    match block_op(p)? {
        BlockOp::Scalar(ScalarOp::Mul, value) => Some(value),
        _ => None,
    }
}

pub(super) fn form_groups(g: &Graph) -> Groups {
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut of_eqn = vec![None; g.eqns.len()];
    let mut of_var: Vec<Option<usize>> = vec![None; g.avals.len()];
    // The open group of each (shape, dtype): the one new equations join.
    let mut open: HashMap<Aval, usize> = HashMap::new();
    let mut closed = Vec::new();
    for (i, e) in g.eqns.iter().enumerate() {
        let mine = if fusable(g, i).is_some() || outer_product(g, i) {
            let key = g.avals[e.outputs[0]].clone();
            let k = match open.get(&key) {
                Some(&k) => k,
                None => {
                    members.push(Vec::new());
                    closed.push(false);
                    open.insert(key, members.len() - 1);
                    members.len() - 1
                }
            };
            Some(k)
        } else {
            None
        };
        // A group whose value is read from outside runs before the reader:
        // it can grow no further.
        for &v in &e.inputs {
            if let Some(k) = of_var[v] {
                if Some(k) != mine && !closed[k] {
                    closed[k] = true;
                    open.retain(|_, &mut o| o != k);
                }
            }
        }
        if let Some(k) = mine {
            members[k].push(i);
            of_eqn[i] = Some(k);
            of_var[e.outputs[0]] = Some(k);
        }
    }
    Groups { members, of_eqn }
}

/// Lay out one group: operand sources, block buffers (reused once a value
/// is dead within the group) and the values to materialise (written
/// straight into their output buffers, and read back from there). An
/// input in `alias` is read from its entry ([`aliased_reshapes`]); a
/// result in `sums` is added into that sum's result ([`leading_sums`]).
pub(super) fn build_fused(
    g: &Graph,
    members: &[usize],
    alias: &HashMap<VarId, VarId>,
    sums: &HashMap<VarId, usize>,
) -> Fused {
    let out_aval = &g.avals[g.eqns[members[0]].outputs[0]];
    let in_group: HashMap<VarId, usize> = members
        .iter()
        .enumerate()
        .map(|(j, &i)| (g.eqns[i].outputs[0], j))
        .collect();
    // A result is materialised when anything outside the group reads it.
    let member_set: std::collections::HashSet<usize> = members.iter().copied().collect();
    let mut read_outside = vec![false; g.avals.len()];
    for (i, e) in g.eqns.iter().enumerate() {
        if !member_set.contains(&i) {
            for &v in &e.inputs {
                read_outside[v] = true;
            }
        }
    }
    for &v in &g.outvars {
        read_outside[v] = true;
    }
    // Pairs: a `mul` or `mul_scalar` whose result only an `add` of the
    // group reads runs inside the add's loop (one pass over the block
    // instead of two, and no buffer for the product).
    let mut reads_in_group: HashMap<VarId, usize> = HashMap::new();
    for &i in members {
        for &v in &g.eqns[i].inputs {
            *reads_in_group.entry(v).or_default() += 1;
        }
    }
    let mut folded = vec![false; members.len()];
    let mut pair: Vec<Option<(OpKind, Vec<VarId>)>> = vec![None; members.len()];
    for (j, &i) in members.iter().enumerate() {
        let e = &g.eqns[i];
        if binary_op(e.prim.as_ref()) != Some(BinaryOp::Add) {
            continue;
        }
        for (slot, &v) in e.inputs.iter().enumerate() {
            let Some(&p) = in_group.get(&v) else {
                continue;
            };
            if folded[p] || read_outside[v] || reads_in_group[&v] != 1 {
                continue;
            }
            let pe = &g.eqns[members[p]];
            let other = e.inputs[1 - slot];
            let kind = match (is_product(g, members[p]), mul_scalar_of(pe.prim.as_ref())) {
                (true, _) => (OpKind::MulAdd, vec![pe.inputs[0], pe.inputs[1], other]),
                (_, Some(s)) => (OpKind::ScaleAdd(s), vec![pe.inputs[0], other]),
                _ => continue,
            };
            folded[p] = true;
            pair[j] = Some(kind);
            break;
        }
    }
    // What each op reads: its equation's operands, or a pair's.
    let reads: Vec<Vec<VarId>> = members
        .iter()
        .zip(&pair)
        .map(|(&i, p)| match p {
            Some((_, r)) => r.clone(),
            None => g.eqns[i].inputs.clone(),
        })
        .collect();
    // Last use (position in the group) of each value read inside it.
    let mut last_in_group: HashMap<VarId, usize> = HashMap::new();
    for (j, r) in reads.iter().enumerate() {
        if !folded[j] {
            for &v in r {
                last_in_group.insert(v, j);
            }
        }
    }
    let mut inputs: Vec<VarId> = Vec::new();
    // Broadcast operands first: their buffers are filled before the
    // group's equations run on a block and live for the whole group, so no
    // result may ever be written into them.
    let mut scalars: Vec<(VarId, usize)> = Vec::new();
    let mut rows: Vec<VarId> = Vec::new();
    for &i in members {
        for &v in &g.eqns[i].inputs {
            let external = !in_group.contains_key(&v);
            if external && g.avals[v].shape() != out_aval.shape() {
                if g.avals[v].size() == 1 {
                    if !scalars.iter().any(|&(w, _)| w == v) {
                        scalars.push((v, scalars.len()));
                    }
                } else if !rows.contains(&v) {
                    rows.push(v);
                }
            }
        }
    }
    let rows: Vec<(VarId, usize)> = rows
        .into_iter()
        .enumerate()
        .map(|(k, v)| (v, scalars.len() + k))
        .collect();
    // Where each group value lives: a block buffer, or its output.
    let mut loc_of: HashMap<VarId, Operand> = HashMap::new();
    let mut free: Vec<usize> = Vec::new();
    let mut nbufs = scalars.len() + rows.len();
    let mut ops = Vec::new();
    let mut outputs = Vec::new();
    let mut sum_outs = Vec::new();
    let mut names = Vec::new();
    for (j, &i) in members.iter().enumerate() {
        let e = &g.eqns[i];
        names.push(e.prim.name());
        if folded[j] {
            continue;
        }
        let mut operands = Vec::new();
        for &v in &reads[j] {
            let op = if in_group.contains_key(&v) {
                loc_of[&v]
            } else if g.avals[v].shape() == out_aval.shape() {
                let v = alias.get(&v).copied().unwrap_or(v);
                let k = inputs.iter().position(|&w| w == v).unwrap_or_else(|| {
                    inputs.push(v);
                    inputs.len() - 1
                });
                Operand::Input(k)
            } else {
                let &(_, b) = scalars
                    .iter()
                    .chain(&rows)
                    .find(|&&(w, _)| w == v)
                    .expect("broadcast operands collected above");
                Operand::Buf(b)
            };
            operands.push(op);
        }
        let out = e.outputs[0];
        let sum = sums.get(&out).map(|&r| {
            let z = g.eqns[r].outputs[0];
            sum_outs.push(SumOut { var: z });
            names.push(g.eqns[r].prim.name());
            sum_outs.len() - 1
        });
        let dst = if read_outside[out] && sum.is_none() {
            outputs.push(out);
            Operand::Out(outputs.len() - 1)
        } else {
            // Taken before the operands' buffers are freed: a kernel
            // never writes into its operand.
            Operand::Buf(free.pop().unwrap_or_else(|| {
                nbufs += 1;
                nbufs - 1
            }))
        };
        loc_of.insert(out, dst);
        ops.push(FusedOp {
            eqn: i,
            kind: pair[j].as_ref().map_or_else(|| op_kind(g, i), |p| p.0),
            operands,
            dst,
            sum,
        });
        // Free the buffers of group values read for the last time here.
        let mut dead: Vec<VarId> = reads[j]
            .iter()
            .copied()
            .filter(|v| in_group.contains_key(v) && last_in_group.get(v) == Some(&j))
            .collect();
        if !last_in_group.contains_key(&out) {
            dead.push(out);
        }
        dead.sort_unstable();
        dead.dedup();
        for v in dead {
            if let Operand::Buf(b) = loc_of[&v] {
                free.push(b);
            }
        }
    }
    let label = (format!("fused[{}]", names.join(",")), out_aval.to_string());
    let mut f = Fused {
        members: members.len(),
        shape: out_aval.shape().to_vec(),
        dtype: out_aval.dtype(),
        size: out_aval.size(),
        inputs,
        scalars,
        spreads: spreads(g, &rows, out_aval.shape()),
        rows,
        ops,
        outputs,
        sums: sum_outs,
        nbufs,
        label,
        compiled: None,
        constants_f32: Vec::new(),
        constants_f64: Vec::new(),
    };
    // (The generated loops take no sums.)
    f.compiled = if f.sums.is_empty() {
        codegen::compile(&f)
    } else {
        None
    };
    if f.compiled.is_some() {
        match f.dtype {
            DType::F64 => f.constants_f64 = codegen::constants(&f),
            _ => f.constants_f32 = codegen::constants(&f),
        }
    }
    f
}
