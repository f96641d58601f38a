//! One spelling for each enum value. [`wire_enum!`] declares a fieldless enum whose
//! variants each write their wire name once; its serde form (HTTP, `--json`, sled, node
//! JSON), `as_str`, `Display` and `FromStr` (command-line arguments) all come from that
//! list, so they cannot disagree. [`wire_tagged_enum!`] does the same for an enum whose
//! variants carry fields: serde's tag and `type_name`.

/// Declares `enum $name` with `Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize,
/// Deserialize` (add more with `#[derive(...)]`), and:
///
/// - `ALL`: every value, in the order written;
/// - `as_str`: the wire name;
/// - `Display` and `FromStr` through it: `FromStr` also takes the `| "alias"` spellings
///   (serde does not), and its error names the value, `$what` and the expected names.
///
/// ```ignore
/// wire_enum! {
///     pub enum Action("action") {
///         Consult = "consult",
///         Execute = "execute",
///     }
/// }
/// ```
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident($what:literal) {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $wire:literal $(| $alias:literal)*
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                #[serde(rename = $wire)]
                $variant,
            )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($wire),+].len()] = [$($name::$variant),+];

            /// The wire name: the same in JSON, on the command line and in messages.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // `pad`, so a width in a format string (`{:<20}`) lines columns up.
                f.pad(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($wire $(| $alias)* => Ok($name::$variant),)+
                    _ => Err($crate::names::unknown($what, s, &[$($wire),+])),
                }
            }
        }
    };
}

pub(crate) use wire_enum;

/// Declares a serde-tagged enum whose variants carry fields, each variant writing its
/// tag once (`Variant = "tag" { fields }`): the tag serde writes and reads, and
/// `type_name`, the same tag for everything else that names the variant (SSE event
/// names, logs). Put the `#[serde(tag = "...")]` and the derives on the enum.
macro_rules! wire_tagged_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $wire:literal { $($fields:tt)* }
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $(
                $(#[$vmeta])*
                #[serde(rename = $wire)]
                $variant { $($fields)* },
            )+
        }

        impl $name {
            /// The variant's tag, as serde writes it.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $($name::$variant { .. } => $wire,)+
                }
            }
        }
    };
}

pub(crate) use wire_tagged_enum;

/// `unknown wake policy "x"; expected on_demand, keep_warm or manual`.
pub(crate) fn unknown(what: &str, given: &str, names: &[&str]) -> String {
    let expected = match names {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    };
    format!("unknown {what} {given:?}; expected {expected}")
}

#[cfg(test)]
mod tests {
    wire_enum! {
        #[derive(Default)]
        enum Sample("sample") {
            #[default]
            First = "first",
            SecondOne = "second_one" | "secondOne",
        }
    }

    wire_tagged_enum! {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(tag = "type")]
        enum Tagged {
            Plain = "plain" {},
            WithField = "with_field" { n: u8 },
        }
    }

    #[test]
    fn a_tagged_variant_is_named_as_serde_tags_it() {
        for v in [Tagged::Plain {}, Tagged::WithField { n: 1 }] {
            let json = serde_json::to_value(&v).unwrap();
            assert_eq!(json["type"], v.type_name());
            assert_eq!(serde_json::from_value::<Tagged>(json).unwrap(), v);
        }
    }

    #[test]
    fn every_interface_spells_a_value_the_same() {
        for v in Sample::ALL {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{}\"", v.as_str()));
            assert_eq!(v.to_string(), v.as_str());
            assert_eq!(v.as_str().parse::<Sample>(), Ok(v));
            assert_eq!(serde_json::from_str::<Sample>(&json).unwrap(), v);
        }
        assert_eq!(Sample::default(), Sample::First);
        assert_eq!("secondOne".parse::<Sample>(), Ok(Sample::SecondOne));
        assert!(
            serde_json::from_str::<Sample>("\"secondOne\"").is_err(),
            "aliases are for the command line only"
        );
        assert_eq!(
            "third".parse::<Sample>(),
            Err("unknown sample \"third\"; expected first or second_one".to_string())
        );
    }
}
