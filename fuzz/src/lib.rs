//! The harness shared by aliasnet's fuzz targets (one test file per parser in `tests/`).
//!
//! libFuzzer and cargo-fuzz need a nightly compiler for their sanitizer instrumentation, so
//! the targets run on the stable toolchain as property tests instead: each replays its
//! committed corpus (`corpus/<target>/`), then runs proptest generators of two kinds,
//! structure-aware ones (valid messages with hostile field values) and byte-level mutations
//! of corpus entries (bit flips, interesting integers, inserted tokens, truncation, splices).
//! A failing input is shrunk by proptest and printed; add it to the corpus once fixed.
//!
//! * [`cases`]: the number of generated cases of a property, `ALIASNET_FUZZ_CASES` for long
//!   runs. `PROPTEST_RNG_SEED` fixes the seed to replay a run.
//! * [`corpus`]: a target's committed inputs.
//! * [`mutated`]: a strategy of byte mutations of corpus entries.
//! * [`alloc`]: per-thread allocation accounting, to check that a decoder's memory is bounded
//!   by its input (a test binary installs [`alloc::Counting`] as its global allocator).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use proptest::{prelude::*, test_runner::Config};

pub mod alloc;

/// Cases of one property: `default` (sized so the whole crate runs in well under a minute on
/// two cores), or `ALIASNET_FUZZ_CASES` scaled by the same ratio to the CI default of 5,000,
/// so a long run keeps the targets' relative weights.
pub fn cases(default: u32) -> u32 {
    match std::env::var("ALIASNET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(n) => {
            u32::try_from((n.saturating_mul(u64::from(default)) / 5000).max(1)).unwrap_or(u32::MAX)
        }
        None => default,
    }
}

/// A proptest configuration for `default` cases (see [`cases`]). Failures are not persisted
/// to regression files (the corpus is the regression set) and shrinking is bounded.
pub fn config(default: u32) -> Config {
    Config {
        cases: cases(default),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    }
}

/// A scratch directory on tmpfs when there is one (targets that write files run thousands of
/// cases; the state store fsyncs), else in the default temp directory.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("aliasnet-fuzz")
            .tempdir_in(shm)
        {
            return d;
        }
    }
    tempfile::tempdir().expect("temp dir")
}

/// One committed input.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

impl Entry {
    /// The file name, for assertion messages.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Directory of `target`'s corpus.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// Every file of `target`'s corpus, sorted by name. Panics when there is none: a target
/// without its corpus is a packaging mistake, not an empty test.
pub fn corpus(target: &str) -> Vec<Entry> {
    let dir = corpus_dir(target);
    let mut out: Vec<Entry> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .map(|path| Entry {
            bytes: std::fs::read(&path).expect("read corpus entry"),
            path,
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    assert!(!out.is_empty(), "empty corpus {}", dir.display());
    out
}

/// One byte-level mutation; positions are reduced modulo the input's length when applied, so
/// every generated value applies to every input (and shrinks towards the front).
#[derive(Debug, Clone)]
pub enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        byte: u8,
    },
    /// Overwrite with an integer that sits on a boundary (0, 1, 0x7f.., 0x80.., 0xff..),
    /// little- or big-endian, 1, 2, 4 or 8 bytes wide.
    Interesting {
        at: usize,
        which: u8,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    /// Insert a token of the target's dictionary.
    Token {
        at: usize,
        which: usize,
    },
    Delete {
        at: usize,
        len: usize,
    },
    Truncate {
        at: usize,
    },
    /// Copy a slice of the input to another place (repeated fields, nested repeats).
    Duplicate {
        from: usize,
        len: usize,
        at: usize,
    },
    /// Insert a slice of another corpus entry.
    Splice {
        other: usize,
        from: usize,
        len: usize,
        at: usize,
    },
}

const INTERESTING: [u64; 8] = [0, 1, 0x7f, 0x80, 0xff, 0x7fff_ffff, 0xffff_ffff, u64::MAX];

fn pos(at: usize, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        at % (len + 1)
    }
}

impl Mutation {
    /// Apply to `buf`; `corpus` for splices, `dict` for tokens.
    pub fn apply(&self, buf: &mut Vec<u8>, corpus: &[Vec<u8>], dict: &[&[u8]]) {
        let n = buf.len();
        match *self {
            Self::FlipBit { at, bit } if n > 0 => buf[at % n] ^= 1 << (bit % 8),
            Self::SetByte { at, byte } if n > 0 => buf[at % n] = byte,
            Self::Interesting { at, which } => {
                let v = INTERESTING[usize::from(which) % INTERESTING.len()];
                let width = [1usize, 2, 4, 8][usize::from(which / 8) % 4];
                let mut bytes = v.to_le_bytes()[..width].to_vec();
                if which & 0x20 != 0 {
                    bytes.reverse();
                }
                let at = pos(at, n).min(n);
                let end = (at + width).min(n);
                buf.splice(at..end, bytes);
            }
            Self::Insert { at, ref bytes } => {
                let at = pos(at, n);
                buf.splice(at..at, bytes.iter().copied());
            }
            Self::Token { at, which } if !dict.is_empty() => {
                let at = pos(at, n);
                buf.splice(at..at, dict[which % dict.len()].iter().copied());
            }
            Self::Delete { at, len } if n > 0 => {
                let at = at % n;
                let end = at + (len % 16 + 1).min(n - at);
                buf.drain(at..end);
            }
            Self::Truncate { at } => buf.truncate(pos(at, n)),
            Self::Duplicate { from, len, at } if n > 0 => {
                let from = from % n;
                let end = from + (len % 64 + 1).min(n - from);
                let piece = buf[from..end].to_vec();
                let at = pos(at, n);
                buf.splice(at..at, piece);
            }
            Self::Splice {
                other,
                from,
                len,
                at,
            } if !corpus.is_empty() => {
                let src = &corpus[other % corpus.len()];
                if !src.is_empty() {
                    let from = from % src.len();
                    let end = from + (len % 256 + 1).min(src.len() - from);
                    let at = pos(at, n);
                    buf.splice(at..at, src[from..end].iter().copied());
                }
            }
            _ => {}
        }
    }
}

/// A strategy of one mutation.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        3 => (at, any::<u8>()).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        2 => (at, any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte { at, byte }),
        2 => (at, any::<u8>()).prop_map(|(at, which)| Mutation::Interesting { at, which }),
        1 => (at, proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        3 => (at, any::<usize>()).prop_map(|(at, which)| Mutation::Token { at, which }),
        2 => (at, any::<usize>()).prop_map(|(at, len)| Mutation::Delete { at, len }),
        1 => at.prop_map(|at| Mutation::Truncate { at }),
        1 => (any::<usize>(), any::<usize>(), at)
            .prop_map(|(from, len, at)| Mutation::Duplicate { from, len, at }),
        1 => (any::<usize>(), any::<usize>(), any::<usize>(), at).prop_map(
            |(other, from, len, at)| Mutation::Splice {
                other,
                from,
                len,
                at
            }
        ),
    ]
}

/// Bytes that print as an escaped byte string, so a failing case reads like its input.
#[derive(Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\" ({} bytes)", self.0.escape_ascii(), self.0.len())
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// A corpus entry (chosen by the strategy) with 1 to 8 mutations applied; `dict` holds
/// tokens of the input's syntax (JSON punctuation, key names, boundary numbers).
pub fn mutated(
    corpus: Vec<Vec<u8>>,
    dict: &'static [&'static [u8]],
) -> impl Strategy<Value = Bytes> {
    let corpus = Arc::new(corpus);
    let n = corpus.len();
    assert!(n > 0, "mutating an empty corpus");
    (0..n, proptest::collection::vec(mutation(), 1..8)).prop_map(move |(i, muts)| {
        let mut buf = corpus[i].clone();
        for m in &muts {
            m.apply(&mut buf, &corpus, dict);
        }
        Bytes(buf)
    })
}

/// Tokens that break or stretch JSON parsers.
pub const JSON_DICT: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\"",
    b"\\",
    b"null",
    b"true",
    b"false",
    b"0",
    b"-1",
    b"-0",
    b"1e999",
    b"1.5",
    b"4294967295",
    b"4294967296",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"\"\\udc00\\ud800\"",
    b"\xff\xfe",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    b"{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{",
    b"\"\":",
    b"\"x\":1,",
];

/// Whether `v` holds a floating-point number anywhere: serde_json parses floats fast but not
/// always to the nearest value (its `float_roundtrip` feature is off), so a document with
/// floats may print and parse back one ulp off. Round-trip checks skip those.
pub fn has_float(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

/// `depth` levels of `open` around `inner`, closed again: deep nesting without recursion.
pub fn nested(open: &str, close: &str, depth: usize, inner: &str) -> String {
    let mut s = String::with_capacity(depth * (open.len() + close.len()) + inner.len());
    for _ in 0..depth {
        s.push_str(open);
    }
    s.push_str(inner);
    for _ in 0..depth {
        s.push_str(close);
    }
    s
}

/// Arbitrary JSON values (bounded depth and size), for fields whose type is under attack.
pub fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(67),
            Just(68),
            Just(65535),
            Just(65536),
            Just(300_000),
            Just(300_001),
            Just(u64::from(u32::MAX)),
            Just(u64::from(u32::MAX) + 1),
            Just(u64::MAX)
        ]
        .prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Short strings that stress validation: empty, ASCII words, separators, control and
/// non-ASCII characters, NULs, long runs.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9_.-]{0,16}",
        2 => "[a-zA-Z0-9/:;=,._ \\-]{0,24}",
        1 => ".{0,12}",
        1 => "\\PC{0,8}",
        1 => Just(String::new()),
        1 => Just("\0".to_owned()),
        1 => (1usize..3000).prop_map(|n| "a".repeat(n)),
        1 => "[0-9a-f]{64}",
        1 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    ]
}
