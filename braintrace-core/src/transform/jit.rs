//! `jit`: trace once per distinct input avals, cache the graph, and run the
//! cached graph afterwards without re-tracing.

use super::make_graph;
use crate::error::Result;
use crate::graph::Graph;
use crate::tensor::{Aval, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A jitted function; call it with [`Jit::call`], or use the closure from [`jit`].
pub struct Jit<F> {
    f: F,
    cache: Mutex<HashMap<Vec<Aval>, Arc<Graph>>>,
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
            traces: std::sync::atomic::AtomicUsize::new(0),
        }
    }
    /// Run: trace on the first call with these avals, then reuse the graph.
    pub fn call(&self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let key = crate::ops::avals(args);
        if crate::graph::is_tracing() {
            // Inside another transform's trace, splice in the graph as
            // traced, not lowered: the outer transform must see custom_jvp
            // calls (whose rule lowering would discard) and ETP equations.
            self.traces
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return make_graph(&self.f, &key)?.eval(args);
        }
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let g = match cached {
            Some(g) => g,
            None => {
                let mut g = make_graph(&self.f, &key)?.lower()?;
                // Staged programs often compute a value twice (a forward
                // pass and the primal of a JVP of it): keep one.
                if g.cse() > 0 {
                    g.dce();
                }
                let g = Arc::new(g);
                self.traces
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // A graph that captured tracers of an enclosing trace is only
                // valid inside that trace: use it once, do not cache it.
                if g.captures_tracers() {
                    return g.eval(args);
                }
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, g.clone());
                g
            }
        };
        g.eval(args)
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
            .cloned()
    }
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
