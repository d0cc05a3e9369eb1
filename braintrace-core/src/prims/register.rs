//! Registration of the built-ins (spec-based, submitted through `inventory`
//! like macro-defined primitives, so they are in the registries before any
//! user code runs).

use super::{conv as cv, dense, elemwise, lora, sparse};
use crate::etp::{
    lazy_counterpart, register_primitive_spec, EtpPrimitive, EtpPrimitiveSpec, InitDrtrl, InitPp,
    InstantDrtrl, PrimitiveOptions, SolveDrtrl, StaticPrimitive, XyToDw, YwToW,
};
use std::sync::{Arc, OnceLock};

macro_rules! builtin {
    ($(#[$m:meta])* $fn:ident, $name:literal, $make:expr) => {
        $(#[$m])*
        pub fn $fn() -> EtpPrimitive {
            static P: OnceLock<EtpPrimitive> = OnceLock::new();
            P.get_or_init(|| register_primitive_spec(Arc::new($make)).expect(concat!("built-in ", $name, " registers once"))).clone()
        }
        inventory::submit! { StaticPrimitive { get: || Ok($fn()) } }
    };
}

fn opts(batched: bool, trainables: &[(&str, usize)], optional_bias: bool) -> PrimitiveOptions {
    let o = PrimitiveOptions::new()
        .batched(batched)
        .trainables(trainables);
    if optional_bias {
        o.optional("bias")
    } else {
        o
    }
}

fn dense_spec(name: &'static str, batched: bool) -> EtpPrimitiveSpec {
    EtpPrimitiveSpec::new(
        name,
        move |a, p| dense::dense_impl(name, a, p),
        YwToW::new(dense::dense_yw_to_w),
        XyToDw::new(move |x, h, w, p| dense::dense_xy_to_dw(name, x, h, w, p)),
        InitDrtrl::new(dense::dense_init_drtrl),
        InitPp::new(dense::init_pp_y),
    )
    .with_options(opts(batched, &[("weight", 1), ("bias", 2)], true))
}

fn sparse_spec(name: &'static str, batched: bool) -> EtpPrimitiveSpec {
    EtpPrimitiveSpec::new(
        name,
        move |a, p| sparse::sparse_impl(name, a, p),
        YwToW::new(move |h, t, p| sparse::sparse_yw_to_w(name, h, t, p)),
        XyToDw::new(move |x, h, w, p| sparse::sparse_xy_to_dw(name, x, h, w, p)),
        InitDrtrl::new(sparse::sparse_init_drtrl),
        InitPp::new(dense::init_pp_y),
    )
    .with_options(opts(batched, &[("weight", 1), ("bias", 2)], true))
}

fn lora_spec(name: &'static str, batched: bool) -> EtpPrimitiveSpec {
    let mut s = EtpPrimitiveSpec::new(
        name,
        move |a, p| lora::lora_impl(name, a, p),
        // Every LoRA trace leaf scales along the output axis, exactly as dense's.
        YwToW::new(dense::dense_yw_to_w),
        XyToDw::new(move |x, h, w, p| lora::lora_xy_to_dw(name, x, h, w, p)),
        InitDrtrl::new(lora::lora_init_drtrl),
        InitPp::new(dense::init_pp_y),
    )
    .with_options(opts(
        batched,
        &[("lora_b", 1), ("lora_a", 2), ("bias", 3)],
        true,
    ));
    s.instant_drtrl = Some(InstantDrtrl::new(move |x, h, w, p| {
        lora::lora_instant_drtrl(name, x, h, w, p)
    }));
    s.solve_drtrl = Some(SolveDrtrl::new(move |g, t, w, p| {
        lora::lora_solve_drtrl(name, g, t, w, p)
    }));
    s
}

builtin!(
    /// `etp_mm`: `y = x @ f(W) (+ g(b))`, x `(B, I)`.
    etp_mm, "etp_mm", dense_spec("etp_mm", true)
);
builtin!(
    /// `etp_mv`: `y = x @ f(W) (+ g(b))`, x `(I,)`; batched counterpart `etp_mm`.
    etp_mv, "etp_mv", { let mut s = dense_spec("etp_mv", false); s.options = lazy_counterpart(s.options, etp_mm); s }
);
builtin!(
    /// `etp_sp_mm`: sparse weight with a fixed CSR structure, x `(B, I)`.
    etp_sp_mm, "etp_sp_mm", sparse_spec("etp_sp_mm", true)
);
builtin!(
    /// `etp_sp_mv`: sparse weight, x `(I,)`; counterpart `etp_sp_mm`.
    etp_sp_mv, "etp_sp_mv", { let mut s = sparse_spec("etp_sp_mv", false); s.options = lazy_counterpart(s.options, etp_sp_mm); s }
);
builtin!(
    /// `etp_lora_mm`: `y = α x @ B @ A (+ b)`, x `(B, I)`.
    etp_lora_mm, "etp_lora_mm", lora_spec("etp_lora_mm", true)
);
builtin!(
    /// `etp_lora_mv`: LoRA with x `(I,)`; counterpart `etp_lora_mm`.
    etp_lora_mv, "etp_lora_mv", { let mut s = lora_spec("etp_lora_mv", false); s.options = lazy_counterpart(s.options, etp_lora_mm); s }
);
builtin!(
    /// `etp_elemwise`: `y = f(w)`, no x, gradient-enabled.
    etp_elemwise, "etp_elemwise", EtpPrimitiveSpec::new(
        "etp_elemwise",
        elemwise::elemwise_impl,
        YwToW::new(elemwise::elemwise_yw_to_w),
        XyToDw::new(elemwise::elemwise_xy_to_dw),
        InitDrtrl::new(elemwise::elemwise_init_drtrl),
        InitPp::new(dense::init_pp_y),
    )
    .with_options(PrimitiveOptions::new().x_index(None).trainables(&[("weight", 0)]).gradient_enabled(true).num_args(1))
);
builtin!(
    /// `etp_conv`: `y = conv(x, f(K)) (+ g(b))`, batched.
    etp_conv, "etp_conv", {
        let mut s = EtpPrimitiveSpec::new(
            "etp_conv",
            cv::conv_impl,
            YwToW::new(cv::conv_yw_to_w),
            XyToDw::new(cv::conv_xy_to_dw),
            InitDrtrl::new(cv::conv_init_drtrl),
            InitPp::new(dense::init_pp_y),
        );
        s.options = opts(true, &[("weight", 1), ("bias", 2)], true);
        s.options.exact_dw_shapes = false;
        s.instant_drtrl = Some(InstantDrtrl::new(cv::conv_instant_drtrl));
        s.solve_drtrl = Some(SolveDrtrl::new(cv::conv_solve_drtrl));
        s
    }
);
