//! Comparisons, `select`, `cast` and `stop_gradient`.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------- compare

/// Comparisons, producing bool tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
}

/// An element-wise comparison of equal-shaped operands (no derivative).
#[derive(Clone, Debug)]
pub struct Compare(pub CompareOp);

impl Compare {
    fn test<T: PartialOrd>(&self, a: T, b: T) -> bool {
        match self.0 {
            CompareOp::Gt => a > b,
            CompareOp::Ge => a >= b,
            CompareOp::Lt => a < b,
            CompareOp::Le => a <= b,
            CompareOp::Eq => a == b,
            CompareOp::Ne => a != b,
        }
    }
}

impl Primitive for Compare {
    fn name(&self) -> String {
        match self.0 {
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
        }
        .to_string()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        crate::ops::check_arity(&self.name(), inputs, 2)?;
        same_avals(&self.name(), &inputs[0], &inputs[1])?;
        Ok(vec![inputs[0].with_dtype(DType::Bool)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let avals: Vec<Aval> = inputs.iter().map(Tensor::aval).collect();
        self.abstract_eval(&avals)?;
        let n = self.name();
        fn cmp<T: Copy + PartialOrd>(c: &Compare, a: &ArrayD<T>, b: &ArrayD<T>) -> ArrayD<bool> {
            // Equal shapes (checked): one flat loop over row-major data.
            zip_flat(a, b, a.shape(), |x, y| c.test(x, y))
                .unwrap_or_else(|| Zip::from(a).and(b).map_collect(|&x, &y| c.test(x, y)))
        }
        let r = match (inputs[0].data_for(&n)?, inputs[1].data_for(&n)?) {
            (ArrayData::F32(a), ArrayData::F32(b)) => cmp(self, a, b),
            (ArrayData::F64(a), ArrayData::F64(b)) => cmp(self, a, b),
            (ArrayData::I64(a), ArrayData::I64(b)) => cmp(self, a, b),
            (ArrayData::Bool(a), ArrayData::Bool(b)) => cmp(self, a, b),
            _ => unreachable!("dtypes checked equal"),
        };
        Ok(vec![Tensor::from_array(r)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        _t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((vec![bind1(Arc::new(self.clone()), p)?], vec![None]))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let a = bcast_to_batch(&args[0], batched[0], size)?;
        let b = bcast_to_batch(&args[1], batched[1], size)?;
        Ok((vec![bind1(Arc::new(self.clone()), &[a, b])?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Compare two tensors (broadcasting).
pub fn compare(op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = crate::ops::broadcast_pair("compare", a, b)?;
    bind1(Arc::new(Compare(op)), &[a, b])
}

// ---------------------------------------------------------------- select

/// `where(cond, a, b)` for equal shapes; `cond` is bool.
#[derive(Clone, Debug)]
pub struct Select;

impl Primitive for Select {
    fn name(&self) -> String {
        "select".into()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        crate::ops::check_arity("select", inputs, 3)?;
        if inputs[0].dtype() != DType::Bool {
            return Err(Error::dtype_with(
                "select",
                "condition",
                [DType::Bool],
                inputs[0].dtype(),
                format!("shape {:?}", inputs[0].shape()),
            ));
        }
        if inputs[0].shape() != inputs[1].shape() {
            return Err(Error::shapes(
                "select",
                inputs.iter().map(Aval::shape),
                "condition and values must have equal shapes",
            ));
        }
        same_avals("select", &inputs[1], &inputs[2])?;
        Ok(vec![inputs[1].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let avals: Vec<Aval> = inputs.iter().map(Tensor::aval).collect();
        self.abstract_eval(&avals)?;
        let c = inputs[0].data_for("select")?.as_bool("select")?;
        fn sel<T: Copy>(c: &ArrayD<bool>, a: &ArrayD<T>, b: &ArrayD<T>) -> ArrayD<T> {
            Zip::from(c)
                .and(a)
                .and(b)
                .map_collect(|&c, &x, &y| if c { x } else { y })
        }
        let d = match (inputs[1].data_for("select")?, inputs[2].data_for("select")?) {
            (ArrayData::F32(a), ArrayData::F32(b)) => ArrayData::F32(sel(c, a, b)),
            (ArrayData::F64(a), ArrayData::F64(b)) => ArrayData::F64(sel(c, a, b)),
            (ArrayData::I64(a), ArrayData::I64(b)) => ArrayData::I64(sel(c, a, b)),
            (ArrayData::Bool(a), ArrayData::Bool(b)) => ArrayData::Bool(sel(c, a, b)),
            _ => unreachable!("dtypes checked equal"),
        };
        Ok(vec![Tensor::from_data(d)])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let y = select(&p[0], &p[1], &p[2])?;
        let dt = match (&t[1], &t[2]) {
            (None, None) => None,
            (ta, tb) => {
                let ta = ta.clone().unwrap_or_else(|| zeros_for(&p[1]));
                let tb = tb.clone().unwrap_or_else(|| zeros_for(&p[2]));
                Some(select(&p[0], &ta, &tb)?)
            }
        };
        Ok((vec![y], vec![dt]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let Some(ct) = &cts[0] else {
            return Ok(vec![None, None, None]);
        };
        let c = args[0].known("select")?;
        let z = ct.zeros_like();
        let a = if args[1].is_linear() {
            Some(select(c, ct, &z)?)
        } else {
            None
        };
        let b = if args[2].is_linear() {
            Some(select(c, &z, ct)?)
        } else {
            None
        };
        Ok(vec![None, a, b])
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        let a: Vec<Tensor> = (0..3)
            .map(|i| bcast_to_batch(&args[i], batched[i], size))
            .collect::<Result<_>>()?;
        Ok((vec![bind1(Arc::new(Select), &a)?], vec![true]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `where(cond, a, b)` with broadcasting of all three.
pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shape = crate::ops::broadcast_shapes("select", &[cond.shape(), a.shape(), b.shape()])?;
    let c = lift(cond, &shape)?;
    let a = lift(a, &shape)?;
    let b = lift(b, &shape)?;
    bind1(Arc::new(Select), &[c, a, b])
}

// ---------------------------------------------------------------- cast

/// Convert to another dtype.
#[derive(Clone, Debug)]
pub struct Cast(pub DType);

impl Primitive for Cast {
    fn name(&self) -> String {
        "convert_element_type".into()
    }
    fn params(&self) -> Vec<(String, String)> {
        vec![("new_dtype".into(), self.0.to_string())]
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        crate::ops::check_arity(&self.name(), inputs, 1)?;
        Ok(vec![inputs[0].with_dtype(self.0)])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        crate::ops::check_arity(&self.name(), inputs, 1)?;
        Ok(vec![Tensor::from_data(
            inputs[0].data_for("cast")?.cast(self.0),
        )])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        let y = p[0].cast(self.0)?;
        let dt = match &t[0] {
            Some(t) if self.0.is_float() && p[0].dtype().is_float() => Some(t.cast(self.0)?),
            _ => None,
        };
        Ok((vec![y], vec![dt]))
    }
    fn transpose(&self, cts: &[Option<Tensor>], args: &[LinearArg]) -> Result<Vec<Option<Tensor>>> {
        let back = args[0].aval().dtype();
        Ok(vec![cts[0].as_ref().map(|c| c.cast(back)).transpose()?])
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        Ok((vec![args[0].cast(self.0)?], vec![batched[0]]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

// ---------------------------------------------------------------- stop_gradient

/// Identity whose derivative is zero.
#[derive(Clone, Debug)]
pub struct StopGradient;

impl Primitive for StopGradient {
    fn name(&self) -> String {
        "stop_gradient".into()
    }
    fn abstract_eval(&self, inputs: &[Aval]) -> Result<Vec<Aval>> {
        crate::ops::check_arity("stop_gradient", inputs, 1)?;
        Ok(vec![inputs[0].clone()])
    }
    fn eval(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        crate::ops::check_arity("stop_gradient", inputs, 1)?;
        Ok(vec![inputs[0].clone()])
    }
    fn jvp(
        &self,
        p: &[Tensor],
        _t: &[Option<Tensor>],
    ) -> Result<(Vec<Tensor>, Vec<Option<Tensor>>)> {
        Ok((vec![p[0].stop_gradient()?], vec![None]))
    }
    fn batch(
        &self,
        args: &[Tensor],
        batched: &[bool],
        _size: usize,
    ) -> Result<(Vec<Tensor>, Vec<bool>)> {
        Ok((vec![args[0].stop_gradient()?], vec![batched[0]]))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
