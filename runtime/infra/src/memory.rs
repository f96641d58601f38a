//! glibc's allocator, told at start to give large freed buffers back to the system.
//!
//! # Why
//! A long answer passes through the broker as a few whole copies (the harness's line,
//! the runtime's report, the reply's event, a read-back from the log), each freed once
//! passed on. glibc raises its mmap threshold each time such a block is freed (up to
//! 32 MiB), so the next ones come from its arenas instead, and a freed block there is
//! kept, in up to 8 arenas per core. After a 1,000,000-delta flight (a 32 MB answer) the
//! broker held 251-373 MB, two thirds of it freed (ops/BENCHMARKS.md, part 2 and
//! part 10). With a fixed threshold (which also stops glibc from moving it) and two
//! arenas it holds 92-95 MB, at the same throughput.
//!
//! The threshold is 4 MiB, not lower: every block mapped on its own is zeroed by the
//! kernel a page at a time when first written, and unmapped when freed. At 128 KiB the
//! page faults of the transient copies of a few hundred KB (a replay's texts, its JSON)
//! were a quarter of the broker's time in a replay, which took 8.7-9.8 ms against
//! 4.9 ms at 4 MiB, with the same RSS (ops/BENCHMARKS.md, part 12).
//!
//! # What it changes
//! Only glibc's tunables, and only those the user did not set (through
//! `MALLOC_MMAP_THRESHOLD_`, `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES`, which glibc has read
//! already). Elsewhere than glibc it does nothing.

/// Allocations from this size are mapped on their own, and unmapped when freed.
pub const MMAP_THRESHOLD: i32 = 4 * 1024 * 1024;
/// Arenas glibc may make (its default: 8 per core).
pub const ARENA_MAX: i32 = 2;

/// A setting of glibc's allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    MmapThreshold,
    ArenaMax,
}

/// The knobs to set, given the environment (`var`: a variable's value, if set): those
/// the user did not set.
pub fn wanted(var: impl Fn(&str) -> Option<String>) -> Vec<Knob> {
    let tunables = var("GLIBC_TUNABLES").unwrap_or_default();
    let mut knobs = Vec::new();
    if var("MALLOC_MMAP_THRESHOLD_").is_none() && !tunables.contains("malloc.mmap_threshold") {
        knobs.push(Knob::MmapThreshold);
    }
    if var("MALLOC_ARENA_MAX").is_none() && !tunables.contains("malloc.arena_max") {
        knobs.push(Knob::ArenaMax);
    }
    knobs
}

/// Sets the knobs the user did not set; call first thing in `main`, before any thread
/// starts. Returns those glibc accepted.
pub fn tune_allocator() -> Vec<Knob> {
    wanted(|name| std::env::var(name).ok())
        .into_iter()
        .filter(|knob| set(*knob))
        .collect()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set(knob: Knob) -> bool {
    let (param, value) = match knob {
        Knob::MmapThreshold => (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        Knob::ArenaMax => (libc::M_ARENA_MAX, ARENA_MAX),
    };
    // SAFETY: `mallopt` only sets a parameter of the allocator, under its own lock, and
    // takes no pointer; it returns 0 for a value it refuses, which is then left as it was.
    unsafe { libc::mallopt(param, value) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set(_knob: Knob) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn only_the_knobs_the_user_did_not_set_are_set() {
        assert_eq!(wanted(env(&[])), [Knob::MmapThreshold, Knob::ArenaMax]);
        assert_eq!(
            wanted(env(&[("MALLOC_ARENA_MAX", "8")])),
            [Knob::MmapThreshold]
        );
        assert_eq!(
            wanted(env(&[("MALLOC_MMAP_THRESHOLD_", "65536")])),
            [Knob::ArenaMax]
        );
        assert_eq!(
            wanted(env(&[(
                "GLIBC_TUNABLES",
                "glibc.malloc.mmap_threshold=65536:glibc.malloc.arena_max=4"
            )])),
            []
        );
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_accepts_both() {
        assert!(set(Knob::MmapThreshold));
        assert!(set(Knob::ArenaMax));
    }
}
