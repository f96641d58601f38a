//! `relay`: see the crate's library ([`relay_cli`]) for its parts.
//!
//! # The allocator: jemalloc
//! The broker frees on one thread most of what it allocates on another: a delta's text
//! is read on the harness's task, joined on the runtime's worker, written on the storage
//! thread and published from the publisher's. glibc's allocator keeps only a few freed
//! blocks of a size per thread, and takes the lock of the block's arena for the rest;
//! with the two arenas it was held to (more kept freed memory for good: a
//! 1,000,000-delta flight left 251-373 MB, ops/BENCHMARKS.md parts 2 and 10) those locks
//! were contended: malloc and free were a fifth of the async workers' samples with 64
//! flights in flight, and the lock waits alone 4.5 % in a burst (ops/BENCHMARKS.md part
//! 25). jemalloc's per-thread caches take many more, and hand them back in batches.
//!
//! Its settings ([`malloc_conf`], read when it starts; `_RJEM_MALLOC_CONF` in the
//! environment overrides them): freed pages go back to the system over about a second
//! (`dirty_decay_ms`; its default is 10 s), by a thread of jemalloc's own
//! (`background_thread`), so an idle broker shrinks without allocating. They go back in
//! one step (`MADV_DONTNEED`, which the RSS shows), jemalloc's default since 5.3. mimalloc
//! was tried too: as fast, but on its defaults it kept 290 MB after the burst, and the
//! setting that mattered (`arena_eager_commit`) takes effect as an arena is made, the
//! first likely before `main`: the environment is the one sure way to give it.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings (module header), as the C string it reads.
const MALLOC_CONF: &[u8] = b"background_thread:true,dirty_decay_ms:1000\0";

/// Where jemalloc finds [`MALLOC_CONF`] when it starts: a `const char *` (a thin
/// pointer, as tikv-jemalloc-sys declares it, not a slice's pointer and length).
#[allow(non_upper_case_globals, unsafe_code)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &u8 = &MALLOC_CONF[0];

fn main() -> std::process::ExitCode {
    relay_cli::main()
}
