//! Running a plan's steps that are not fused loops: the matrix products,
//! joins, sums and layout changes it runs into recycled buffers.

use super::*;

impl Plan {
    pub(super) fn run_steps(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        args: Vec<Tensor>,
    ) -> Result<Vec<Tensor>> {
        let g = &*self.graph;
        let prof = profile::enabled();
        for (&v, x) in g.invars.iter().zip(args) {
            self.put(pool, env, v, x);
        }
        for (&v, c) in g.constvars.iter().zip(&g.consts) {
            if self.last_step[v] != NEVER_READ {
                env[v] = Some(c.clone());
            }
        }
        for (s, step) in self.steps.iter().enumerate() {
            let t0 = prof.then(Instant::now);
            match step {
                Step::Eqn {
                    eqn,
                    inputs,
                    kernel,
                    ..
                } => {
                    let e = &g.eqns[*eqn];
                    let y = match kernel {
                        Kernel::Matmul { panels, transposed } => self
                            .matmul(
                                pool,
                                env,
                                e.prim.as_ref(),
                                inputs,
                                e.outputs[0],
                                (*panels, *transposed),
                            )
                            .map(Some)?,
                        Kernel::Transpose => {
                            let p = e.prim.as_ref();
                            let Some(Planned::Transpose { perm }) = p.planned() else {
                                return Err(Error::invalid(p.name(), "planned as a transpose"));
                            };
                            self.layout(pool, env, p, inputs[0], e.outputs[0], PermuteBy(perm))
                                .map(Some)?
                        }
                        Kernel::Concat { axis } => self
                            .concat(pool, env, e.prim.as_ref(), inputs, e.outputs[0], *axis)
                            .map(Some)?,
                        Kernel::SumAll => self
                            .sum_all(pool, env, e.prim.as_ref(), inputs[0], e.outputs[0])
                            .map(Some)?,
                        Kernel::Reshape => {
                            let shape = self.graph.avals[e.outputs[0]].shape();
                            self.layout(
                                pool,
                                env,
                                e.prim.as_ref(),
                                inputs[0],
                                e.outputs[0],
                                ReshapeTo(shape),
                            )
                            .map(Some)?
                        }
                        Kernel::Eval => {
                            let mut ins = std::mem::take(&mut pool.ins);
                            ins.clear();
                            for &(v, last) in inputs {
                                let x = if last { env[v].take() } else { env[v].clone() };
                                ins.push(x.ok_or_else(|| undefined(e.prim.as_ref(), v))?);
                            }
                            let outs = e.prim.eval(&ins);
                            for (&(v, last), x) in inputs.iter().zip(ins.drain(..)) {
                                if last {
                                    pool.recycle(x, self.class_of[v]);
                                }
                            }
                            pool.ins = ins;
                            let outs = outs?;
                            if outs.len() != e.outputs.len() {
                                return Err(Error::invalid(
                                    e.prim.name(),
                                    format!(
                                        "eval returned {} value(s) for an equation with {} \
                                         output(s)",
                                        outs.len(),
                                        e.outputs.len()
                                    ),
                                ));
                            }
                            for (&v, x) in e.outputs.iter().zip(outs) {
                                self.put(pool, env, v, x);
                            }
                            None
                        }
                    };
                    // The planned kernels write the one output.
                    if let Some(y) = y {
                        self.put(pool, env, e.outputs[0], y);
                    }
                }
                Step::Fused(f) => {
                    match f.dtype {
                        DType::F32 => run_fused::<f32>(g, f, env, pool, &self.class_of)?,
                        DType::F64 => run_fused::<f64>(g, f, env, pool, &self.class_of)?,
                        d => unreachable!("only float groups are formed, got {d}"),
                    }
                    for &v in f
                        .inputs
                        .iter()
                        .chain(f.scalars.iter().chain(&f.rows).map(|(v, _)| v))
                    {
                        if self.last_step[v] == s {
                            if let Some(t) = env[v].take() {
                                pool.recycle(t, self.class_of[v]);
                            }
                        }
                    }
                }
            }
            if let Some(t0) = t0 {
                let (op, shapes) = match step {
                    Step::Eqn { label, .. } => label,
                    Step::Fused(f) => &f.label,
                };
                profile::record(op, shapes, t0.elapsed());
            }
        }
        g.outvars
            .iter()
            .zip(&self.out_moves)
            .map(|(&v, &moved)| {
                let t = if moved { env[v].take() } else { env[v].clone() };
                t.ok_or_else(|| {
                    Error::invalid(
                        "graph evaluation",
                        format!(
                            "output variable {} is never defined",
                            crate::graph::var_name(v)
                        ),
                    )
                })
            })
            .collect()
    }

    /// A 2-D matrix product into a recycled buffer, in the memory order
    /// `ndarray`'s `dot` (the primitive's `eval`) gives it, by the same
    /// `matrixmultiply` call: bit for bit the interpreter's result.
    pub(super) fn matmul(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        inputs: &[(VarId, bool)],
        out: VarId,
        (panels, transposed): (Option<usize>, bool),
    ) -> Result<Tensor> {
        let class = self.class_of[out];
        let arg = |i: usize| {
            let v = inputs[i].0;
            env[v]
                .as_ref()
                .ok_or_else(|| undefined(p, v))?
                .data_for("matmul")
        };
        let y = match (arg(0)?, arg(1)?) {
            (ArrayData::F32(a), ArrayData::F32(b)) => {
                match (
                    a.view().into_dimensionality::<Ix2>(),
                    right(b, transposed).into_dimensionality::<Ix2>(),
                ) {
                    (Ok(av), Ok(bv))
                        if av.ncols() == bv.nrows() && sgemm::applies(&av, bv.ncols()) =>
                    {
                        let keep = match panels {
                            Some(slot) => Some((
                                env[inputs[1].0]
                                    .as_ref()
                                    .ok_or_else(|| undefined(p, inputs[1].0))?,
                                slot,
                            )),
                            None => None,
                        };
                        Self::sgemm_into(pool, class, av, bv, keep)
                    }
                    _ => matmul_into(pool, class, a.view(), right(b, transposed))?,
                }
            }
            (ArrayData::F64(a), ArrayData::F64(b)) => {
                matmul_into(pool, class, a.view(), right(b, transposed))?
            }
            (a, b) => {
                return Err(Error::dtype_with(
                    "matmul",
                    "rhs",
                    [a.dtype()],
                    b.dtype(),
                    format!(
                        "planned for two floats of one dtype; lhs {}, rhs {}",
                        a.dtype(),
                        b.dtype()
                    ),
                ))
            }
        };
        self.release(pool, env, inputs);
        Ok(y)
    }

    /// Bind `v` to `x`, or give `x`'s buffer back when nothing reads `v`.
    pub(super) fn put(&self, pool: &mut Pool, env: &mut [Option<Tensor>], v: VarId, x: Tensor) {
        if self.last_step[v] != NEVER_READ {
            env[v] = Some(x);
        } else {
            pool.recycle(x, self.class_of[v]);
        }
    }

    /// Give back the buffers of the operands read for the last time.
    pub(super) fn release(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        inputs: &[(VarId, bool)],
    ) {
        for &(v, last) in inputs {
            if last {
                if let Some(t) = env[v].take() {
                    pool.recycle(t, self.class_of[v]);
                }
            }
        }
    }

    /// A concatenation into a recycled buffer, by the loop `eval` runs
    /// (the same elements in the same row-major layout).
    pub(super) fn concat(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        inputs: &[(VarId, bool)],
        out: VarId,
        axis: usize,
    ) -> Result<Tensor> {
        let shape = self.graph.avals[out].shape();
        let class = self.class_of[out];
        fn join<T: PoolFloat>(
            pool: &mut Pool,
            class: Option<usize>,
            env: &[Option<Tensor>],
            (p, inputs): (&dyn Primitive, &[(VarId, bool)]),
            axis: usize,
            shape: &[usize],
        ) -> Result<Tensor> {
            // The parts' row-major elements, in a list that keeps its
            // allocation from call to call.
            let mut parts: Vec<Cow<[T]>> = recast(std::mem::take(&mut pool.spare_elems[0]));
            for &(v, _) in inputs {
                let t = env[v].as_ref().ok_or_else(|| undefined(p, v))?;
                let a = T::array(t.data_for("concatenate")?).ok_or_else(|| {
                    Error::dtype_with(
                        "concatenate",
                        format!("operand of shape {:?}", t.shape()),
                        [T::dtype()],
                        t.dtype(),
                        "planned for operands of one float dtype",
                    )
                })?;
                parts.push(elements(a, Order::C));
            }
            let mut v = take::<T>(pool, class, shape, false);
            concat_rows_into(&parts, axis, shape, v.slice_mut());
            pool.spare_elems[0] = recast(parts);
            v.into_tensor(shape, false)
        }
        let y = match self.graph.avals[out].dtype() {
            DType::F32 => join::<f32>(pool, class, env, (p, inputs), axis, shape)?,
            DType::F64 => join::<f64>(pool, class, env, (p, inputs), axis, shape)?,
            d => unreachable!("only float joins are planned, got {d}"),
        };
        self.release(pool, env, inputs);
        Ok(y)
    }

    /// The sum of every element into a recycled one-element buffer, added
    /// in the order `eval` adds them ([`sum_all`]): the same bits.
    pub(super) fn sum_all(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        (v, last): (VarId, bool),
        out: VarId,
    ) -> Result<Tensor> {
        let shape = self.graph.avals[out].shape();
        let class = self.class_of[out];
        fn total<T: PoolFloat>(
            pool: &mut Pool,
            class: Option<usize>,
            x: &Tensor,
            shape: &[usize],
        ) -> Result<Tensor> {
            let a = T::array(x.data_for("sum")?).ok_or_else(|| {
                Error::dtype_with(
                    "sum",
                    format!("operand of shape {:?}", x.shape()),
                    [T::dtype()],
                    x.dtype(),
                    "planned for a float",
                )
            })?;
            let s = sum_all(&elements(a, Order::C));
            let mut b = take::<T>(pool, class, shape, false);
            b.slice_mut()[0] = s;
            b.into_tensor(shape, false)
        }
        let x = env[v].as_ref().ok_or_else(|| undefined(p, v))?;
        let y = match x.dtype() {
            DType::F32 => total::<f32>(pool, class, x, shape)?,
            DType::F64 => total::<f64>(pool, class, x, shape)?,
            d => unreachable!("only float sums are planned, got {d}"),
        };
        self.release(pool, env, &[(v, last)]);
        Ok(y)
    }

    /// A few-row `f32` product by [`sgemm`] (as the interpreter's `eval`
    /// runs it: the same bits) into a recycled buffer. `keep`: the right
    /// operand's tensor and its [`Pool::panels`] slot, when the operand's
    /// panels are kept for the next call.
    pub(super) fn sgemm_into(
        pool: &mut Pool,
        class: Option<usize>,
        a: ndarray::ArrayView2<'_, f32>,
        b: ndarray::ArrayView2<'_, f32>,
        keep: Option<(&Tensor, usize)>,
    ) -> Tensor {
        let (m, n) = (a.nrows(), b.ncols());
        let mut c = take::<f32>(pool, class, &[m, n], false);
        let pack = match keep {
            Some((b_t, slot)) => !matches!(&pool.panels[slot], Some((t, _)) if t.ptr_eq(b_t)),
            None => true,
        };
        #[cfg(test)]
        {
            pool.packs += usize::from(pack);
        }
        let fresh;
        let panels = match keep {
            Some((b_t, slot)) => {
                if pack {
                    pool.panels[slot] = Some((b_t.clone(), sgemm::PackedB::new(&b)));
                }
                &pool.panels[slot].as_ref().expect("packed above").1
            }
            None => {
                fresh = sgemm::PackedB::new(&b);
                &fresh
            }
        };
        sgemm::gemm(&a, panels, c.slice_mut());
        c.into_tensor(&[m, n], false).expect("m · n elements")
    }

    /// A float layout change the plan runs itself (reshape, transpose):
    /// the operand is moved in on its last read (so a unique buffer can be
    /// reused), `f32`/`f64` pick `change`'s loop, and the operand is
    /// recycled when its buffer was not taken.
    pub(super) fn layout<L: LayoutChange>(
        &self,
        pool: &mut Pool,
        env: &mut [Option<Tensor>],
        p: &dyn Primitive,
        (v, last): (VarId, bool),
        out: VarId,
        change: L,
    ) -> Result<Tensor> {
        let x = if last { env[v].take() } else { env[v].clone() };
        let x = x.ok_or_else(|| undefined(p, v))?;
        let class = self.class_of[out];
        let (y, back) = match x.dtype() {
            DType::F32 => change.apply::<f32>(pool, class, x),
            DType::F64 => change.apply::<f64>(pool, class, x),
            d => {
                return Err(Error::dtype_with(
                    L::NAME,
                    format!("operand of shape {:?}", x.shape()),
                    DType::FLOATS,
                    d,
                    "planned for a float operand",
                ))
            }
        }?;
        if let Some(x) = back {
            pool.recycle(x, self.class_of[v]);
        }
        Ok(y)
    }
}

/// A float layout change run by [`Plan::layout`].
pub(super) trait LayoutChange {
    const NAME: &'static str;
    /// The result, and `x` back when its buffer was not taken (for the
    /// caller to recycle).
    fn apply<T: PoolFloat>(
        &self,
        pool: &mut Pool,
        class: Option<usize>,
        x: Tensor,
    ) -> Result<(Tensor, Option<Tensor>)>;
}

/// A reshape to this shape: the operand's buffer when it is unique and
/// row-major (no copy), else a row-major copy into a recycled buffer; in
/// both cases the interpreter's row-major result.
pub(super) struct ReshapeTo<'a>(&'a [usize]);

impl LayoutChange for ReshapeTo<'_> {
    const NAME: &'static str = "reshape";
    fn apply<T: PoolFloat>(
        &self,
        pool: &mut Pool,
        class: Option<usize>,
        x: Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let bad = |e: ndarray::ShapeError| Error::invalid("reshape", e.to_string());
        let a = T::array(x.data_for("reshape")?)
            .ok_or_else(|| Error::invalid("reshape", "operand of another dtype"))?;
        if order_of(a) == Some(Order::C) && x.is_unique() {
            // Unique and row-major: the buffer itself, in its own handle,
            // no copy.
            let mut x = x;
            let a = unique_array_mut::<T>(&mut x).expect("unique, of type T");
            change_in_place(a, |a| a.into_shape_with_order(IxDyn(self.0)).map_err(bad))?;
            return Ok((x, None));
        }
        let mut v = take::<T>(pool, class, self.0, false);
        copy_blocks(v.slice_mut(), row_major_of(&standard_layout(a)));
        Ok((v.into_tensor(self.0, false)?, Some(x)))
    }
}

/// A transpose by this permutation, as `eval` does it (the operand's buffer
/// with its strides permuted): the operand's own buffer when it is unique,
/// else a copy into a recycled buffer.
pub(super) struct PermuteBy<'a>(&'a [usize]);

impl LayoutChange for PermuteBy<'_> {
    const NAME: &'static str = "transpose";
    fn apply<T: PoolFloat>(
        &self,
        pool: &mut Pool,
        class: Option<usize>,
        x: Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if x.is_unique() {
            let a = x.into_array::<T>()?;
            return Ok((T::tensor(a.permuted_axes(IxDyn(self.0))), None));
        }
        let a = T::array(x.data_for("transpose")?)
            .ok_or_else(|| Error::invalid("transpose", "operand of another dtype"))?;
        let y = match a.as_slice() {
            Some(s) => {
                let mut v = take::<T>(pool, class, a.shape(), false);
                copy_blocks(v.slice_mut(), s);
                v.into_array(a.raw_dim(), false)?
            }
            // Same strides, through ndarray's clone.
            None => a.clone(),
        };
        Ok((T::tensor(y.permuted_axes(IxDyn(self.0))), Some(x)))
    }
}

/// A product's right operand: `b`, or with `transposed` its transpose as
/// `transpose` leaves it (strides permuted, where `b` lies).
pub(super) fn right<T>(b: &ArrayD<T>, transposed: bool) -> ArrayViewD<'_, T> {
    if transposed {
        b.view().reversed_axes()
    } else {
        b.view()
    }
}

pub(super) fn matmul_into<T: PoolFloat + LinalgScalar>(
    pool: &mut Pool,
    class: Option<usize>,
    a: ArrayViewD<'_, T>,
    b: ArrayViewD<'_, T>,
) -> Result<Tensor> {
    let bad = |why: String| Error::invalid("matmul", why);
    let a = a
        .into_dimensionality::<Ix2>()
        .map_err(|e| bad(e.to_string()))?;
    let b = b
        .into_dimensionality::<Ix2>()
        .map_err(|e| bad(e.to_string()))?;
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    if k != k2 {
        return Err(bad(format!(
            "operands {:?} and {:?} do not chain (the plan expected they would)",
            a.shape(),
            b.shape()
        )));
    }
    // `dot`'s choice: column-major when both operands step by one down
    // their rows.
    let column_major = a.strides()[0] == 1 && b.strides()[0] == 1;
    let mut c = take::<T>(pool, class, &[m, n], column_major)
        .into_array(IxDyn(&[m, n]), column_major)?
        .into_dimensionality::<Ix2>()
        .map_err(|e| bad(e.to_string()))?;
    // β = 0: the buffer's old contents are overwritten, never read.
    general_mat_mul(T::one(), &a, &b, T::zero(), &mut c);
    Ok(T::tensor(c.into_dyn()))
}

pub(super) fn undefined(p: &dyn Primitive, v: VarId) -> Error {
    Error::invalid(
        p.name(),
        format!(
            "operand {} is read before it is defined (the graph is not in SSA order)",
            crate::graph::var_name(v)
        ),
    )
}
