//! Procedural macros of braintrace (placeholder until the macro issue lands).
