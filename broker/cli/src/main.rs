//! `relay`: see the crate's library ([`relay_cli`]) for its parts.

fn main() -> std::process::ExitCode {
    relay_cli::main()
}
