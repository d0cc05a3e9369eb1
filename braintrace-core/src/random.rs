//! The seeded random number generator that initialisers and learners draw
//! from. It sits at the bottom of the crate (it needs nothing but `rand`),
//! so `learn` (a model's state owns one) and `nn` (initialisers draw from
//! it) both reach it downward.

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};

/// The random number generator initialisers draw from (seeded, reproducible;
/// a clone continues the same stream independently).
#[derive(Clone)]
pub struct Rng(StdRng);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn seed(seed: u64) -> Self {
        Rng(StdRng::seed_from_u64(seed))
    }
    /// A uniform draw in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.0.random::<f64>()
    }
    /// A standard normal draw (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// An integer draw in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n.max(1))
    }
}
