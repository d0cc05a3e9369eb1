//! Procedural macros of braintrace (being written).
use proc_macro::TokenStream;

/// Define an ETP primitive from its implementation function.
#[proc_macro_attribute]
pub fn etp_primitive(_a: TokenStream, item: TokenStream) -> TokenStream {
    item
}
/// The `yw_to_w` rule of a primitive.
#[proc_macro_attribute]
pub fn yw_to_w(_a: TokenStream, item: TokenStream) -> TokenStream {
    item
}
/// The `xy_to_dw` rule of a primitive.
#[proc_macro_attribute]
pub fn xy_to_dw(_a: TokenStream, item: TokenStream) -> TokenStream {
    item
}
/// The `init_drtrl` rule of a primitive.
#[proc_macro_attribute]
pub fn init_drtrl(_a: TokenStream, item: TokenStream) -> TokenStream {
    item
}
/// The `init_pp` rule of a primitive.
#[proc_macro_attribute]
pub fn init_pp(_a: TokenStream, item: TokenStream) -> TokenStream {
    item
}
