//! Error collection: every problem of one item is recorded with its span and
//! reported together (serde_derive's context object, in small).

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use std::fmt::Display;

/// Collects the errors of one macro invocation.
#[derive(Default)]
pub struct Ctxt {
    errors: Option<syn::Error>,
}

impl Ctxt {
    /// An empty context.
    pub fn new() -> Self {
        Ctxt::default()
    }
    /// Record an error at `span`.
    pub fn error(&mut self, span: Span, msg: impl Display) {
        self.push(syn::Error::new(span, msg));
    }
    /// Record an error spanning `tokens`.
    pub fn error_spanned(&mut self, tokens: impl ToTokens, msg: impl Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }
    /// Record a ready error.
    pub fn push(&mut self, e: syn::Error) {
        match &mut self.errors {
            Some(all) => all.combine(e),
            None => self.errors = Some(e),
        }
    }
    /// The recorded errors as `compile_error!` invocations (empty if none).
    pub fn into_compile_errors(self) -> TokenStream {
        self.errors
            .map(|e| e.to_compile_error())
            .unwrap_or_default()
    }
}
