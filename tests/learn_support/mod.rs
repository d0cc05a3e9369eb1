//! Support for the online-learning tests: the golden models and the
//! end-to-end golden case checker.

#![allow(dead_code)]

pub mod e2e;
pub mod models;
