//! Running a learner on several cores.
//!
//! The fused trace kernels, the matrix products and the fused element-wise
//! loops split their work across the threads of the current
//! [rayon](https://docs.rs/rayon) pool; each thread owns its part of the
//! result, so the bits do not depend on the number of threads. A step has
//! several such splits, with single-threaded work between them. A pool's
//! idle thread falls asleep between splits, and waking it costs tens of
//! microseconds on a virtual machine, about what a split of a small step
//! saves. [`keep_awake`] keeps the pool's other threads looking for work
//! for as long as a closure runs, so each split is picked up within about
//! a microsecond, and lets smaller pieces split.
//!
//! # Who chooses
//!
//! By default a learner chooses ([`Work::splits`]): a learner's
//! `update` / `etrace_grad` called from outside any rayon pool (a plain
//! program's main thread) estimates the work of one step from what its
//! compiled graph knows — the bytes its traces stream and the
//! multiply-adds of its relations' products — and runs the whole call on
//! the calling thread when that is below [`SPLIT_MIN_NS`] of estimated
//! single-thread time, where handing work to the pool costs more than it
//! saves; above, its kernels split across the global pool as their own
//! thresholds say. The caller overrides it:
//!
//! * one thread: `RAYON_NUM_THREADS=1`, or the call inside [`one_thread`];
//! * all of a pool's threads: the call inside `ThreadPool::install` and/or
//!   [`keep_awake`] (the learner then never narrows it: the kernels split
//!   at their thresholds for that case, `bench_learn --threads N`).
//!
//! ```
//! let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
//! let sum = pool.install(|| {
//!     braintrace_core::threads::keep_awake(|| {
//!         use rayon::prelude::*;
//!         (0..1000u64).into_par_iter().sum::<u64>()
//!     })
//! });
//! assert_eq!(sum, 499_500);
//! ```

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Whether this thread is running a [`one_thread`] closure.
    static ONE: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread is running a [`keep_awake`] closure.
    static AWAKE: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread is running one of the spinning jobs.
    static SPINNING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the current rayon pool (the global one unless called inside
/// `ThreadPool::install`) with the pool's other threads spinning, looking
/// for work, until `f` returns; returns what `f` returns.
///
/// Use it around a learner's `etrace_grad` (or a loop of them) on a machine
/// whose cores are there for the learner: the other threads use their
/// cores fully while `f` runs, even between splits. On a pool of one
/// thread it only calls `f`. Results are the same bits as without it.
///
/// Measured on a 2-core virtual machine (`bench_learn --threads 2`, GRU
/// pp_prop, T 100, three alternating rounds): hidden 512, batch 64,
/// 0.45–0.47 ms/step against 0.53–0.61 on the pool without it; hidden
/// 512, batch 16, 0.12–0.13 against 0.16–0.17 (see "Threads" in the
/// book's online-learning chapter).
pub fn keep_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        return f();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        let home = rayon::current_thread_index();
        for _ in 1..threads {
            let done = &done;
            s.spawn(move |_| spin(done, home));
        }
        let _awake = Awake::set(&done);
        f()
    })
}

/// Marks this thread as running a [`keep_awake`] closure until dropped,
/// and then stops the spinners (also when the closure panics: the scope
/// waits for them).
struct Awake<'a> {
    was: bool,
    done: &'a AtomicBool,
}

impl<'a> Awake<'a> {
    fn set(done: &'a AtomicBool) -> Self {
        Awake {
            was: AWAKE.replace(true),
            done,
        }
    }
}

impl Drop for Awake<'_> {
    fn drop(&mut self) {
        AWAKE.set(self.was);
        self.done.store(true, Ordering::Release);
    }
}

/// Runs the pool's pending work until `done`. Returns at once on the
/// thread that started it (it would spin under its own closure: that
/// thread runs a queued spinner only while it waits for other work) and on
/// a thread that already spins.
fn spin(done: &AtomicBool, home: Option<usize>) {
    if rayon::current_thread_index() == home || SPINNING.get() {
        return;
    }
    SPINNING.set(true);
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            Some(rayon::Yield::Idle) => {
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(YIELD_EVERY) {
                    // Let any other runnable thread have this core (a
                    // third thread, such as matrixmultiply's, waited for
                    // the spinner's time slice to end: steps up to 12×
                    // slower); without one, the call returns at once.
                    std::thread::yield_now();
                } else {
                    // A short pause between looks: each look reads the
                    // other threads' queues, which their owners write.
                    for _ in 0..8 {
                        std::hint::spin_loop();
                    }
                }
            }
            None => break,
        }
    }
    SPINNING.set(false);
}

/// Idle looks of a spinner between two yields of its core to the OS.
const YIELD_EVERY: u32 = 16;

/// Whether the calling thread runs a [`keep_awake`] closure, so that a
/// split's other parts are picked up at once.
#[cfg(test)]
fn awake() -> bool {
    AWAKE.get()
}

/// The least work from which a kernel splits across the current rayon
/// pool: `awake` under [`keep_awake`], `on_pool` when the caller is one of
/// the pool's threads, `from_outside` otherwise. A caller outside the pool
/// hands every part to the pool's threads and sleeps until they are done
/// (two context switches, tens of microseconds on a virtual machine), and
/// a pool thread's split may have to wake a sleeping thread; only large
/// pieces of work pay for that.
///
/// Inside [`one_thread`] nothing splits (`usize::MAX`).
#[inline]
pub(crate) fn split_threshold(awake: usize, on_pool: usize, from_outside: usize) -> usize {
    if ONE.get() {
        usize::MAX
    } else if AWAKE.get() {
        awake
    } else if rayon::current_thread_index().is_some() {
        on_pool
    } else {
        from_outside
    }
}

/// Runs `f` on the calling thread without splitting any kernel across a
/// pool (the bits are the same: each split's parts are computed as on one
/// thread); returns what `f` returns. The override of a learner's own
/// choice that asks for one thread.
pub fn one_thread<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ONE.set(self.0);
        }
    }
    let _restore = Restore(ONE.replace(true));
    f()
}

/// The work of one learner step, as estimated from its compiled graph when
/// it is compiled (see [`Work::splits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Bytes of the traces a step reads and writes once each (D-RTRL's
    /// parameter-sized traces; pp_prop's vectors).
    pub trace_bytes: usize,
    /// Multiply-adds of the step's relations' products: per trainable,
    /// its elements times the batch (a dense `x W` of a `(B, I)` input and
    /// an `(I, O)` weight: `B·I·O`).
    pub macs: usize,
}

/// Estimated single-thread cost of streaming one trace byte (read and
/// written once per step), from GRU D-RTRL 512×64 on one core of the
/// 2-core machine the defaults were measured on: 205 MB of f32 traces in
/// 17.2 ms per step (the products are a few percent of it).
const NS_PER_TRACE_BYTE: f64 = 0.08;

/// Estimated single-thread cost of one multiply-add of a relation's
/// product per step, from GRU pp_prop 512×64 on the same core: 52 M
/// multiply-adds of the forward products, about 0.9 ms per step with the
/// learning signal's and the gradient's products.
const NS_PER_MAC: f64 = 0.017;

/// The estimated single-thread step time from which a learner called from
/// outside a pool lets its kernels split: below it, the call runs on one
/// thread. On the 2-core machine of the measurements (see the book's
/// "Threads" section) GRU D-RTRL 128×16 took 0.13 ms/step on one thread
/// and 0.26 ms on two, 512×64 took 17.2 ms and 9.1 ms.
pub const SPLIT_MIN_NS: f64 = 1.0e6;

impl Work {
    /// The estimated single-thread time of a step in nanoseconds:
    /// `0.1 ns × trace bytes + 0.1 ns × multiply-adds`.
    pub fn estimate_ns(self) -> f64 {
        self.trace_bytes as f64 * NS_PER_TRACE_BYTE + self.macs as f64 * NS_PER_MAC
    }
    /// Whether a step of this work splits across the pool when the learner
    /// chooses (called from outside any pool): its estimated single-thread
    /// time is at least [`SPLIT_MIN_NS`] and the pool has more than one
    /// thread.
    pub fn splits(self) -> bool {
        self.estimate_ns() >= split_min_ns() && rayon::current_num_threads() > 1
    }
}

/// [`SPLIT_MIN_NS`], or the environment variable
/// `BRAINTRACE_SPLIT_MIN_MS` (milliseconds) when set: to tune the rule on
/// another machine (`bench_learn --threads auto,1,2` prints `work_est_ms`).
fn split_min_ns() -> f64 {
    static MIN: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("BRAINTRACE_SPLIT_MIN_MS")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| *v >= 0.0)
            .map_or(SPLIT_MIN_NS, |ms| ms * 1e6)
    })
}

/// Runs `f` with the library's choice of threads for a step of `work`: on
/// one thread ([`one_thread`]) unless [`Work::splits`]; as the caller set
/// it when `f` is called inside a pool, under [`keep_awake`] or inside
/// [`one_thread`].
pub(crate) fn auto<R>(work: Work, f: impl FnOnce() -> R) -> R {
    let caller_chose = ONE.get() || AWAKE.get() || rayon::current_thread_index().is_some();
    if caller_chose || work.splits() {
        f()
    } else {
        one_thread(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_stops_every_split_and_nests() {
        assert_ne!(split_threshold(1, 1, 1), usize::MAX);
        one_thread(|| {
            assert_eq!(split_threshold(1, 1, 1), usize::MAX);
            one_thread(|| assert_eq!(split_threshold(1, 1, 1), usize::MAX));
            assert_eq!(split_threshold(1, 1, 1), usize::MAX);
        });
        assert_eq!(split_threshold(1, 2, 3), 3);
    }

    #[test]
    fn the_choice_follows_the_estimated_work() {
        let small = Work {
            trace_bytes: 3 << 20,
            macs: 100_000,
        };
        let large = Work {
            trace_bytes: 200 << 20,
            macs: 50_000_000,
        };
        assert!(small.estimate_ns() < SPLIT_MIN_NS);
        assert!(large.estimate_ns() > SPLIT_MIN_NS);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // From outside any pool (a test's thread): the learner's choice.
        let from_outside = |w: Work| auto(w, || split_threshold(1, 2, 3));
        assert_eq!(from_outside(small), usize::MAX);
        let expect = if rayon::current_num_threads() > 1 {
            3
        } else {
            usize::MAX
        };
        assert_eq!(from_outside(large), expect);
        // Inside a pool the caller chose: nothing narrowed.
        assert_eq!(pool.install(|| auto(small, || split_threshold(1, 2, 3))), 2);
        // Inside one_thread: stays one thread even for large work.
        assert_eq!(
            one_thread(|| auto(large, || split_threshold(1, 2, 3))),
            usize::MAX
        );
    }

    #[test]
    fn keep_awake_returns_and_marks_only_its_closure() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for _ in 0..20 {
            let (inner, sum) = pool.install(|| {
                keep_awake(|| {
                    use rayon::prelude::*;
                    (awake(), (0..10_000u64).into_par_iter().sum::<u64>())
                })
            });
            assert!(inner);
            assert_eq!(sum, 49_995_000);
            assert!(!pool.install(awake));
        }
        assert!(!awake());
    }

    #[test]
    fn keep_awake_on_one_thread_only_calls() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        assert_eq!(pool.install(|| keep_awake(|| 7)), 7);
        assert!(!pool.install(awake));
    }

    #[test]
    fn keep_awake_ends_after_a_panic() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| keep_awake(|| panic!("inside")))
        }));
        assert!(r.is_err());
        assert!(!pool.install(awake));
        // The pool still runs work (the spinner has stopped).
        assert_eq!(pool.install(|| keep_awake(|| 3)), 3);
    }
}
