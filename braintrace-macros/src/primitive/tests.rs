use super::*;
use quote::quote;

fn analyse_src(
    flags: proc_macro2::TokenStream,
    f: proc_macro2::TokenStream,
) -> (Primitive, String) {
    let mut cx = Ctxt::new();
    let flags = parse_flags(&mut cx, flags);
    let p = analyse(&mut cx, flags, syn::parse2(f).unwrap());
    (p, cx.into_compile_errors().to_string())
}

#[test]
fn primitive_defaults_follow_the_seed() {
    let (p, e) = analyse_src(
        quote!(),
        quote!(
            fn my_op(x: &Tensor, w: &Tensor, #[param] scale: f64) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(e.is_empty(), "{e}");
    assert_eq!(p.name, "my_op");
    assert_eq!(p.x, Some(0));
    assert_eq!(p.trainables, vec![("weight".to_string(), 1)]);
    assert_eq!(p.params().count(), 1);
    assert!(!p.keyed() && !p.batched && !p.gradient_enabled && p.exact_dw_shapes);
    // `#[param]` is gone from the function.
    assert!(!quote!(#(p.func)).to_string().contains("param"));
}

#[test]
fn primitive_layout_flags() {
    let (p, e) = analyse_src(
        quote!(x = none, weight = w),
        quote!(
            fn id(w: &Tensor) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(e.is_empty(), "{e}");
    assert_eq!((p.x, p.trainables), (None, vec![("weight".to_string(), 0)]));
    let (p, e) = analyse_src(
        quote!(weight = [weight, bias]),
        quote!(
            fn lin(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(e.is_empty(), "{e}");
    assert_eq!(
        p.trainables,
        vec![("weight".to_string(), 1), ("bias".to_string(), 2)]
    );
    assert!(p.keyed());
    let (p, e) = analyse_src(
        quote!(x = x, trainables(lora_b = b, lora_a = a)),
        quote!(
            fn lora(a: &Tensor, x: &Tensor, b: &Tensor) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(e.is_empty(), "{e}");
    assert_eq!(
        (p.x, p.trainables),
        (
            Some(1),
            vec![("lora_b".to_string(), 2), ("lora_a".to_string(), 0)]
        )
    );
}

#[test]
fn primitive_layout_errors() {
    let (_, e) = analyse_src(
        quote!(x = y, weight = v),
        quote!(
            fn f(x: &Tensor, w: &Tensor, #[param] s: f64) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(
        e.contains("`x = y` names no argument of `f`; its operands are `x`, `w`"),
        "{e}"
    );
    assert!(e.contains("`weight = v` names no argument"), "{e}");
    let (_, e) = analyse_src(
        quote!(weight = s),
        quote!(
            fn f(x: &Tensor, w: &Tensor, #[param] s: f64) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(e.contains("names a `#[param]` argument"), "{e}");
    let (_, e) = analyse_src(
        quote!(),
        quote!(
            fn f(x: &Tensor) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(e.contains("needs a trainable operand"), "{e}");
}

#[test]
fn primitive_signature_errors() {
    let (p, e) = analyse_src(
        quote!(),
        quote!(
            async fn f<T>(x: &Tensor, w: &Tensor, n: usize, #[param] s: &str) {}
        ),
    );
    assert!(p.structural_error);
    for needle in [
        "`async fn`",
        "generic function",
        "neither an operand nor a param",
        "must be an owned value",
        "must return `Result<Tensor>`",
    ] {
        assert!(e.contains(needle), "missing {needle:?} in {e}");
    }
}

#[test]
fn param_defaults() {
    let (p, e) = analyse_src(
        quote!(),
        quote!(
            fn f(
                x: &Tensor,
                w: &Tensor,
                #[param(default = 1.0)] scale: f64,
                #[param] n: usize,
                #[param(default = vec![1, 2],)] dims: Vec<usize>,
            ) -> Result<Tensor> {
                todo!()
            }
        ),
    );
    assert!(e.is_empty(), "{e}");
    let defaults: Vec<Option<String>> = p
        .params()
        .map(|a| a.default.as_ref().map(tokens_to_string))
        .collect();
    assert_eq!(
        defaults,
        vec![Some("1.0".into()), None, Some("vec![1, 2]".into())]
    );
}

#[test]
fn param_default_malformed() {
    for (attr, needle) in [
        (quote!(#[param(default)]), "expected `default = <value>`"),
        (
            quote!(#[param(default = )]),
            "expected a value after `default =`",
        ),
        (
            quote!(#[param(dflt = 1.0)]),
            "unknown `#[param]` option `dflt`",
        ),
        (quote!(#[param = 1.0]), "expected `#[param(default = 1.0)]`"),
        (quote!(#[param()]), "`#[param()]` is empty"),
        (
            quote!(#[param(default = 1.0, default = 2.0)]),
            "`default` is given twice",
        ),
        (quote!(#[param(default = 1.0 2.0)]), "expected `,`"),
        (quote!(#[param] #[param]), "`#[param]` is given twice"),
    ] {
        let (p, e) = analyse_src(
            quote!(),
            quote!(
                fn f(x: &Tensor, w: &Tensor, #attr scale: f64) -> Result<Tensor> {
                    todo!()
                }
            ),
        );
        assert!(e.contains(needle), "{attr}: missing {needle:?} in {e}");
        assert_eq!(e.matches("compile_error").count(), 1, "{attr}: {e}");
        // Still a param, without a default, and the expansion goes on.
        let a = p.params().next().expect("one param");
        assert!(a.default.is_none() || needle.contains("twice"), "{attr}");
        assert!(!p.structural_error, "{attr}");
    }
}

#[test]
fn tensor_ref_detection() {
    assert!(is_tensor_ref(&syn::parse_quote!(&Tensor)));
    assert!(is_tensor_ref(&syn::parse_quote!(&'a braintrace::Tensor)));
    assert!(!is_tensor_ref(&syn::parse_quote!(&mut Tensor)));
    assert!(!is_tensor_ref(&syn::parse_quote!(Tensor)));
    assert!(!is_tensor_ref(&syn::parse_quote!(Option<&Tensor>)));
}
