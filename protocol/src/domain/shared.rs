//! [`SharedStr`]: a text that may be megabytes long (a flight's answer), shared rather
//! than copied. One answer is held by the item that streamed it, the completion's
//! `output`, the flight it completed and the reply message posted with it; with a
//! `String` in each, every hand-over was a copy (about 110 ms of the storage thread for
//! a 32 MB answer, ops/BENCHMARKS.md part 19). A clone of a `SharedStr` is a reference
//! count. Its JSON is a plain string, as before.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A text this long or longer is worth writing once, in a file of its own, before the
/// events that carry it are stored (the broker's `TextFiles`, for its own runtime's
/// agents).
pub const LONG_TEXT: usize = 1 << 20;

/// An immutable string whose clones share one buffer (see the module's doc).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedStr(Arc<str>);

impl SharedStr {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether both are the same buffer (a clone of one another): equal without
    /// comparing their bytes.
    pub fn same_buffer(a: &SharedStr, b: &SharedStr) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// How many hold this buffer (this one included).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl Default for SharedStr {
    fn default() -> Self {
        SharedStr(Arc::from(""))
    }
}

impl Deref for SharedStr {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl From<String> for SharedStr {
    fn from(s: String) -> Self {
        SharedStr(Arc::from(s))
    }
}

impl From<&str> for SharedStr {
    fn from(s: &str) -> Self {
        SharedStr(Arc::from(s))
    }
}

impl From<&String> for SharedStr {
    fn from(s: &String) -> Self {
        SharedStr(Arc::from(s.as_str()))
    }
}

impl From<Arc<str>> for SharedStr {
    fn from(s: Arc<str>) -> Self {
        SharedStr(s)
    }
}

impl From<SharedStr> for Arc<str> {
    fn from(s: SharedStr) -> Self {
        s.0
    }
}

impl From<SharedStr> for String {
    fn from(s: SharedStr) -> Self {
        s.0.to_string()
    }
}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<SharedStr> for str {
    fn eq(&self, other: &SharedStr) -> bool {
        *self == *other.0
    }
}

impl PartialEq<SharedStr> for &str {
    fn eq(&self, other: &SharedStr) -> bool {
        **self == *other.0
    }
}

impl PartialEq<SharedStr> for String {
    fn eq(&self, other: &SharedStr) -> bool {
        **self == *other.0
    }
}

impl Serialize for SharedStr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedStr {
    /// Straight into its buffer: one copy of the text read, not two (a `String`, then
    /// the `Arc`).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = SharedStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<SharedStr, E> {
                Ok(SharedStr::from(s))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<SharedStr, E> {
                Ok(SharedStr::from(s))
            }
        }
        d.deserialize_string(Text)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn its_json_is_a_plain_string_and_clones_share_one_buffer() {
        let s = SharedStr::from("an answer \"quoted\"\n".to_string());
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            serde_json::to_string("an answer \"quoted\"\n").unwrap()
        );
        let back: SharedStr = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert!(
            !SharedStr::same_buffer(&back, &s),
            "decoded: its own buffer"
        );
        let clone = s.clone();
        assert!(SharedStr::same_buffer(&clone, &s));
        assert_eq!(clone, "an answer \"quoted\"\n");
        assert_eq!("an answer \"quoted\"\n".to_string(), clone);
        assert_eq!(
            format!("{clone:?}"),
            format!("{:?}", "an answer \"quoted\"\n")
        );
        assert_eq!(SharedStr::default(), "");
    }
}
