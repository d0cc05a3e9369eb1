//! `jit`: trace once per distinct input avals, cache the graph, and run the
//! cached graph afterwards without re-tracing, through a plan built once
//! (see `crate::exec::set_planned_execution`): operand slots and last
//! uses resolved ahead, element-wise chains fused into blocked loops.

use super::make_graph;
use crate::error::Result;
use crate::exec::Plan;
use crate::graph::Graph;
use crate::tensor::{Aval, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A cached graph with its plan (`None` when it is not planned).
struct Compiled {
    graph: Arc<Graph>,
    plan: Option<Plan>,
}

impl Compiled {
    fn new(graph: Arc<Graph>) -> Arc<Compiled> {
        let plan = Plan::new(graph.clone());
        Arc::new(Compiled { graph, plan })
    }
    fn run(&self, args: Vec<Tensor>) -> Result<Vec<Tensor>> {
        match &self.plan {
            Some(p) if crate::exec::planned_execution() => p.run(args),
            _ => self.graph.eval(&args),
        }
    }
}

/// The program a [`Jit`] staged last, kept apart from the function it was
/// traced from (a learner keeps its step program across calls this way).
#[derive(Clone)]
pub(crate) struct Staged(Arc<Compiled>);

impl Staged {
    /// Whether `args` have the avals the program was staged for.
    pub(crate) fn accepts(&self, args: &[Tensor]) -> bool {
        accepts(&self.0.graph, args)
    }
    /// Run the program (as [`Jit::call_owned`] runs it).
    pub(crate) fn run(&self, args: Vec<Tensor>) -> Result<Vec<Tensor>> {
        self.0.run(args)
    }
}

/// A jitted function; call it with [`Jit::call`], or use the closure from [`jit`].
pub struct Jit<F> {
    f: F,
    cache: Mutex<HashMap<Vec<Aval>, Arc<Compiled>>>,
    /// The entry used last: a call with the same avals finds it without
    /// building a key.
    last: Mutex<Option<Arc<Compiled>>>,
    traces: std::sync::atomic::AtomicUsize,
}

impl<F> Jit<F>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    /// Wrap `f`.
    pub fn new(f: F) -> Self {
        Jit {
            f,
            cache: Mutex::new(HashMap::new()),
            last: Mutex::new(None),
            traces: std::sync::atomic::AtomicUsize::new(0),
        }
    }
    /// Run: trace on the first call with these avals, then reuse the graph.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        self.call_owned(args.to_vec())
    }
    /// [`Jit::call`] taking the arguments by value: an argument whose last
    /// handle is given here can have its buffer reused by the program.
    pub fn call_owned(&self, args: Vec<Tensor>) -> Result<Vec<Tensor>> {
        if crate::graph::is_tracing() {
            // Inside another transform's trace, splice in the graph as
            // traced, not lowered: the outer transform must see custom_jvp
            // calls (whose rule lowering would discard) and ETP equations.
            self.traces
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let key = crate::ops::avals(&args);
            return make_graph(&self.f, &key)?.eval(&args);
        }
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(c) = last.filter(|c| accepts(&c.graph, &args)) {
            return c.run(args);
        }
        let key = crate::ops::avals(&args);
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let c = match cached {
            Some(c) => c,
            None => {
                let mut g = make_graph(&self.f, &key)?.lower()?;
                // Staged programs often compute a value twice (a forward
                // pass and the primal of a JVP of it, or of a VJP with
                // respect to a zero perturbation): keep one.
                // And shape ops that move no values run as the planned
                // executor's own kernels (see `simplify`).
                let simplified = g.fold_constants()
                    + g.simplify_identities()
                    + super::simplify::unit_shape_ops(&mut g);
                if g.cse() + simplified > 0 {
                    g.dce();
                }
                let g = Arc::new(g);
                self.traces
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // A graph that captured tracers of an enclosing trace is only
                // valid inside that trace: use it once, do not cache it.
                if g.captures_tracers() {
                    return g.eval(&args);
                }
                let c = Compiled::new(g);
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, c.clone());
                c
            }
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        c.run(args)
    }
    /// The program staged by the last call that staged and cached one.
    pub(crate) fn staged(&self) -> Option<Staged> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.clone().map(Staged)
    }
    /// How many times the function has been traced.
    pub fn trace_count(&self) -> usize {
        self.traces.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// The cached graph for these avals, if traced.
    pub fn cached_graph(&self, avals: &[Aval]) -> Option<Arc<Graph>> {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(avals)
            .map(|c| c.graph.clone())
    }
}

/// Whether `args` have exactly `g`'s input avals (no allocation).
fn accepts(g: &Graph, args: &[Tensor]) -> bool {
    let ins = g.invars();
    args.len() == ins.len()
        && args.iter().zip(ins).all(|(t, &v)| {
            let a = g.aval(v);
            t.dtype() == a.dtype() && crate::tensor::same_shape(t.shape(), a.shape())
        })
}

/// Compile `f`: trace once per distinct input avals and cache.
///
/// ```
/// use braintrace_core::{jit, Tensor};
/// let f = jit(|a: &[Tensor]| Ok(vec![a[0].exp()?]));
/// let x = Tensor::from_vec(vec![0.0], &[1])?;
/// assert_eq!(f(&[x.clone()])?[0].to_vec_f64()?, vec![1.0]);
/// assert_eq!(f(&[x])?[0].to_vec_f64()?, vec![1.0]); // no re-trace
/// # Ok::<(), braintrace_core::Error>(())
/// ```
pub fn jit<F>(f: F) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let j = Jit::new(f);
    move |args: &[Tensor]| j.call(args)
}
