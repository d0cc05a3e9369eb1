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
#[inline]
pub(crate) fn split_threshold(awake: usize, on_pool: usize, from_outside: usize) -> usize {
    if AWAKE.get() {
        awake
    } else if rayon::current_thread_index().is_some() {
        on_pool
    } else {
        from_outside
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
