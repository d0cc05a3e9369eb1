//! The ETP rules a primitive carries: their names, the arguments each
//! companion function takes (by role), and the runtime types they adapt to.
//! The primitive and the companion expansions both read this one table.

use proc_macro2::{Ident, Span};

/// One rule of an ETP primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// `yw_to_w(hidden, trace[, p]) -> trace`.
    YwToW,
    /// `xy_to_dw(x, hidden, w[, p]) -> dW`.
    XyToDw,
    /// `init_drtrl(x, y, w, num_hidden_state[, p]) -> zeros`.
    InitDrtrl,
    /// `init_pp(x, y, w, num_hidden_state[, p]) -> zeros`.
    InitPp,
    /// Optional `instant_drtrl(x, hidden, w[, p]) -> trace`.
    InstantDrtrl,
    /// Optional `solve_drtrl(g, trace, w[, p]) -> dW`.
    SolveDrtrl,
}

/// What one argument of a companion function stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A `y`-shaped tensor (`hidden`).
    Hidden,
    /// The solve's `g` (also `y`-shaped).
    G,
    /// The trace slots (`&Tensor` or `&TensorMap`).
    Trace,
    /// The trainable values (`&Tensor` or `&TensorMap`).
    Weight,
    /// `x` as a tensor (`&Tensor` or `Option<&Tensor>`).
    X,
    /// `x` as an abstract value (`&Aval` or `Option<&Aval>`).
    XAval,
    /// `y` as an abstract value.
    YAval,
    /// The trainables as abstract values (`&Aval` or `&AvalMap`).
    WeightAval,
    /// `num_hidden_state: usize`.
    Count,
}

/// What a rule returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// One tensor per trainable (`Result<Tensor>` or `Result<TensorMap>`).
    Map,
    /// One tensor (`Result<Tensor>`).
    Tensor,
}

impl Rule {
    /// Every rule, required ones first.
    pub const ALL: [Rule; 6] = [
        Rule::YwToW,
        Rule::XyToDw,
        Rule::InitDrtrl,
        Rule::InitPp,
        Rule::InstantDrtrl,
        Rule::SolveDrtrl,
    ];

    /// The rule's name, which is also its attribute's name.
    pub fn name(self) -> &'static str {
        match self {
            Rule::YwToW => "yw_to_w",
            Rule::XyToDw => "xy_to_dw",
            Rule::InitDrtrl => "init_drtrl",
            Rule::InitPp => "init_pp",
            Rule::InstantDrtrl => "instant_drtrl",
            Rule::SolveDrtrl => "solve_drtrl",
        }
    }

    /// Whether a primitive without this rule must not compile.
    pub fn required(self) -> bool {
        !matches!(self, Rule::InstantDrtrl | Rule::SolveDrtrl)
    }

    /// The runtime rule type (`braintrace::etp::YwToW`, ...).
    pub fn runtime_type(self, span: Span) -> Ident {
        let s = match self {
            Rule::YwToW => "YwToW",
            Rule::XyToDw => "XyToDw",
            Rule::InitDrtrl => "InitDrtrl",
            Rule::InitPp => "InitPp",
            Rule::InstantDrtrl => "InstantDrtrl",
            Rule::SolveDrtrl => "SolveDrtrl",
        };
        Ident::new(s, span)
    }

    /// The completeness trait generated in the primitive's module; the
    /// companion implements it for the module's `Rules`.
    pub fn trait_ident(self, span: Span) -> Ident {
        Ident::new(&format!("{}Rule", self.runtime_type(span)), span)
    }

    /// The method of the optional rules' autoref dispatch.
    pub fn optional_method(self, span: Span) -> Ident {
        Ident::new(&format!("__braintrace_{}", self.name()), span)
    }

    /// The companion's arguments before the optional trailing params.
    pub fn roles(self) -> &'static [Role] {
        match self {
            Rule::YwToW => &[Role::Hidden, Role::Trace],
            Rule::XyToDw | Rule::InstantDrtrl => &[Role::X, Role::Hidden, Role::Weight],
            Rule::InitDrtrl | Rule::InitPp => {
                &[Role::XAval, Role::YAval, Role::WeightAval, Role::Count]
            }
            Rule::SolveDrtrl => &[Role::G, Role::Trace, Role::Weight],
        }
    }

    /// What the rule returns.
    pub fn output(self) -> Output {
        match self {
            Rule::InitPp => Output::Tensor,
            _ => Output::Map,
        }
    }

    /// The runtime closure's argument that keys a map result.
    pub fn output_keys(self) -> Role {
        match self {
            Rule::YwToW | Rule::SolveDrtrl => Role::Trace,
            Rule::XyToDw | Rule::InstantDrtrl => Role::Weight,
            Rule::InitDrtrl | Rule::InitPp => Role::WeightAval,
        }
    }

    /// The companion's signature as a user writes it, for notes and errors.
    /// `keyed`: several trainables; `has_x`: the primitive has an `x`.
    pub fn signature(self, params: &str, keyed: bool, has_x: bool) -> String {
        let args: Vec<String> = self
            .roles()
            .iter()
            .map(|r| format!("{}: {}", r.arg_name(), r.user_type(keyed, has_x)))
            .collect();
        let out = match self.output() {
            Output::Tensor => "Tensor",
            Output::Map if keyed => "TensorMap",
            Output::Map => "Tensor",
        };
        format!("fn({}, p: &{params}) -> Result<{out}>", args.join(", "))
    }

    /// The accepted argument lists, for the wrong-arity error.
    pub fn generic_signature(self, params: &str) -> String {
        let args: Vec<String> = self
            .roles()
            .iter()
            .map(|r| format!("{}: {}", r.arg_name(), r.generic_type()))
            .collect();
        let out = match self.output() {
            Output::Tensor => "Tensor",
            Output::Map => "Tensor | TensorMap",
        };
        format!("({}[, p: &{params}]) -> Result<{out}>", args.join(", "))
    }
}

impl Role {
    /// The argument's conventional name.
    pub fn arg_name(self) -> &'static str {
        match self {
            Role::Hidden => "hidden",
            Role::G => "g",
            Role::Trace => "trace",
            Role::Weight | Role::WeightAval => "w",
            Role::X | Role::XAval => "x",
            Role::YAval => "y",
            Role::Count => "num_hidden_state",
        }
    }

    /// The identifier of the runtime closure's parameter for this role.
    pub fn closure_ident(self, span: Span) -> Ident {
        let s = match self {
            Role::Hidden => "__hidden",
            Role::G => "__g",
            Role::Trace => "__trace",
            Role::Weight | Role::WeightAval => "__weights",
            Role::X | Role::XAval => "__x",
            Role::YAval => "__y",
            Role::Count => "__num_hidden_state",
        };
        Ident::new(s, span)
    }

    /// The conversion trait in `__private` and whether it is generic over
    /// the primitive's trainable arity (`A`) or its `x` (`X`).
    pub fn conversion(self) -> (&'static str, Generic) {
        match self {
            Role::Hidden | Role::G => ("HiddenArg", Generic::None),
            Role::Trace => ("TraceArg", Generic::Arity),
            Role::Weight => ("WeightArg", Generic::Arity),
            Role::X => ("XArg", Generic::X),
            Role::XAval => ("XAvalArg", Generic::X),
            Role::YAval => ("YAvalArg", Generic::None),
            Role::WeightAval => ("WeightAvalArg", Generic::Arity),
            Role::Count => ("CountArg", Generic::None),
        }
    }

    /// Whether the conversion reports the rule name on failure.
    pub fn takes_rule_name(self) -> bool {
        matches!(self.conversion().1, Generic::Arity | Generic::X)
    }

    fn user_type(self, keyed: bool, has_x: bool) -> &'static str {
        match self {
            Role::Hidden | Role::G => "&Tensor",
            Role::Trace | Role::Weight if keyed => "&TensorMap",
            Role::Trace | Role::Weight => "&Tensor",
            Role::X if has_x => "&Tensor",
            Role::X => "Option<&Tensor>",
            Role::XAval if has_x => "&Aval",
            Role::XAval => "Option<&Aval>",
            Role::YAval => "&Aval",
            Role::WeightAval if keyed => "&AvalMap",
            Role::WeightAval => "&Aval",
            Role::Count => "usize",
        }
    }

    fn generic_type(self) -> &'static str {
        match self {
            Role::Hidden | Role::G => "&Tensor",
            Role::Trace | Role::Weight => "&Tensor | &TensorMap",
            Role::X => "&Tensor | Option<&Tensor>",
            Role::XAval => "&Aval | Option<&Aval>",
            Role::YAval => "&Aval",
            Role::WeightAval => "&Aval | &AvalMap",
            Role::Count => "usize",
        }
    }
}

/// The extra type parameter of a conversion trait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generic {
    /// None.
    None,
    /// The primitive's trainable arity (`Single` / `Keyed`).
    Arity,
    /// Whether the primitive has `x` (`WithX` / `NoX`).
    X,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_signatures() {
        assert_eq!(
            Rule::YwToW.signature("mm::Params", false, true),
            "fn(hidden: &Tensor, trace: &Tensor, p: &mm::Params) -> Result<Tensor>"
        );
        assert_eq!(
            Rule::XyToDw.signature("e::Params", true, false),
            "fn(x: Option<&Tensor>, hidden: &Tensor, w: &TensorMap, p: &e::Params) -> Result<TensorMap>"
        );
        assert_eq!(
            Rule::InitPp.signature("mm::Params", true, true),
            "fn(x: &Aval, y: &Aval, w: &AvalMap, num_hidden_state: usize, p: &mm::Params) -> Result<Tensor>"
        );
    }

    #[test]
    fn rule_names_and_traits() {
        for r in Rule::ALL {
            assert!(r
                .trait_ident(Span::call_site())
                .to_string()
                .ends_with("Rule"));
            assert_eq!(
                r.required(),
                !r.name().contains("drtrl") || r == Rule::InitDrtrl
            );
        }
    }
}
