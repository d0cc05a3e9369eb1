//! The element functions of the block kernels, emitted as Cranelift IR on
//! one value type (a vector of `f32`/`f64` lanes, or one lane), with the
//! same operations in the same order as the Rust kernels, so that a
//! compiled loop gives their bits: `fastmath`'s `exp`/`sigmoid`/`tanh`
//! (fused multiply-adds where the Rust code calls `mul_add`, the same
//! constants, the same bit tricks), the surrogate gradients of
//! `ops::spike`, and `f32::max`/`min` as Rust compiles them. What has no
//! short exact sequence (`ln`, `sin`, `powf`, the `f64` transcendental
//! functions, which are libm's) calls the Rust function itself, lane by
//! lane ([`Callee`]).

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, FuncRef, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;

/// A Rust element function the loop calls lane by lane: a unary op of
/// `ops::elementwise` (its `apply`) or `powf`, in `f32` or `f64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Callee {
    Unary(crate::ops::UnaryOp, bool),
    Pow(bool),
}

/// An emitter of element math on values of type `ty`.
pub(super) struct Emit<'a, 'b> {
    pub b: &'a mut FunctionBuilder<'b>,
    /// `F32X4`, `F64X2`, `F32` or `F64`.
    pub ty: Type,
    /// The callees this function imports.
    pub calls: &'a [(Callee, FuncRef)],
}

impl Emit<'_, '_> {
    fn lane(&self) -> Type {
        self.ty.lane_type()
    }

    fn f32(&self) -> bool {
        self.lane() == types::F32
    }

    /// The integer type of the same lanes.
    fn int(&self) -> Type {
        self.ty.as_int()
    }

    /// A scalar made a value of `ty` (splat into every lane of a vector).
    pub fn splat(&mut self, s: Value) -> Value {
        if self.ty.is_vector() {
            self.b.ins().splat(self.ty, s)
        } else {
            s
        }
    }

    /// The constant `v` (exact in both float types: `0`, `1`, `-1`, `2`).
    pub fn c(&mut self, v: f64) -> Value {
        let s = if self.f32() {
            self.b.ins().f32const(v as f32)
        } else {
            self.b.ins().f64const(v)
        };
        self.splat(s)
    }

    /// An `f32` constant (the `fastmath` routines').
    fn cf(&mut self, v: f32) -> Value {
        let s = self.b.ins().f32const(v);
        self.splat(s)
    }

    fn int_const(&mut self, v: i64) -> Value {
        let lane = self.int().lane_type();
        let s = self.b.ins().iconst(lane, v);
        if self.ty.is_vector() {
            let t = self.int();
            self.b.ins().splat(t, s)
        } else {
            s
        }
    }

    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fdiv(a, b)
    }
    /// `a.mul_add(b, c)`: rounded once.
    fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        self.b.ins().fma(a, b, c)
    }
    pub fn neg(&mut self, a: Value) -> Value {
        self.b.ins().fneg(a)
    }
    pub fn abs(&mut self, a: Value) -> Value {
        self.b.ins().fabs(a)
    }
    pub fn sqrt(&mut self, a: Value) -> Value {
        self.b.ins().sqrt(a)
    }

    fn as_bits(&mut self, v: Value) -> Value {
        let t = self.int();
        self.b.ins().bitcast(t, MemFlagsData::new(), v)
    }

    fn of_bits(&mut self, v: Value) -> Value {
        let t = self.ty;
        self.b.ins().bitcast(t, MemFlagsData::new(), v)
    }

    /// `if a cc b { x } else { y }`, lane by lane.
    pub fn pick(&mut self, cc: FloatCC, a: Value, b: Value, x: Value, y: Value) -> Value {
        let m = self.b.ins().fcmp(cc, a, b);
        if self.ty.is_vector() {
            let m = self.of_bits(m);
            self.b.ins().bitselect(m, x, y)
        } else {
            self.b.ins().select(m, x, y)
        }
    }

    /// `x.max(y)` as Rust compiles `f32::max` (LLVM's `maxnum` on x86):
    /// `if y > x { y } else if x is NaN { y } else { x }`, so a tie of
    /// zeros gives `x` (`(-0.0).max(0.0)` is `-0.0`: the tests compare
    /// the bits).
    pub fn max(&mut self, x: Value, y: Value) -> Value {
        let m = self.pick(FloatCC::GreaterThan, y, x, y, x);
        self.pick(FloatCC::Unordered, x, x, y, m)
    }

    /// `x.min(y)`, as [`Emit::max`] with the comparison turned.
    pub fn min(&mut self, x: Value, y: Value) -> Value {
        let m = self.pick(FloatCC::LessThan, y, x, y, x);
        self.pick(FloatCC::Unordered, x, x, y, m)
    }

    /// `x` with the sign of `s` (`f32::copysign`), by bits.
    fn copysign(&mut self, x: Value, s: Value) -> Value {
        let (xi, si) = (self.as_bits(x), self.as_bits(s));
        let bits = if self.f32() { 32 } else { 64 };
        let sign = self.int_const(1i64 << (bits - 1));
        let mag = self.b.ins().bnot(sign);
        let xi = self.b.ins().band(xi, mag);
        let si = self.b.ins().band(si, sign);
        let r = self.b.ins().bor(xi, si);
        self.of_bits(r)
    }

    /// `fastmath::exp_f32`.
    pub fn exp_f32(&mut self, x: Value) -> Value {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        const SHIFTER: f32 = 12_582_912.0;
        let lo = self.cf(-87.0);
        let x = self.pick(FloatCC::LessThan, x, lo, lo, x);
        let hi = self.cf(88.0);
        let x = self.pick(FloatCC::GreaterThan, x, hi, hi, x);
        let (log2e, shifter) = (self.cf(LOG2E), self.cf(SHIFTER));
        let shifted = self.fma(x, log2e, shifter);
        let n = self.sub(shifted, shifter);
        let sb = self.as_bits(shifted);
        let sh = self.int_const(i64::from(SHIFTER.to_bits()));
        let n_bits = self.b.ins().isub(sb, sh);
        let (m_hi, m_lo) = (self.cf(-LN2_HI), self.cf(-LN2_LO));
        let r = self.fma(n, m_hi, x);
        let r = self.fma(n, m_lo, r);
        let r2 = self.mul(r, r);
        let r4 = self.mul(r2, r2);
        let one = self.cf(1.0);
        let p01 = self.add(one, r);
        let (a, b) = (self.cf(1.0 / 6.0), self.cf(0.5));
        let p23 = self.fma(r, a, b);
        let (a, b) = (self.cf(1.0 / 120.0), self.cf(1.0 / 24.0));
        let p45 = self.fma(r, a, b);
        let (a, b) = (self.cf(1.0 / 5040.0), self.cf(1.0 / 720.0));
        let p67 = self.fma(r, a, b);
        let hi = self.fma(r2, p67, p45);
        let lo = self.fma(r2, p23, p01);
        let p = self.fma(r4, hi, lo);
        let bias = self.int_const(127);
        let e = self.b.ins().iadd(n_bits, bias);
        let e = self.b.ins().ishl_imm_u(e, 23);
        let two_n = self.of_bits(e);
        self.mul(p, two_n)
    }

    /// `fastmath::sigmoid_f32`: `1 / (1 + e^-x)`.
    pub fn sigmoid_f32(&mut self, x: Value) -> Value {
        let nx = self.neg(x);
        let e = self.exp_f32(nx);
        let one = self.cf(1.0);
        let d = self.add(one, e);
        self.div(one, d)
    }

    /// `fastmath::tanh_f32`.
    pub fn tanh_f32(&mut self, x: Value) -> Value {
        let a = self.abs(x);
        let x2 = self.mul(x, x);
        let x4 = self.mul(x2, x2);
        let x8 = self.mul(x4, x4);
        let (c, one) = (self.cf(-1.0 / 3.0), self.cf(1.0));
        let q01 = self.fma(x2, c, one);
        let (c, d) = (self.cf(-17.0 / 315.0), self.cf(2.0 / 15.0));
        let q23 = self.fma(x2, c, d);
        let (c, d) = (self.cf(-1382.0 / 155_925.0), self.cf(62.0 / 2835.0));
        let q45 = self.fma(x2, c, d);
        let q6 = self.cf(21844.0 / 6_081_075.0);
        let hi = self.fma(x4, q6, q45);
        let lo = self.fma(x4, q23, q01);
        let p = self.fma(x8, hi, lo);
        let small = self.mul(x, p);
        let two = self.cf(2.0);
        let a2 = self.mul(two, a);
        let e = self.exp_f32(a2);
        let d = self.add(e, one);
        let q = self.div(two, d);
        let l = self.sub(one, q);
        let large = self.copysign(l, x);
        let cut = self.cf(0.4);
        self.pick(FloatCC::LessThan, a, cut, small, large)
    }

    /// `e^x` as the surrogate kernels take it: `fastmath`'s in `f32`,
    /// libm's in `f64`.
    fn exp_any(&mut self, x: Value) -> Value {
        if self.f32() {
            self.exp_f32(x)
        } else {
            self.call(Callee::Unary(crate::ops::UnaryOp::Exp, true), &[x])
        }
    }

    /// `ops::spike`'s arctan surrogate gradient: `h / (1 + (k x)²)`.
    pub fn arctan_grad(&mut self, x: Value, h: Value, k: Value) -> Value {
        let z = self.mul(k, x);
        let z2 = self.mul(z, z);
        let one = self.c(1.0);
        let d = self.add(one, z2);
        self.div(h, d)
    }

    /// The sigmoid surrogate gradient: `α e / (1 + e)²`, `e = exp(−|α x|)`.
    pub fn sigmoid_grad(&mut self, x: Value, al: Value) -> Value {
        let z = self.mul(al, x);
        let z = self.abs(z);
        let z = self.neg(z);
        let e = self.exp_any(z);
        let one = self.c(1.0);
        let d = self.add(one, e);
        let num = self.mul(al, e);
        let d2 = self.mul(d, d);
        self.div(num, d2)
    }

    /// The ReLU-shaped surrogate gradient: `(top − α |x|).max(0)`.
    pub fn relu_grad(&mut self, x: Value, al: Value, top: Value) -> Value {
        let a = self.abs(x);
        let s = self.mul(al, a);
        let t = self.sub(top, s);
        let zero = self.c(0.0);
        self.max(t, zero)
    }

    /// A Rust element function on every lane: a call per lane.
    pub fn call(&mut self, callee: Callee, args: &[Value]) -> Value {
        let f = self
            .calls
            .iter()
            .find(|(c, _)| *c == callee)
            .map(|&(_, f)| f)
            .unwrap_or_else(|| {
                panic!("{callee:?} not imported: the lowering imports every callee it uses")
            });
        if !self.ty.is_vector() {
            let inst = self.b.ins().call(f, args);
            return self.b.inst_results(inst)[0];
        }
        let mut out = args[0];
        for l in 0..self.ty.lane_count() as u8 {
            let lanes: Vec<Value> = args
                .iter()
                .map(|&a| self.b.ins().extractlane(a, l))
                .collect();
            let inst = self.b.ins().call(f, &lanes);
            let r = self.b.inst_results(inst)[0];
            out = self.b.ins().insertlane(out, r, l);
        }
        out
    }
}
