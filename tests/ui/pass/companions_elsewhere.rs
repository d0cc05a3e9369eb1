// The primitive in one module, its companions in another, by path.
use braintrace::prelude::*;

pub mod ops {
    use braintrace::prelude::*;

    /// y = x @ w for one sample.
    #[etp_primitive(name = "etp_my_mv")]
    pub fn my_mv(x: &Tensor, w: &Tensor) -> Result<Tensor> {
        x.matmul(w)
    }
}

mod rules {
    use crate::ops::my_mv;
    use braintrace::prelude::*;

    #[yw_to_w(my_mv)]
    fn yw(hidden: &Tensor, trace: &Tensor) -> Result<Tensor> {
        trace.mul(&hidden.expand_dims(0)?)
    }

    #[xy_to_dw(crate::ops::my_mv)]
    fn xy(x: &Tensor, hidden: &Tensor, _w: &Tensor) -> Result<Tensor> {
        x.expand_dims(1)?.matmul(&hidden.expand_dims(0)?)
    }

    #[init_drtrl(super::ops::my_mv)]
    fn drtrl(_x: &Aval, y: &Aval, w: &Aval, n: usize, _p: &my_mv::Params) -> Result<Tensor> {
        Ok(Tensor::zeros(&[w.shape(), &[n]].concat(), y.dtype()))
    }

    #[init_pp(my_mv)]
    fn pp(_x: &Aval, y: &Aval, _w: &Aval, n: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(&[y.shape(), &[n]].concat(), y.dtype()))
    }
}

fn main() -> Result<()> {
    let p = ops::my_mv::primitive();
    assert!(ETP_RULES_YW_TO_W.contains(&p) && ETP_RULES_XY_TO_DW.contains(&p));
    let x = Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3])?;
    assert!(check_rules(&p, &[x, Tensor::ones(&[3, 2], DType::F64)], &Params::new())?.is_ok());
    Ok(())
}
