//! Algorithms by name ([`Algorithm::by_name`]): braintrace's `compile`
//! names and aliases, from the `algorithms!` list of `learn/mod.rs` — an
//! algorithm registered there with its [`Named`] names is found here with
//! no other change.

use super::algorithm::{Algorithm, Named};
use crate::error::{Error, Result};

/// One registered algorithm: its names and its default configuration.
pub(crate) struct Entry {
    names: &'static [&'static str],
    make: fn() -> Algorithm,
}

fn make<T: Named>() -> Algorithm {
    Algorithm::new(T::named())
}

impl Entry {
    /// The entry of `T`.
    pub(crate) fn of<T: Named>() -> Self {
        Entry {
            names: T::NAMES,
            make: make::<T>,
        }
    }
}

impl Algorithm {
    /// The algorithm braintrace's `compile(model, name)` picks, with its
    /// default options: `"d_rtrl"`, `"pp_prop"` (aliases `"es_d_rtrl"`,
    /// `"esd_rtrl"`; decay 0.95, braintrace has no default), `"eprop"`
    /// (`"e_prop"`), `"ostl_recurrent"`, `"ostl_feedforward"`,
    /// `"three_factor"` (modulator 1), ... — case-insensitive, `-` read as
    /// `_`. An unknown name is an error that lists the known ones.
    ///
    /// ```
    /// use braintrace_core::learn::{Algorithm, EProp};
    ///
    /// let a = Algorithm::by_name("E_Prop")?;
    /// assert_eq!(a.name(), "eprop");
    /// assert!(a.get::<EProp>().is_some());
    /// let err = Algorithm::by_name("bptt").unwrap_err().to_string();
    /// assert!(err.contains("d_rtrl") && err.contains("ostl_recurrent"));
    /// # Ok::<(), braintrace_core::Error>(())
    /// ```
    pub fn by_name(name: &str) -> Result<Algorithm> {
        let key = name.trim().to_lowercase().replace('-', "_");
        super::registered()
            .into_iter()
            .find(|e| e.names.contains(&key.as_str()))
            .map(|e| (e.make)())
            .ok_or_else(|| {
                Error::invalid(
                    "Algorithm::by_name",
                    format!(
                        "unknown algorithm name `{name}`; known names: {}",
                        Self::names().join(", ")
                    ),
                )
            })
    }

    /// Every name [`by_name`](Self::by_name) knows, sorted.
    pub fn names() -> Vec<&'static str> {
        let mut v: Vec<&'static str> = super::registered()
            .iter()
            .flat_map(|e| e.names.iter().copied())
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_gives_its_algorithm() {
        for e in crate::learn::registered() {
            for n in e.names {
                let a = Algorithm::by_name(n).unwrap();
                assert_eq!(a.name(), e.names[0], "{n}");
                let upper = Algorithm::by_name(&n.to_uppercase()).unwrap();
                assert_eq!(format!("{upper:?}"), format!("{a:?}"));
            }
        }
        for n in [
            "d_rtrl",
            "pp_prop",
            "es_d_rtrl",
            "esd_rtrl",
            "eprop",
            "e_prop",
        ] {
            assert!(Algorithm::names().contains(&n), "{n}");
        }
        assert_eq!(Algorithm::by_name("es_d_rtrl").unwrap().name(), "pp_prop");
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let e = Algorithm::by_name("rtrl").unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }));
        let s = e.to_string();
        assert!(s.contains("`rtrl`"), "{s}");
        for n in Algorithm::names() {
            assert!(s.contains(n), "{s} lacks {n}");
        }
    }
}
