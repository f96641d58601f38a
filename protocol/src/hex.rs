//! Bytes as lower-case hex text, and back: keys and tokens in files, stream message
//! ids, file names made of any id. One table lookup a nibble: the flight stream's ids
//! are made for every published update (`format!` a byte was 6 % of the NATS
//! publisher's time at 64 flights in flight).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lower-case hex, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push(&mut out, bytes);
    out
}

/// Appends `bytes` as lower-case hex to `out`.
pub fn push(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

/// The bytes `text` holds as hex (either case), or `None` if it is not an even number
/// of hex digits.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_goes_there_and_back() {
        let all: Vec<u8> = (0..=255).collect();
        let text = encode(&all);
        assert_eq!(text.len(), 512);
        assert!(text.starts_with("000102"), "{text}");
        assert!(text.ends_with("fdfeff"), "{text}");
        assert_eq!(decode(&text), Some(all.clone()));
        assert_eq!(decode(&text.to_uppercase()), Some(all));
    }

    #[test]
    fn what_is_not_hex_is_refused() {
        for bad in ["0", "abc", "zz", "+f", "0g", "é", "éé"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
        assert_eq!(decode(""), Some(vec![]));
    }
}
