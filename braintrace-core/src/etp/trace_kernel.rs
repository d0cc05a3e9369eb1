//! Trace kernels as a primitive declares them: which fused, in-place trace
//! kernel computes what the primitive's rules compute, and where that
//! kernel finds its operands in the primitive's own layout (trainables by
//! name) and params (transforms, structure, scale by key).
//!
//! This is plain data kept on the primitive ([`PrimitiveOptions`] and so
//! the spec); the learners ask [`EtpPrimitive::trace_kernel`] for an
//! equation's kernel, whatever the algorithm (D-RTRL runs the whole trace
//! update with it, pp_prop reads the dense layout from it). A declaration
//! is a claim: the learner checks it against the rules before trusting it
//! (see `learn::kernel_check`).
//!
//! [`PrimitiveOptions`]: super::PrimitiveOptions
//! [`EtpPrimitive::trace_kernel`]: super::EtpPrimitive::trace_kernel

use super::custom_kernel::{CustomKernel, CustomTraceKernel};
use super::params::{ElemFn, ParamType, ParamValue, Params};
use std::fmt;
use std::sync::Arc;

/// How a parameter's instantaneous trace term is scaled: by the derivative
/// of the transform the primitive applies to the parameter before using it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scale {
    /// No transform: the parameter is used as it is (`f'(W) = 1`).
    One,
    /// An element-wise transform read from the [`ElemFn`] param under this
    /// key (absent or `None`: the identity); scales by `f'(W)`.
    Fn(String),
    /// A constant factor read from the `f64` param under this key: the
    /// primitive uses `c · W`, so the scale is `c`.
    Param(String),
}

/// A fused trace kernel of a primitive, with the names it reads: the
/// primitive's trainables by name (its layout's names) and its params by
/// key. Each kind is one computation the learner has a kernel for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TraceKernel {
    /// A dense product `y = x @ f(W) (+ g(b))`, or an element-wise
    /// `y = f(w)` without `x`. The `weight` trace (with `x`) is
    /// `(B?, I, O, S)`:
    /// `ε[b,i,o,a] ← Σ_c D[b,o,a,c] ε[b,i,o,c] + x[b,i] Df[b,o,a] f'(W)[i,o]`,
    /// gradient `∇[i,o] += Σ_{b,a} g[b,o,a] ε[b,i,o,a]`; the bias (and the
    /// weight of a primitive without `x`) is `(B?, O, S)` with `x = 1`.
    Dense {
        /// The trainable multiplied by `x`.
        weight: String,
        /// The trainable added to the product, if any.
        bias: Option<String>,
        /// The weight's scale.
        weight_scale: Scale,
        /// The bias's scale.
        bias_scale: Scale,
    },
    /// A sparse product `y = x @ M(f(w)) (+ g(b))` over the fixed CSR
    /// structure in the `structure` param: the weight trace is
    /// `(B?, nnz, S)`, the bias as [`Dense`](TraceKernel::Dense)'s.
    Sparse {
        /// The trainable holding the stored values.
        weight: String,
        /// The bias, if any.
        bias: Option<String>,
        /// The param holding the CSR structure.
        structure: String,
        /// The weight's scale.
        weight_scale: Scale,
        /// The bias's scale.
        bias_scale: Scale,
    },
    /// A low-rank product `y = α x @ b_fn(B) @ a_fn(A) (+ g(b))`, `B (I, r)`,
    /// `A (r, O)`: `B`'s trace is the effective weight's `(B?, I, O, S)`,
    /// `A`'s a dense weight trace over the input `α x b_fn(B)`.
    Lora {
        /// `B (I, r)`.
        lora_b: String,
        /// `A (r, O)`.
        lora_a: String,
        /// The bias, if any.
        bias: Option<String>,
        /// The `f64` param holding `α`.
        alpha: String,
        /// The [`ElemFn`] param applied to `A`, if any.
        a_fn: Option<String>,
        /// The [`ElemFn`] param applied to `B`, if any.
        b_fn: Option<String>,
        /// The bias's scale.
        bias_scale: Scale,
    },
    /// A channel-first convolution `y = conv(x, f(K)) (+ g(b))` without
    /// feature groups, its trace kept per output position.
    Conv {
        /// The kernel `(O, C, ks..)`.
        weight: String,
        /// The bias `(O,)`, if any.
        bias: Option<String>,
        /// The kernel's scale.
        weight_scale: Scale,
        /// The bias's scale.
        bias_scale: Scale,
    },
    /// A kernel written by hand for the primitive ([`CustomTraceKernel`]):
    /// the learner keeps every trainable's trace in `init_drtrl`'s layout
    /// and lets the kernel advance it in place and read gradients from it.
    Custom(CustomKernel),
}

/// What a trace of one trainable is to its kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The trainable multiplied by the input (dense, sparse, conv weight).
    Weight,
    /// An added trainable (`x = 1`).
    Bias,
    /// LoRA's `B`.
    LoraB,
    /// LoRA's `A`.
    LoraA,
    /// A trainable of a [`TraceKernel::Custom`] kernel (whatever it is to it).
    Custom,
}

impl TraceKernel {
    /// The kind's name (`dense`, `sparse`, `lora`, `conv`, `custom`).
    pub fn kind(&self) -> &'static str {
        match self {
            TraceKernel::Dense { .. } => "dense",
            TraceKernel::Sparse { .. } => "sparse",
            TraceKernel::Lora { .. } => "lora",
            TraceKernel::Conv { .. } => "conv",
            TraceKernel::Custom(_) => "custom",
        }
    }

    /// A hand-written kernel ([`CustomTraceKernel`]), e.g. returned by the
    /// function of `#[etp_primitive(.., trace_kernel = my_kernel)]`.
    pub fn custom(kernel: impl CustomTraceKernel) -> Self {
        TraceKernel::Custom(CustomKernel(Arc::new(kernel)))
    }

    /// The dense kernel of `y = x @ f(W) (+ g(b))` with transforms under
    /// `weight_fn` / `bias_fn`, as the built-in `etp_mm` declares it.
    pub fn dense_with_fns(
        weight: &str,
        bias: Option<&str>,
        weight_fn: &str,
        bias_fn: &str,
    ) -> Self {
        TraceKernel::Dense {
            weight: weight.into(),
            bias: bias.map(Into::into),
            weight_scale: Scale::Fn(weight_fn.into()),
            bias_scale: Scale::Fn(bias_fn.into()),
        }
    }

    /// The role of trainable `name`, `None` when the kernel does not name it.
    pub fn role(&self, name: &str) -> Option<Role> {
        let is = |s: &String| s == name;
        let bias = |b: &Option<String>| b.as_ref().is_some_and(is);
        match self {
            TraceKernel::Dense {
                weight, bias: b, ..
            }
            | TraceKernel::Sparse {
                weight, bias: b, ..
            }
            | TraceKernel::Conv {
                weight, bias: b, ..
            } => {
                if is(weight) {
                    Some(Role::Weight)
                } else if bias(b) {
                    Some(Role::Bias)
                } else {
                    None
                }
            }
            // Every trainable: the kernel is asked for each trace the
            // primitive's `init_drtrl` lays out.
            TraceKernel::Custom(_) => Some(Role::Custom),
            TraceKernel::Lora {
                lora_b,
                lora_a,
                bias: b,
                ..
            } => {
                if is(lora_b) {
                    Some(Role::LoraB)
                } else if is(lora_a) {
                    Some(Role::LoraA)
                } else if bias(b) {
                    Some(Role::Bias)
                } else {
                    None
                }
            }
        }
    }

    /// The scale of a trainable in `role` (LoRA's `A` is scaled by
    /// `a_fn'(A)`; `B`'s transform enters its gradient map, not a scale).
    pub fn scale(&self, role: &Role) -> Scale {
        let fn_key = |k: &Option<String>| k.clone().map_or(Scale::One, Scale::Fn);
        match (self, role) {
            (TraceKernel::Custom(_), _) => Scale::One,
            (TraceKernel::Lora { a_fn, .. }, Role::LoraA) => fn_key(a_fn),
            (TraceKernel::Lora { .. }, Role::LoraB | Role::Weight | Role::Custom) => Scale::One,
            (TraceKernel::Lora { bias_scale, .. }, Role::Bias) => bias_scale.clone(),
            (
                TraceKernel::Dense {
                    weight_scale,
                    bias_scale,
                    ..
                }
                | TraceKernel::Sparse {
                    weight_scale,
                    bias_scale,
                    ..
                }
                | TraceKernel::Conv {
                    weight_scale,
                    bias_scale,
                    ..
                },
                r,
            ) => {
                if *r == Role::Bias {
                    bias_scale.clone()
                } else {
                    weight_scale.clone()
                }
            }
        }
    }

    /// Whether every param the kernel reads is readable in `params`: the
    /// transforms are transforms (or absent), a constant scale is a finite
    /// number, LoRA's `α` is finite, the sparse structure is present.
    pub fn readable(&self, params: &Params) -> bool {
        let scale_ok = |s: &Scale| match s {
            Scale::One => true,
            Scale::Fn(k) => elem_fn_readable(params, k),
            Scale::Param(k) => finite(params, k),
        };
        match self {
            TraceKernel::Dense {
                weight_scale,
                bias_scale,
                ..
            }
            | TraceKernel::Conv {
                weight_scale,
                bias_scale,
                ..
            } => scale_ok(weight_scale) && scale_ok(bias_scale),
            TraceKernel::Sparse {
                structure,
                weight_scale,
                bias_scale,
                ..
            } => {
                scale_ok(weight_scale)
                    && scale_ok(bias_scale)
                    && params
                        .raw(structure)
                        .is_some_and(|v| !matches!(v, ParamValue::None))
            }
            TraceKernel::Lora {
                alpha,
                a_fn,
                b_fn,
                bias_scale,
                ..
            } => {
                finite(params, alpha)
                    && [a_fn, b_fn]
                        .iter()
                        .all(|k| k.as_ref().is_none_or(|k| elem_fn_readable(params, k)))
                    && scale_ok(bias_scale)
            }
            TraceKernel::Custom(_) => true,
        }
    }
}

fn elem_fn_readable(params: &Params, key: &str) -> bool {
    match params.raw(key) {
        None | Some(ParamValue::None) => true,
        // A transform that is not element-wise has no `f'` for the kernels.
        Some(v) => ElemFn::from_param(v).is_some_and(|f| f.is_elementwise()),
    }
}

fn finite(params: &Params, key: &str) -> bool {
    params
        .raw(key)
        .and_then(f64::from_param)
        .is_some_and(f64::is_finite)
}

/// A primitive's declaration of its trace kernel.
#[derive(Clone)]
pub enum TraceKernelDecl {
    /// The same kernel for every equation (whose params it can read).
    Fixed(TraceKernel),
    /// Chosen per equation from its params (`None`: the rules run), e.g. a
    /// convolution whose kernel covers only the default layout.
    Chosen(fn(&Params) -> Option<TraceKernel>),
}

impl TraceKernelDecl {
    /// The kernel for an equation with `params`: `None` when the
    /// declaration does not cover it or cannot read its params.
    pub fn for_params(&self, params: &Params) -> Option<TraceKernel> {
        let k = match self {
            TraceKernelDecl::Fixed(k) => k.clone(),
            TraceKernelDecl::Chosen(f) => f(params)?,
        };
        k.readable(params).then_some(k)
    }
}

impl fmt::Debug for TraceKernelDecl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceKernelDecl::Fixed(k) => write!(f, "Fixed({k:?})"),
            TraceKernelDecl::Chosen(_) => f.write_str("Chosen(<fn>)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_and_scales_follow_the_declared_names() {
        let k = TraceKernel::Dense {
            weight: "w".into(),
            bias: None,
            weight_scale: Scale::Param("scale".into()),
            bias_scale: Scale::One,
        };
        assert_eq!(k.role("w"), Some(Role::Weight));
        assert_eq!(k.role("weight"), None);
        assert_eq!(k.scale(&Role::Weight), Scale::Param("scale".into()));
        assert!(!k.readable(&Params::new()));
        assert!(k.readable(&Params::new().with("scale", 2.0)));
        assert!(!k.readable(&Params::new().with("scale", f64::NAN)));
        let fns = TraceKernel::dense_with_fns("weight", Some("bias"), "weight_fn", "bias_fn");
        assert_eq!(fns.role("bias"), Some(Role::Bias));
        assert!(fns.readable(&Params::new()));
        assert!(!fns.readable(&Params::new().with("weight_fn", 3i64)));
    }
}
