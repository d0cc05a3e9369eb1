//! Without the `codegen` feature no fused group is compiled: every group
//! runs on the block kernels (which won against the generated loops on
//! every group measured; see `codegen/mod.rs`). The same names as the
//! generator's, so the executor reads the same either way.

use super::Fused;

/// Most operands of a compiled group (no group is compiled here).
pub(super) const MAX_INS: usize = 1;
/// See [`MAX_INS`].
pub(super) const MAX_OUTS: usize = 1;

/// A compiled loop: none exists without the feature.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kernel {}

/// The element types of fused groups.
pub(super) trait Lane: Copy {}
impl Lane for f32 {}
impl Lane for f64 {}

/// Never a loop without the feature.
pub(super) fn compile(_: &Fused) -> Option<Kernel> {
    None
}

/// No constants are passed to a loop that does not exist.
pub(super) fn constants<T>(_: &Fused) -> Vec<T> {
    Vec::new()
}

/// Unreachable: there is no [`Kernel`] to run.
pub(super) fn run_compiled<T>(k: &Kernel, _: &[&[T]], _: &[T], _: &mut [&mut [T]]) {
    match *k {}
}
