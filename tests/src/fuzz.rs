//! Fuzzing on the stable toolchain: proptest's runner drives each target (a decoder of
//! bytes from outside) with generated inputs, catches a panic as a crash and shrinks it
//! to a small input. `tests/tests/fuzz/` holds the targets; `ops/fuzz.sh` runs them longer.
//!
//! Inputs are raw bytes, and seeds (real messages of the format) changed: bytes flipped,
//! inserted, deleted, spliced from another seed or replaced by a troublesome token
//! ([`mutated`]); and, for JSON, values swapped at a random path for values of another
//! type or an extreme ([`json_mutated`]), so a typed decoder sees well-formed JSON of the
//! wrong shape, not only syntax errors.
//!
//! How long each target runs: `RELAY_FUZZ_SECS` (seconds per target) when set, else
//! `RELAY_FUZZ_CASES` inputs, else the target's own bounded default (the suite's run).
//! `RELAY_FUZZ_SEED` (64 hex digits) replays a run. Each target prints one line,
//! `fuzz TARGET: N inputs, C crashes (seed S, T s)`, which `ops/fuzz.sh` collects.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use serde_json::{Map, Value};

/// Inputs of one runner; a timed run checks the clock between batches.
const BATCH: u32 = 256;

/// How much of a target to run.
#[derive(Debug, Clone, Copy)]
enum Budget {
    Cases(u64),
    Time(Duration),
}

fn budget(default_cases: u64) -> Budget {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(secs) = var("RELAY_FUZZ_SECS").and_then(|v| v.parse::<f64>().ok()) {
        return Budget::Time(Duration::from_secs_f64(secs.max(0.0)));
    }
    match var("RELAY_FUZZ_CASES").and_then(|v| v.parse::<u64>().ok()) {
        Some(cases) => Budget::Cases(cases),
        None => Budget::Cases(default_cases),
    }
}

fn seed() -> [u8; 32] {
    let given = std::env::var("RELAY_FUZZ_SEED")
        .ok()
        .and_then(|hex| <[u8; 32]>::try_from(relay_protocol::hex::decode(&hex)?).ok());
    given.unwrap_or_else(rand::random)
}

/// Runs `test` on inputs from `strategy` within the budget (`default_cases` in the suite);
/// panics with the shrunk input when one fails or panics.
pub fn fuzz<S>(
    target: &str,
    default_cases: u64,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let budget = budget(default_cases);
    let seed = seed();
    let seed_hex = relay_protocol::hex::encode(&seed);
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
    let started = Instant::now();
    let mut inputs = 0u64;
    loop {
        let batch = match budget {
            Budget::Cases(total) if inputs >= total => break,
            Budget::Cases(total) => {
                u32::try_from((total - inputs).min(u64::from(BATCH))).unwrap_or(BATCH)
            }
            Budget::Time(limit) if started.elapsed() >= limit => break,
            Budget::Time(_) => BATCH,
        };
        let config = Config {
            cases: batch,
            failure_persistence: None,
            // A target's inputs are all valid; none is rejected.
            max_global_rejects: 0,
            ..Config::default()
        };
        let mut seed_of_batch = [0u8; 32];
        rng.fill_bytes(&mut seed_of_batch);
        let mut runner = TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_of_batch),
        );
        match runner.run(&strategy, &test) {
            Ok(()) => inputs += u64::from(batch),
            Err(TestError::Fail(why, input)) => {
                eprintln!(
                    "fuzz {target}: {inputs} inputs, 1 crashes (seed {seed_hex}, {:.1} s)",
                    started.elapsed().as_secs_f64()
                );
                panic!("fuzz {target}: {why}\nshrunk input: {input:#?}\n(replay: RELAY_FUZZ_SEED={seed_hex})");
            }
            Err(TestError::Abort(why)) => panic!("fuzz {target}: aborted: {why}"),
        }
    }
    eprintln!(
        "fuzz {target}: {inputs} inputs, 0 crashes (seed {seed_hex}, {:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// How often a target's inputs got past the decoder's first refusal (a value decoded, an
/// event read): a target whose every input is refused at the door tests nothing past it,
/// so each asserts some did ([`Seen::assert_some`]) and prints how many.
#[derive(Debug, Default)]
pub struct Seen(std::sync::atomic::AtomicU64);

impl Seen {
    pub fn hit(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Panics unless some input got `what`.
    pub fn assert_some(&self, target: &str, what: &str) {
        let n = self.count();
        eprintln!("fuzz {target}: {what}: {n}");
        assert!(
            n > 0,
            "fuzz {target}: no input {what}: the inputs do not reach the decoder"
        );
    }
}

/// Bytes that break parsers: JSON's structure and its number and escape extremes,
/// line ends, NUL, bidi overrides, lone surrogates as escapes, non-UTF-8 and deep nesting.
pub fn tokens() -> Vec<Vec<u8>> {
    let mut t: Vec<Vec<u8>> = [
        "\"",
        "\\",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "null",
        "true",
        "false",
        "0",
        "-1",
        "-0",
        "1e999",
        "-1e999",
        "1.5",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775809",
        "\"\\ud800\"",
        "\"\\u0000\"",
        "\\u",
        "\n",
        "\r",
        "\r\n",
        "\0",
        "\u{202e}",
        "\u{feff}",
        "é",
        "🦀",
        "\"\"",
        "{}",
        "[]",
        "data:",
        "id:",
        "event:",
        "retry:",
        ": ",
        "\u{1b}[31m",
        "\u{1b}]0;t\u{7}",
        "\u{1b}P",
        "\u{1b}[?2004h",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    t.push(vec![0xff, 0xfe]);
    t.push(vec![0xc3]);
    t.push(vec![0xed, 0xa0, 0x80]);
    t.push("[".repeat(300).into_bytes());
    t.push("{\"a\":".repeat(200).into_bytes());
    t.push(vec![b'a'; 5000]);
    t
}

/// One change to a byte string.
#[derive(Debug, Clone)]
pub enum Mutation {
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Truncate(Index),
    Token(Index, Index),
    /// Bytes of another seed (or this one) put in at a place.
    Splice(Index, Index, Index, usize),
    Duplicate(Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(at, bit)| Mutation::Flip(at, bit)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<Index>(), 1usize..64).prop_map(|(at, n)| Mutation::Delete(at, n)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), any::<Index>()).prop_map(|(at, t)| Mutation::Token(at, t)),
        (any::<Index>(), any::<Index>(), any::<Index>(), 1usize..64)
            .prop_map(|(at, seed, from, n)| Mutation::Splice(at, seed, from, n)),
        (any::<Index>(), 1usize..64).prop_map(|(at, n)| Mutation::Duplicate(at, n)),
    ]
}

fn at(i: &Index, len: usize) -> usize {
    i.index(len + 1)
}

/// `seed` with `mutations` applied (`seeds` for splices).
pub fn apply(seed: &[u8], mutations: &[Mutation], seeds: &[Vec<u8>]) -> Vec<u8> {
    let tokens = tokens();
    let mut b = seed.to_vec();
    for m in mutations {
        match m {
            Mutation::Flip(i, bit) if !b.is_empty() => {
                let i = i.index(b.len());
                b[i] ^= 1 << (bit % 8);
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(i, bytes) => {
                let i = at(i, b.len());
                b.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let i = at(i, b.len());
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Mutation::Truncate(i) => b.truncate(at(i, b.len())),
            Mutation::Token(i, t) => {
                let i = at(i, b.len());
                b.splice(i..i, t.get(&tokens).iter().copied());
            }
            Mutation::Splice(i, s, from, n) => {
                let other = if seeds.is_empty() {
                    seed
                } else {
                    s.get(seeds).as_slice()
                };
                let from = at(from, other.len());
                let piece = other[from..(from + n).min(other.len())].to_vec();
                let i = at(i, b.len());
                b.splice(i..i, piece);
            }
            Mutation::Duplicate(i, n) => {
                let i = at(i, b.len());
                let piece = b[i..(i + n).min(b.len())].to_vec();
                b.splice(i..i, piece);
            }
        }
    }
    b
}

/// Random bytes, up to `max` long.
pub fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// A seed with up to 8 byte-level changes.
pub fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    assert!(!seeds.is_empty(), "a mutation strategy needs a seed");
    (any::<Index>(), prop::collection::vec(mutation(), 0..8))
        .prop_map(move |(which, ms)| apply(which.get::<Vec<u8>>(&seeds), &ms, &seeds))
}

/// A JSON value a typed decoder does not expect: each type, and the extremes of each.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(i64::MIN),
            Just(-1i64),
            Just(0i64),
            Just(i64::MAX),
            any::<i64>()
        ]
        .prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        any::<f64>().prop_map(Value::from),
        prop_oneof![
            Just(String::new()),
            Just("\u{0}".to_string()),
            Just("\u{202e}evil".to_string()),
            Just("a".repeat(10_000)),
            Just("../../etc/passwd".to_string()),
            ".{0,24}"
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One change to a JSON value: at the path the indexes pick, replace the value, remove
/// it, or put a new key beside it.
#[derive(Debug, Clone)]
pub enum JsonEdit {
    Replace(Vec<Index>, Value),
    Remove(Vec<Index>),
    AddKey(Vec<Index>, String, Value),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    let path = prop::collection::vec(any::<Index>(), 0..5);
    prop_oneof![
        3 => (path.clone(), json_value()).prop_map(|(p, v)| JsonEdit::Replace(p, v)),
        1 => path.clone().prop_map(JsonEdit::Remove),
        1 => (path, "[a-zA-Z_]{1,12}", json_value()).prop_map(|(p, k, v)| JsonEdit::AddKey(p, k, v)),
    ]
}

/// The value at the end of `path`, as far as the value goes that deep.
fn walk<'v>(v: &'v mut Value, path: &[Index]) -> &'v mut Value {
    let Some((first, rest)) = path.split_first() else {
        return v;
    };
    let key = match &*v {
        Value::Object(m) if !m.is_empty() => m.keys().nth(first.index(m.len())).cloned(),
        Value::Array(a) if !a.is_empty() => {
            let i = first.index(a.len());
            return walk(&mut v[i], rest);
        }
        _ => None,
    };
    match key {
        // Indexing an object by one of its keys.
        Some(key) => walk(&mut v[key.as_str()], rest),
        None => v,
    }
}

/// `v` with `edits` applied.
pub fn edit_json(mut v: Value, edits: &[JsonEdit]) -> Value {
    for e in edits {
        match e {
            JsonEdit::Replace(path, new) => *walk(&mut v, path) = new.clone(),
            JsonEdit::Remove(path) => {
                let (last, parent) = match path.split_last() {
                    Some((last, parent)) => (last, parent),
                    None => continue,
                };
                match walk(&mut v, parent) {
                    Value::Object(m) if !m.is_empty() => {
                        let key = last.get(&m.keys().cloned().collect::<Vec<_>>()).clone();
                        m.remove(&key);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let i = last.index(a.len());
                        a.remove(i);
                    }
                    _ => {}
                }
            }
            JsonEdit::AddKey(path, key, new) => {
                if let Value::Object(m) = walk(&mut v, path) {
                    m.insert(key.clone(), new.clone());
                }
            }
        }
    }
    v
}

/// A JSON seed (each must parse) with up to 4 edits, serialised.
pub fn json_mutated(seeds: Vec<Value>) -> impl Strategy<Value = Vec<u8>> {
    assert!(!seeds.is_empty(), "a mutation strategy needs a seed");
    (any::<Index>(), prop::collection::vec(json_edit(), 0..4)).prop_map(move |(which, edits)| {
        serde_json::to_vec(&edit_json(which.get(&seeds).clone(), &edits)).unwrap_or_default()
    })
}

/// What a JSON decoder gets: raw bytes, byte-mutated seeds, or JSON-edited seeds (the
/// seeds are JSON texts; each must parse).
pub fn json_input(seeds: &[&str]) -> BoxedStrategy<Vec<u8>> {
    let raw: Vec<Vec<u8>> = seeds.iter().map(|s| s.as_bytes().to_vec()).collect();
    let values: Vec<Value> = seeds
        .iter()
        .map(|s| {
            serde_json::from_str(s).unwrap_or_else(|e| panic!("the seed {s} is not JSON: {e}"))
        })
        .collect();
    prop_oneof![
        1 => bytes(256),
        3 => mutated(raw),
        4 => json_mutated(values),
    ]
    .boxed()
}

/// Up to `max` lines for a stateful reader: each a line of one recorded run (in order),
/// changed (bytes or JSON), dropped, repeated, or a random line put in.
pub fn line_runs(runs: Vec<Vec<String>>, max_edits: usize) -> impl Strategy<Value = Vec<String>> {
    assert!(runs.iter().all(|r| !r.is_empty()), "a run needs a line");
    let all: Vec<Vec<u8>> = runs
        .iter()
        .flatten()
        .map(|l| l.as_bytes().to_vec())
        .collect();
    let edit = prop_oneof![
        3 => (any::<Index>(), prop::collection::vec(json_edit(), 1..3)).prop_map(|(i, e)| LineEdit::Json(i, e)),
        2 => (any::<Index>(), prop::collection::vec(mutation(), 1..4)).prop_map(|(i, m)| LineEdit::Bytes(i, m)),
        1 => any::<Index>().prop_map(LineEdit::Drop),
        1 => any::<Index>().prop_map(LineEdit::Repeat),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(at, from)| LineEdit::Borrow(at, from)),
    ];
    (any::<Index>(), prop::collection::vec(edit, 0..max_edits)).prop_map(move |(which, edits)| {
        let mut lines: Vec<String> = which.get(&runs).clone();
        for e in edits {
            if lines.is_empty() {
                break;
            }
            match e {
                LineEdit::Json(i, edits) => {
                    let i = i.index(lines.len());
                    if let Ok(v) = serde_json::from_str::<Value>(&lines[i]) {
                        lines[i] = edit_json(v, &edits).to_string();
                    }
                }
                LineEdit::Bytes(i, ms) => {
                    let i = i.index(lines.len());
                    lines[i] = String::from_utf8_lossy(&apply(lines[i].as_bytes(), &ms, &all))
                        .into_owned();
                }
                LineEdit::Drop(i) => {
                    lines.remove(i.index(lines.len()));
                }
                LineEdit::Repeat(i) => {
                    let i = i.index(lines.len());
                    lines.insert(i, lines[i].clone());
                }
                LineEdit::Borrow(at, from) => {
                    let line = String::from_utf8_lossy(from.get::<Vec<u8>>(&all)).into_owned();
                    lines.insert(at.index(lines.len() + 1), line);
                }
            }
        }
        lines
    })
}

#[derive(Debug, Clone)]
enum LineEdit {
    Json(Index, Vec<JsonEdit>),
    Bytes(Index, Vec<Mutation>),
    Drop(Index),
    Repeat(Index),
    /// A line of any run put in at a place.
    Borrow(Index, Index),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use serde_json::json;

    #[test]
    fn edits_reach_every_depth_and_keep_the_json_valid() {
        let seed = json!({"a": {"b": [1, {"c": "d"}]}});
        let mut runner = TestRunner::deterministic();
        let strategy = json_mutated(vec![seed.clone()]);
        let mut changed = 0;
        for _ in 0..200 {
            let bytes = strategy
                .new_tree(&mut runner)
                .map(|t| t.current())
                .unwrap_or_default();
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            assert_ne!(v, Value::Null, "an edited seed is JSON");
            changed += usize::from(v != seed);
        }
        assert!(
            changed > 100,
            "most edits change the seed ({changed} of 200)"
        );
    }

    #[test]
    fn byte_mutations_stay_in_bounds_whatever_the_indexes() {
        let mut runner = TestRunner::deterministic();
        let strategy = mutated(vec![b"{}".to_vec(), Vec::new()]);
        for _ in 0..500 {
            let _ = strategy.new_tree(&mut runner).map(|t| t.current());
        }
    }
}
