//! Macros for what every algorithm module writes the same way: the
//! bookkeeping methods of [`OnlineAlgorithm`](super::algorithm::OnlineAlgorithm),
//! the builder methods of the shared options, and a [`TraceRule`](super::algorithm::TraceRule)
//! that hands what it does not change to the rule it wraps.

/// The [`OnlineAlgorithm`](super::algorithm::OnlineAlgorithm) methods
/// besides `plan`: `name`, `type_name`, `vjp_method` and `non_temporal`
/// (closures of `&Self`), `as_any`, `same`.
macro_rules! algorithm_methods {
    ($t:ty, $name:literal, $vjp:expr, $nt:expr) => {
        fn name(&self) -> &'static str {
            $name
        }
        fn type_name(&self) -> &'static str {
            stringify!($t)
        }
        fn vjp_method(&self) -> VjpMethod {
            $vjp(self)
        }
        fn non_temporal(&self) -> NonTemporal {
            $nt(self)
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn same(&self, other: &dyn Any) -> bool {
            other.downcast_ref::<Self>() == Some(self)
        }
    };
}

/// Builder methods that set the field of their name and return `self`
/// (the shared options: `vjp_method`, `non_temporal`, `in_step_paths`,
/// `fast_paths`, `trace_dtype`, whichever are listed). Each entry is
/// `field: Type, "one-line doc";` or, for a longer doc with examples,
/// doc comments (`/// ...`) followed by `field: Type;`.
macro_rules! option_builders {
    ($($field:ident: $ty:ty, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            pub fn $field(mut self, v: $ty) -> Self {
                self.$field = v;
                self
            }
        )*
    };
    ($($(#[$meta:meta])+ $field:ident: $ty:ty;)*) => {
        $(
            $(#[$meta])+
            pub fn $field(mut self, v: $ty) -> Self {
                self.$field = v;
                self
            }
        )*
    };
}

/// The builder methods `vjp_method`, `non_temporal` and `in_step_paths`
/// with their usual docs, for an algorithm with all three fields.
macro_rules! common_option_builders {
    () => {
        option_builders! {
            /// With this VJP method.
            vjp_method: VjpMethod;
            /// With this treatment of non-temporal parameters.
            non_temporal: NonTemporal;
            /// With this counting of in-step paths ([`InStepPaths::Once`] counts
            /// each once; [`InStepPaths::Twice`], braintrace 0.2.6's, is the
            /// default).
            in_step_paths: InStepPaths;
        }
    };
}

/// The [`TraceRule`](super::algorithm::TraceRule) methods listed, handed
/// to the rule in field `$inner`.
macro_rules! delegate_trace_rule {
    ($inner:ident: $($m:ident),*) => {
        $(delegate_trace_rule!(@one $inner $m);)*
    };
    (@one $inner:ident zeros) => {
        fn zeros(&self) -> Vec<Tensor> {
            self.$inner.zeros()
        }
    };
    (@one $inner:ident state) => {
        fn state(&self, state: &ModelState) -> Result<Box<dyn TraceState>> {
            self.$inner.state(state)
        }
    };
    (@one $inner:ident in_program) => {
        fn in_program(&self, pair: usize) -> bool {
            self.$inner.in_program(pair)
        }
    };
    (@one $inner:ident stacked) => {
        fn stacked(&self) -> bool {
            self.$inner.stacked()
        }
    };
    (@one $inner:ident forward_extra) => {
        fn forward_extra(&self) -> usize {
            self.$inner.forward_extra()
        }
    };
    (@one $inner:ident public) => {
        fn public(&self, traces: &[Tensor], state: &dyn TraceState) -> Result<Vec<Tensor>> {
            self.$inner.public(traces, state)
        }
    };
}

pub(crate) use {algorithm_methods, common_option_builders, delegate_trace_rule, option_builders};
