//! Fused element-wise groups compiled to machine code when a step is
//! planned (Cranelift): one loop per group, every value of an element in
//! registers. **Off by default**: measured, the block interpreter is
//! faster (below).
//!
//! The block interpreter runs a group op by op over blocks of elements,
//! each op loading its operands from block buffers and storing its result
//! into one. Here a group ([`key::resolve`]) is lowered to one loop
//! ([`lower`]) that computes each op with the same operations in the same
//! order as its block kernel ([`math`]: `fastmath`'s polynomials with the
//! same fused multiply-adds, the surrogate gradients, `max`/`min` as Rust
//! compiles them; libm functions called lane by lane), so the results are
//! the block interpreter's bits (the tests compare them on random groups
//! over every op and on the bench models). Compiled loops are cached
//! process-wide by the group's [`key::key`] (ops and wiring; constants are
//! an argument), so a second plan of the same group does not compile
//! again, and groups that differ only in constants share a loop. A group
//! the generator does not compile (a primitive's own kernel, a single op,
//! a target without FMA or not supported by Cranelift) runs through the
//! block interpreter: the generator is never why a plan fails.
//!
//! Why off: Cranelift 0.135's x86 backend has 128-bit vectors only (4
//! `f32` lanes), while the block kernels run 16 lanes (AVX-512) or 8
//! (AVX2). On this machine (AVX-512), GRU pp_prop `128 × 64`, one core,
//! `bench_learn --profile`, alternating runs: the largest group (22 ops
//! and a `tanh`, `f32[64,128]`) 32 µs compiled (unrolled 1×; 31–44 µs 2×)
//! against 13 µs op by op; `[add,logistic,add,logistic,mul]` 23 against
//! 8; even `[mul_scalar,add,mul_scalar,add]` 5.4–5.8 against 2.8. The
//! loops compiled ahead of time for the bench models by Rust (AVX-512, the
//! same bits) took 7.7, 6.7 and 2.7 µs, but only for those models.
//! `BRAINTRACE_CODEGEN=1` turns the generator on (`0` off);
//! `BRAINTRACE_CODEGEN_UNROLL` sets its vectors per iteration.

mod jit;
mod key;
mod lower;
mod math;
#[cfg(test)]
mod tests;

pub(super) use key::{constants, MAX_INS, MAX_OUTS};

use super::Fused;
use crate::tensor::DType;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A compiled group's loop: its code's address and the operand counts it
/// was compiled for (checked on every call: see `buffer::run_compiled`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Kernel {
    addr: usize,
    dtype: DType,
    n_ins: usize,
    n_outs: usize,
    n_consts: usize,
}

impl Kernel {
    /// The entry of the finalised loop. Only this module makes a `Kernel`
    /// (its fields are private), so the address is always one it compiled,
    /// for [`Kernel::dtype`] and these operand counts.
    pub(super) fn addr(&self) -> usize {
        self.addr
    }
    /// The element type the loop was compiled for.
    pub(super) fn dtype(&self) -> DType {
        self.dtype
    }
    /// Inputs (external, then broadcast buffers), outputs and constants the
    /// loop reads and writes.
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        (self.n_ins, self.n_outs, self.n_consts)
    }
}

/// Compiled loops by key (`None`: the generator refused the group).
type Cache = HashMap<String, Option<usize>>;

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

#[cfg(test)]
thread_local! {
    /// While `Some`: the key of every group this thread resolved, and
    /// whether it got a compiled loop (tests).
    static RECORD: std::cell::RefCell<Option<Vec<(String, bool)>>> =
        const { std::cell::RefCell::new(None) };
    /// Groups this thread compiled (not found in the cache).
    static COMPILED_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether plans compile their groups by default (see the module docs for
/// the measurements behind it).
const DEFAULT_ON: bool = false;

/// Whether the generator is on: `BRAINTRACE_CODEGEN=1` or `0` in the
/// environment turns it on or off (the tests always have it on), else
/// [`DEFAULT_ON`]; and only where the target has fused multiply-adds.
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let asked = match std::env::var("BRAINTRACE_CODEGEN").as_deref() {
            Ok("0") => false,
            Ok("1") => true,
            _ => cfg!(test) || DEFAULT_ON,
        };
        asked && jit::has_fma()
    })
}

/// The group's compiled loop: from the cache, else compiled now; `None`
/// for a group the generator does not compile.
pub(super) fn compile(f: &Fused) -> Option<Kernel> {
    if !enabled() {
        return None;
    }
    let r = key::resolve(f)?;
    let k = key::key(&r);
    let kernel = |addr| Kernel {
        addr,
        dtype: r.dtype,
        n_ins: r.n_ins,
        n_outs: r.outs.len(),
        n_consts: r.ops.iter().map(|(k, _)| key::n_constants(k)).sum(),
    };
    // A poisoned lock only means another plan panicked while compiling;
    // the map itself is whole (an entry is inserted in one step).
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    let addr = match c.get(&k) {
        Some(&addr) => addr,
        None => {
            #[cfg(test)]
            COMPILED_HERE.with(|n| n.set(n.get() + 1));
            let addr = jit::compile(&r);
            c.insert(k.clone(), addr);
            addr
        }
    };
    #[cfg(test)]
    RECORD.with(|rec| {
        if let Some(v) = rec.borrow_mut().as_mut() {
            v.push((k, addr.is_some()));
        }
    });
    addr.map(kernel)
}

/// A float type of the loops, by dtype.
pub(super) trait Lane: Copy {
    const DTYPE: DType;
}
impl Lane for f32 {
    const DTYPE: DType = DType::F32;
}
impl Lane for f64 {
    const DTYPE: DType = DType::F64;
}
