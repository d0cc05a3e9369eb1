use super::*;

fn expand_str(args: TokenStream, item: TokenStream) -> String {
    etp_primitive(args, item).to_string()
}

#[test]
fn expansion_shape() {
    let out = expand_str(
        quote!(name = "etp_scaled_mm", batched, x = x, weight = w),
        quote!(
            fn scaled_mm(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
                x.matmul(w)?.mul_scalar(scale)
            }
        ),
    );
    for needle in [
        "fn scaled_mm (x : & Tensor , w : & Tensor , scale : f64) -> Result < Tensor >",
        "scaled_mm :: try_primitive () ?",
        "fn __braintrace_impl_scaled_mm (x : & Tensor , w : & Tensor , scale : f64)",
        "mod scaled_mm",
        "pub const NAME : & str = \"etp_scaled_mm\"",
        "pub struct Params { # [doc = \" The `scale` param.\"] pub scale : f64 , }",
        "__o . batched = true",
        "__o . x_index = :: core :: option :: Option :: Some (0usize)",
        "(:: std :: string :: String :: from (\"weight\") , 1usize)",
        "< Rules as YwToWRule > :: rule ()",
        "has no `yw_to_w` rule",
        "add `#[init_pp(scaled_mm)]` on a function `fn(x: &Aval, y: &Aval, w: &Aval, num_hidden_state: usize, p: &scaled_mm::Params) -> Result<Tensor>`",
        "inventory :: submit !",
        ":: braintrace :: __private",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
    }
    assert!(!out.contains("compile_error"), "{out}");
    assert!(!out.contains("# [param]"), "{out}");
}

#[test]
fn expansion_param_defaults() {
    let out = expand_str(
        quote!(),
        quote!(
            fn op(x: &Tensor, w: &Tensor, #[param(default = 1.0)] scale: f64) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    for needle in [
        "fn __default_scale () -> f64 { let __default : f64 = 1.0 ; __default }",
        "scale : (& :: braintrace :: __private :: ParamProbe :: < f64 > :: new ()) . read_or (__p , NAME , \"scale\" , __default_scale) ?",
        "impl :: core :: default :: Default for Params { fn default () -> Self { Params { scale : __default_scale () , } } }",
        "The `scale` param (default `1.0`).",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
    }
    // Without a default: a plain read, and no `Default`.
    let out = expand_str(
        quote!(),
        quote!(
            fn op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(
        !out.contains("__default_") && !out.contains("Default for Params"),
        "{out}"
    );
    assert!(out.contains(". read (__p , NAME , \"scale\") ?"), "{out}");
}

#[test]
fn expansion_crate_and_counterpart() {
    let out = expand_str(
        quote!(crate = "crate", counterpart = super::mm),
        quote!(
            pub(crate) fn mv(x: &Tensor, w: &Tensor) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(out.contains("pub use crate :: __private as __rt"), "{out}");
    assert!(out.contains("pub (crate) mod mv"), "{out}");
    assert!(out.contains("fn __braintrace_counterpart_mv () -> crate :: __private :: EtpPrimitive { super :: mm :: primitive () }"), "{out}");
    assert!(
        out.contains("lazy_counterpart (__o , super :: __braintrace_counterpart_mv)"),
        "{out}"
    );
}

#[test]
fn expansion_not_a_function() {
    let out = expand_str(
        quote!(),
        quote!(
            struct S;
        ),
    );
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.contains("applies to a free function"), "{out}");
    assert!(out.contains("struct S ;"), "{out}");
}

#[test]
fn expansion_stub_after_structural_error() {
    let out = expand_str(
        quote!(),
        quote!(
            fn f<T>(x: &Tensor, w: &Tensor) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert_eq!(out.matches("compile_error").count(), 1, "{out}");
    assert!(out.contains("pub struct Rules"), "{out}");
    assert!(!out.contains("inventory"), "{out}");
}

#[test]
fn expansion_full_after_flag_error() {
    // A bad flag is reported, and the rest still expands fully.
    let out = expand_str(
        quote!(batchd),
        quote!(
            fn f(x: &Tensor, w: &Tensor) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert_eq!(out.matches("compile_error").count(), 1, "{out}");
    assert!(out.contains("inventory :: submit !"), "{out}");
}
