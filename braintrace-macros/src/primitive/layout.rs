//! Where `x` and the trainables are among the arguments.

use super::{Arg, ArgKind};
use crate::attr::{PrimitiveArgs, TrainableSpec};
use crate::ctxt::Ctxt;
use crate::symbol::*;
use proc_macro2::{Ident, Span};
use syn::ext::IdentExt;

/// Where `x` and the trainables are, from the flags or the seed's defaults
/// (x = the first operand, weight = the first other operand). A flag naming
/// a bad argument is reported and replaced by its default, so the rest of
/// the expansion (and the companions) see a sound layout.
pub(super) fn layout(
    cx: &mut Ctxt,
    flags: &PrimitiveArgs,
    args: &[Arg],
    fn_name: &str,
) -> (Option<usize>, Vec<(String, usize)>) {
    let operands: Vec<&Arg> = args.iter().filter(|a| a.kind != ArgKind::Param).collect();
    let operand_list = || {
        operands
            .iter()
            .map(|a| format!("`{}`", a.ident))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Resolve an argument named by a flag to its operand index.
    let resolve = |cx: &mut Ctxt, id: &Ident, flag: &str| -> Option<usize> {
        match args.iter().find(|a| a.ident.unraw() == id.unraw()) {
            Some(Arg {
                kind: ArgKind::Operand(i),
                ..
            }) => Some(*i),
            Some(_) => {
                cx.error(id.span(), format!("`{flag} = {id}` names a `#[param]` argument; `{flag}` must be a `&Tensor` operand (operands: {})", operand_list()));
                None
            }
            None => {
                cx.error(
                    id.span(),
                    format!(
                        "`{flag} = {id}` names no argument of `{fn_name}`; its operands are {}",
                        operand_list()
                    ),
                );
                None
            }
        }
    };

    // Trainables as written (`None`: absent, or unusable and reported).
    let mut named: Option<Vec<(String, usize, Span)>> = None;
    if let Some((_, spec)) = &flags.trainables {
        let entries: Vec<(String, &Ident, Span)> = match spec {
            TrainableSpec::Args(ids) => {
                let single = ids.len() == 1;
                ids.iter()
                    .map(|id| {
                        (
                            if single {
                                SINGLE_TRAINABLE.to_string()
                            } else {
                                id.unraw().to_string()
                            },
                            id,
                            id.span(),
                        )
                    })
                    .collect()
            }
            TrainableSpec::Named(pairs) => pairs
                .iter()
                .map(|(k, id)| (k.unraw().to_string(), id, k.span()))
                .collect(),
        };
        let flag = if matches!(spec, TrainableSpec::Args(_)) {
            WEIGHT
        } else {
            TRAINABLES
        };
        let mut ok = true;
        let mut list: Vec<(String, usize, Span)> = Vec::new();
        for (key, id, span) in entries {
            let Some(i) = resolve(cx, id, flag) else {
                ok = false;
                continue;
            };
            if list.iter().any(|(_, j, _)| *j == i) {
                cx.error(
                    id.span(),
                    format!("operand `{id}` is listed twice as a trainable"),
                );
            } else if list.iter().any(|(k, _, _)| *k == key) {
                cx.error(span, format!("trainable name `{key}` is used twice"));
            } else {
                list.push((key, i, span));
            }
        }
        if ok && !list.is_empty() {
            named = Some(list);
        }
    }

    // x: explicit, else the first operand (unless it is an explicit trainable).
    let is_trainable = |i: usize, named: &Option<Vec<(String, usize, Span)>>| {
        named
            .as_ref()
            .is_some_and(|n| n.iter().any(|(_, j, _)| *j == i))
    };
    let default_x = |named: &Option<Vec<(String, usize, Span)>>| {
        if operands.is_empty() || is_trainable(0, named) {
            None
        } else {
            Some(0)
        }
    };
    let x = match &flags.x {
        Some(Some(id)) => match resolve(cx, id, X) {
            Some(i) if is_trainable(i, &named) => {
                cx.error(
                    id.span(),
                    format!("`{id}` is both `x` and a trainable; an operand is one or the other"),
                );
                None
            }
            Some(i) => Some(i),
            None => default_x(&named),
        },
        Some(None) => None,
        None => {
            if let (Some(list), false) = (&named, operands.is_empty()) {
                if let Some((_, _, span)) = list.iter().find(|(_, j, _)| *j == 0) {
                    cx.error(
                        *span,
                        format!("`x` defaults to the first operand `{}`, which is listed as a trainable; say which operand is `x` (`x = <arg>`), or write `x = none`", operands[0].ident),
                    );
                }
            }
            default_x(&named)
        }
    };

    // Trainables: as written, else the first operand that is not `x`.
    let named = match named {
        Some(list) => list,
        None => match (0..operands.len()).find(|i| Some(*i) != x) {
            Some(i) => vec![(SINGLE_TRAINABLE.to_string(), i, Span::call_site())],
            None => {
                if let Some(only) = operands.first().map(|a| &a.ident) {
                    if flags.trainables.is_none() {
                        cx.error(
                            only.span(),
                            format!("`{fn_name}` has one operand `{only}`, which is `x`: an ETP primitive needs a trainable operand; write `x = none, weight = {only}` if `{only}` is trainable"),
                        );
                    }
                }
                Vec::new()
            }
        },
    };
    (x, named.into_iter().map(|(k, i, _)| (k, i)).collect())
}
