//! Text from agents and models made inert before a terminal shows it: the printing
//! macros every command uses, over [`relay_protocol::text`] (the escaping rule, shared
//! with the broker and the dashboard).

pub use relay_protocol::text::{inert, json_inert, one_line};

/// `println!` for text that may hold agent or model output: made inert first.
macro_rules! outln {
    () => { println!() };
    ($($t:tt)*) => { println!("{}", $crate::terminal::inert(&format!($($t)*))) };
}
/// `print!`, inert (see [`outln`]).
macro_rules! out {
    ($($t:tt)*) => { print!("{}", $crate::terminal::inert(&format!($($t)*))) };
}
/// `eprintln!`, inert (see [`outln`]).
macro_rules! errln {
    ($($t:tt)*) => { eprintln!("{}", $crate::terminal::inert(&format!($($t)*))) };
}
/// `println!` of JSON text: made inert the JSON way ([`json_inert`]), so it stays JSON.
macro_rules! jsonln {
    ($json:expr) => {
        println!("{}", $crate::terminal::json_inert($json))
    };
}
pub(crate) use {errln, jsonln, out, outln};
