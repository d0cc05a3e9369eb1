// `#[etp_primitive]` on a struct.
use braintrace::prelude::*;

#[etp_primitive(name = "etp_my_op")]
struct MyOp;

fn main() {}
