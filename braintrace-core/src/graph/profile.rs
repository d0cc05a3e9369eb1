//! An opt-in per-op profile of graph execution: time and count per
//! (primitive, input shapes), summed over every concrete evaluation of a
//! graph (the planned executor behind [`crate::Jit`] and [`Graph::eval`]
//! outside a trace). Off by default; when off it costs one relaxed atomic
//! load per graph evaluation.
//!
//! ```
//! use braintrace_core::graph::profile;
//! use braintrace_core::{jit, Tensor};
//! let f = jit(|a: &[Tensor]| Ok(vec![a[0].exp()?.mul(&a[0])?]));
//! let x = Tensor::from_vec(vec![1.0, 2.0], &[2])?;
//! profile::reset();
//! profile::set_enabled(true);
//! f(&[x])?;
//! profile::set_enabled(false);
//! let rows = profile::report();
//! assert_eq!(rows.iter().map(|r| r.count).sum::<u64>(), 1); // exp and mul run as one fused loop
//! # Ok::<(), braintrace_core::Error>(())
//! ```
//!
//! [`Graph::eval`]: super::Graph::eval

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// op -> operand shapes -> the time of every run; nested so that a lookup
/// by `&str` allocates nothing.
type Table = HashMap<String, HashMap<String, Vec<Duration>>>;

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// One row of the profile: an op (or a fused group of element-wise ops) on
/// operands of given shapes, how often it ran and for how long in total.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileRow {
    /// The primitive's name, or `fused[...]` with the names of a fused
    /// group's equations.
    pub op: String,
    /// The operands' avals and the results' (`f32[16,128] f32[128,384] ->
    /// f32[16,384]`); for a fused group, the aval of its loop.
    pub shapes: String,
    /// How many times it ran.
    pub count: u64,
    /// Total time spent in it.
    pub total: Duration,
    /// The median time of one run: on a loaded machine, where a run now and
    /// then includes time the thread was not scheduled, `median * count` is
    /// a steadier estimate of the op's cost than `total`.
    pub median: Duration,
}

/// Turn the profile on or off (process-wide).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the profile is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Forget every recorded time.
pub fn reset() {
    table().lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The recorded rows, the most expensive (total time) first.
pub fn report() -> Vec<ProfileRow> {
    let t = table().lock().unwrap_or_else(|e| e.into_inner());
    let mut rows: Vec<ProfileRow> = t
        .iter()
        .flat_map(|(op, by_shape)| {
            by_shape.iter().map(move |(shapes, runs)| {
                let mut sorted = runs.clone();
                sorted.sort_unstable();
                ProfileRow {
                    op: op.clone(),
                    shapes: shapes.clone(),
                    count: runs.len() as u64,
                    total: runs.iter().sum(),
                    median: sorted.get(sorted.len() / 2).copied().unwrap_or_default(),
                }
            })
        })
        .collect();
    rows.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.op.cmp(&b.op)));
    rows
}

/// Add one run of `op` on `shapes` that took `d`.
pub(crate) fn record(op: &str, shapes: &str, d: Duration) {
    let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
    if !t.contains_key(op) {
        t.insert(op.to_string(), HashMap::new());
    }
    let by_shape = t.get_mut(op).expect("inserted above");
    if let Some(runs) = by_shape.get_mut(shapes) {
        runs.push(d);
    } else {
        by_shape.insert(shapes.to_string(), vec![d]);
    }
}

/// The printed operand avals of an equation, as the profile keys them.
pub(crate) fn shapes_label<'a>(avals: impl IntoIterator<Item = &'a crate::tensor::Aval>) -> String {
    avals
        .into_iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}
