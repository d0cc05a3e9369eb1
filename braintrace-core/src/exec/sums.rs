//! Sums over leading axes taken by the fused loop that computes their
//! operand: `Σ_b (ε ⊙ g)[b, ..]` (D-RTRL's solve over a batch) is added up
//! block by block into the sum's result while the loop runs, and the
//! operand, which nothing else reads, is never written out. The rows are
//! added in the order `reduce_sum` adds them (the first row copied, each
//! next one added in turn), so the result is the same bits.

use super::*;

/// A sum a fused loop takes: its result (as many elements as a row of
/// the loop, the kept axes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SumOut {
    pub(super) var: VarId,
}

/// The sums the fused loops take, by the value summed: a `reduce_sum` over
/// leading axes `0..k` (into more than one result, or of axes of one: a
/// sum into one result adds in another order) of a float result of a fused group that nothing else
/// outside the group reads and the graph does not return. Returns them
/// (value → the sum's equation) and the equations the plan then skips.
pub(super) fn leading_sums(g: &Graph, groups: &Groups) -> (HashMap<VarId, usize>, HashSet<usize>) {
    let mut producer = vec![usize::MAX; g.avals.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.avals.len()];
    for (i, e) in g.eqns.iter().enumerate() {
        for &v in &e.outputs {
            producer[v] = i;
        }
        for &v in &e.inputs {
            readers[v].push(i);
        }
    }
    let mut sums = HashMap::new();
    let mut skipped = HashSet::new();
    for (i, e) in g.eqns.iter().enumerate() {
        let Some(Planned::Sum { axes }) = e.prim.planned() else {
            continue;
        };
        if e.inputs.len() != 1 || e.outputs.len() != 1 {
            continue;
        }
        let y = e.inputs[0];
        let (ya, za) = (&g.avals[y], &g.avals[e.outputs[0]]);
        let k = axes.len();
        let leading = axes.iter().enumerate().all(|(j, &a)| a == j);
        let lead: usize = ya.shape()[..k.min(ya.ndim())].iter().product();
        let p = producer[y];
        let Some(grp) = (p != usize::MAX).then(|| groups.of_eqn[p]).flatten() else {
            continue;
        };
        // Read by this sum alone outside the group (any number of times
        // inside it).
        let outside = readers[y]
            .iter()
            .filter(|&&j| groups.of_eqn[j] != Some(grp))
            .all(|&j| j == i)
            && readers[y].iter().filter(|&&j| j == i).count() == 1;
        if leading
            && k >= 1
            && k < ya.ndim()
            && (lead == 1 || za.size() > 1)
            && za.dtype() == ya.dtype()
            && outside
            && !g.outvars.contains(&y)
            && !sums.contains_key(&y)
        {
            sums.insert(y, i);
            skipped.insert(i);
        }
    }
    (sums, skipped)
}

/// Add block `[start, start + v.len())` of a loop (row-major) into the
/// sum `acc` of its rows of `acc.len()` elements: the first row's
/// elements copied, the others' added.
pub(super) fn add_rows<T: PoolFloat>(acc: &mut [T], v: &[T], start: usize) {
    let n = acc.len();
    let mut p = 0;
    while p < v.len() {
        let (row, col) = ((start + p) / n, (start + p) % n);
        let len = (n - col).min(v.len() - p);
        let (dst, src) = (&mut acc[col..col + len], &v[p..p + len]);
        if row == 0 {
            dst.copy_from_slice(src);
        } else {
            for (a, &x) in dst.iter_mut().zip(src) {
                *a = *a + x;
            }
        }
        p += len;
    }
}
