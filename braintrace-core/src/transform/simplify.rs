//! Unit-shape simplifications of a staged graph, run by [`Jit`](super::Jit)
//! before it plans the graph: shape ops that move no values are replaced
//! by what the planned executor runs without calling `eval` (each `eval`
//! call allocates its operands' avals, its result list and its result).
//!
//! * A sum over axes of size 1 only (a bias gradient at batch 1, the
//!   transpose of a broadcast over a unit axis) is a reshape: the same
//!   elements in the same order, which the core sum also returns as they
//!   are (`kernels::reduce::sum_axes` copies them). So is a transpose
//!   that moves only axes of size 1 (`(1, n)` to `(n, 1)`, the outer
//!   product of a weight gradient at batch 1). Both are recognised by what
//!   the primitive declares ([`Planned`]), not by its type.
//! * A broadcast of a single element read only by a one-operand
//!   element-wise equation is moved after it (the equation then computes
//!   one element, the value every element of its result had).
//! * A broadcast of a single element read by an element-wise equation
//!   whose result keeps its avals when given the element itself (the other
//!   operand has the result's shape: a loss's seed broadcast in a reverse
//!   pass, times the loss's derivative) is read as that element:
//!   element-wise primitives broadcast single elements themselves (the
//!   fused loops read them as scalars), so every result element is the
//!   same value. The broadcast is then left to dead-code elimination.
//!
//! All are exact: no value changes, bit for bit.

use crate::graph::{Graph, Planned, VarId};
use crate::ops::shape::Reshape;
use crate::tensor::Aval;
use std::sync::Arc;

/// Apply the simplifications of the module docs to `g`; how many
/// equations or operands changed (the caller runs dead-code elimination).
pub(crate) fn unit_shape_ops(g: &mut Graph) -> usize {
    let mut changed = sums_to_reshapes(g);
    // Each pass moves a broadcast one equation on.
    loop {
        let moved = move_broadcasts(g);
        changed += moved;
        if moved == 0 {
            break;
        }
    }
    changed + read_elements(g)
}

/// The one operand of equation `e` when it is a broadcast of a single
/// element.
fn single_broadcast(g: &Graph, e: usize) -> Option<VarId> {
    let e = &g.eqns[e];
    let one = e.inputs.len() == 1 && e.outputs.len() == 1;
    (one && e.prim.planned() == Some(Planned::Broadcast) && g.avals[e.inputs[0]].size() == 1)
        .then(|| e.inputs[0])
}

fn sums_to_reshapes(g: &mut Graph) -> usize {
    let (avals, eqns) = (&g.avals, &mut g.eqns);
    let mut changed = 0;
    for e in eqns.iter_mut() {
        if e.inputs.len() != 1 || e.outputs.len() != 1 {
            continue;
        }
        let (x, y) = (&avals[e.inputs[0]], &avals[e.outputs[0]]);
        let same_order = match e.prim.planned() {
            // As many elements after the sum as before: only unit axes
            // were summed.
            Some(Planned::Sum { .. }) => x.size() == y.size(),
            // Only unit axes move: the others keep their order.
            Some(Planned::Transpose { perm }) => {
                let moved: Vec<usize> = perm
                    .iter()
                    .copied()
                    .filter(|&a| x.shape().get(a).is_some_and(|&d| d != 1))
                    .collect();
                moved.windows(2).all(|w| w[0] < w[1])
            }
            _ => false,
        };
        if same_order && x.dtype() == y.dtype() {
            e.prim = Arc::new(Reshape {
                shape: y.shape().to_vec(),
            });
            changed += 1;
        }
    }
    changed
}

/// `z = u(broadcast(s))` → `z = broadcast(u(s))` for a one-operand
/// element-wise `u` and a broadcast read by nothing else.
fn move_broadcasts(g: &mut Graph) -> usize {
    let n = g.avals.len();
    let mut reads = vec![0usize; n];
    for e in &g.eqns {
        for &v in &e.inputs {
            reads[v] += 1;
        }
    }
    for &v in &g.outvars {
        reads[v] += 1;
    }
    let mut made_by = vec![None; n];
    for i in 0..g.eqns.len() {
        if single_broadcast(g, i).is_some() {
            made_by[g.eqns[i].outputs[0]] = Some(i);
        }
    }
    let mut moved = 0;
    for j in 0..g.eqns.len() {
        let e = &g.eqns[j];
        if e.prim.elementwise().is_none() || e.inputs.len() != 1 || e.outputs.len() != 1 {
            continue;
        }
        let (b, z) = (e.inputs[0], e.outputs[0]);
        let Some(i) = made_by[b].filter(|_| reads[b] == 1) else {
            continue;
        };
        let s = g.eqns[i].inputs[0];
        // `u` on the element: one element of `z`'s dtype; the broadcast of
        // it: `z`'s avals.
        let Ok(t) = e.prim.abstract_eval(std::slice::from_ref(&g.avals[s])) else {
            continue;
        };
        let [t]: [Aval; 1] = match t.try_into() {
            Ok(t) => t,
            Err(_) => continue,
        };
        if t.size() != 1 || t.dtype() != g.avals[z].dtype() {
            continue;
        }
        let back = g.eqns[i].prim.abstract_eval(std::slice::from_ref(&t));
        if !matches!(back, Ok(o) if o.len() == 1 && o[0] == g.avals[z]) {
            continue;
        }
        g.avals[b] = t;
        let (u, bc) = (g.eqns[j].prim.clone(), g.eqns[i].prim.clone());
        g.eqns[i].prim = u;
        g.eqns[j].prim = bc;
        made_by[b] = None;
        made_by[z] = Some(j);
        moved += 1;
    }
    moved
}

/// Element-wise equations read the element of a single-element broadcast
/// when their result keeps its avals.
fn read_elements(g: &mut Graph) -> usize {
    let single: Vec<Option<VarId>> = {
        let mut v = vec![None; g.avals.len()];
        for i in 0..g.eqns.len() {
            if let Some(s) = single_broadcast(g, i) {
                v[g.eqns[i].outputs[0]] = Some(s);
            }
        }
        v
    };
    let (avals, eqns) = (&g.avals, &mut g.eqns);
    let mut changed = 0;
    for e in eqns.iter_mut() {
        if e.prim.elementwise().is_none() || e.outputs.len() != 1 {
            continue;
        }
        for k in 0..e.inputs.len() {
            let Some(s) = single[e.inputs[k]] else {
                continue;
            };
            let mut given: Vec<Aval> = e.inputs.iter().map(|&v| avals[v].clone()).collect();
            given[k] = avals[s].clone();
            let same = matches!(
                e.prim.abstract_eval(&given),
                Ok(o) if o.len() == 1 && o[0] == avals[e.outputs[0]]
            );
            if same {
                e.inputs[k] = s;
                changed += 1;
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::ops::shape::broadcast_in_dim;
    use crate::tensor::{DType, Tensor};
    use crate::transform::{jit, make_graph};

    /// `a` `(1, 4)`, `s` `()`, `m` `(3, 4)`: the unit-shape cases and the
    /// ones that must stay.
    fn f(a: &[Tensor]) -> Result<Vec<Tensor>> {
        let (x, s, m) = (&a[0], &a[1], &a[2]);
        let seed = broadcast_in_dim(s, &[1, 4], &[])?;
        // Moved past `mul_scalar` and `neg`, then read as the element.
        let d = seed.mul_scalar(2.0)?.neg()?.mul(x)?;
        // Kept (a result): moved past `exp` only.
        let e = broadcast_in_dim(s, &[1, 4], &[])?.exp()?;
        // Not single elements: kept.
        let rows = broadcast_in_dim(&x.reshape(&[4])?, &[3, 4], &[1])?.mul(m)?;
        Ok(vec![
            d,
            e,
            rows,
            x.sum(&[0])?,          // unit axis: a reshape
            x.transpose(&[1, 0])?, // unit axis moves: a reshape
            m.sum(&[0])?,          // kept
            m.transpose(&[1, 0])?, // kept
            m.sum(&[0, 1])?,       // kept (planned as a sum to one value)
        ])
    }

    fn bits(v: &[Tensor]) -> Vec<(Vec<usize>, Vec<u64>)> {
        v.iter()
            .map(|t| {
                let b = t
                    .to_vec_f64()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                (t.shape().to_vec(), b)
            })
            .collect()
    }

    fn args(dtype: DType) -> Vec<Tensor> {
        let x = vec![-0.0, 1.5e-310, -3.25, 7.0];
        let m: Vec<f64> = (0..12).map(|i| (i as f64 - 5.5) / 3.0).collect();
        vec![
            Tensor::from_vec(x, &[1, 4]).unwrap().cast(dtype).unwrap(),
            Tensor::scalar_of(-0.3, dtype),
            Tensor::from_vec(m, &[3, 4]).unwrap().cast(dtype).unwrap(),
        ]
    }

    #[test]
    fn unit_shape_ops_are_replaced_and_nothing_else() {
        let a = args(DType::F64);
        let avals: Vec<_> = a.iter().map(Tensor::aval).collect();
        let g0 = make_graph(f, &avals).unwrap();
        let mut g = g0.clone();
        let changed = unit_shape_ops(&mut g);
        g.dce();
        g.validate().unwrap();
        assert!(changed > 0);
        let count =
            |g: &Graph, name: &str| g.eqns().iter().filter(|e| e.prim().name() == name).count();
        // Of three broadcasts, the non-single one and the one behind `exp`
        // (a result) are left; two of four sums and transposes are left.
        assert_eq!(count(&g0, "broadcast_in_dim"), 3);
        assert_eq!(count(&g, "broadcast_in_dim"), 2);
        assert_eq!(count(&g0, "reduce_sum"), 3);
        assert_eq!(count(&g, "reduce_sum"), 2);
        assert_eq!(count(&g0, "transpose"), 2);
        assert_eq!(count(&g, "transpose"), 1);
        // `exp` now runs on the one element.
        let exp = g.eqns().iter().find(|e| e.prim().name() == "exp").unwrap();
        assert_eq!(g.avals[exp.outputs[0]].shape(), &[] as &[usize]);
        // And the results did not change, bit for bit (signed zero and a
        // subnormal included).
        assert_eq!(bits(&g.eval(&a).unwrap()), bits(&g0.eval(&a).unwrap()));
    }

    #[test]
    fn a_jitted_program_returns_the_unsimplified_graphs_bits() {
        for dtype in [DType::F32, DType::F64] {
            let a = args(dtype);
            let avals: Vec<_> = a.iter().map(Tensor::aval).collect();
            let want = make_graph(f, &avals).unwrap().eval(&a).unwrap();
            let j = jit(f);
            for _ in 0..3 {
                let got = j(&a).unwrap();
                assert_eq!(bits(&got), bits(&want), "{dtype:?}");
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.aval(), w.aval());
                }
            }
        }
    }
}
