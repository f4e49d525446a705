//! `bytes` fields as etcd's gateway reads them: Go's `base64.StdEncoding`, which is what
//! `encoding/json` decodes a `[]byte` with.
//!
//! Why its own decoder: a client that sends a bad key gets Go's
//! "illegal base64 data at input byte N", where N comes from the way Go walks the input in
//! quanta of four (a short final quantum is blamed at its start, missing padding at the
//! input's end, garbage after padding where it begins), and Go skips `\r` and `\n` anywhere
//! and ignores non-zero bits after the last byte. The `base64` crate decodes the same
//! alphabet but neither reports those offsets nor skips line breaks; the tests check that
//! both agree on every canonical input.

/// The standard alphabet's value of each byte, or `None`.
fn sextet(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

fn is_line_break(c: u8) -> bool {
    c == b'\n' || c == b'\r'
}

/// Go's error for `src` at `offset`.
pub fn error_text(offset: usize) -> String {
    format!("illegal base64 data at input byte {offset}")
}

/// Decodes `src` as Go's `base64.StdEncoding.Decode` does: the bytes, or the offset Go's
/// `CorruptInputError` names.
pub fn decode(src: &[u8]) -> Result<Vec<u8>, usize> {
    let mut out = Vec::with_capacity(src.len() / 4 * 3);
    let mut si = 0;
    while si < src.len() {
        let (next, quantum) = decode_quantum(src, si, &mut out)?;
        si = next;
        if quantum < 4 {
            // Padding ended the input (anything after it was refused in the quantum).
            break;
        }
    }
    Ok(out)
}

/// One quantum of four sextets starting at `si`: where the next starts and how many sextets
/// it held (fewer than 4 only at padding or the input's end).
fn decode_quantum(src: &[u8], mut si: usize, out: &mut Vec<u8>) -> Result<(usize, usize), usize> {
    let mut buf = [0u8; 4];
    let mut j = 0;
    let mut trailing_garbage = None;
    while j < 4 {
        if si == src.len() {
            if j == 0 {
                return Ok((si, 4));
            }
            // A short final quantum without padding: blamed where it started.
            return Err(si - j);
        }
        let c = src[si];
        si += 1;
        if let Some(v) = sextet(c) {
            buf[j] = v;
            j += 1;
            continue;
        }
        if is_line_break(c) {
            continue;
        }
        if c != b'=' {
            return Err(si - 1);
        }
        // Padding: after two or three sextets only; two of them need "==".
        match j {
            0 | 1 => return Err(si - 1),
            2 => {
                while si < src.len() && is_line_break(src[si]) {
                    si += 1;
                }
                if si == src.len() {
                    return Err(src.len());
                }
                if src[si] != b'=' {
                    return Err(si - 1);
                }
                si += 1;
            }
            _ => {}
        }
        while si < src.len() && is_line_break(src[si]) {
            si += 1;
        }
        if si < src.len() {
            trailing_garbage = Some(si);
        }
        break;
    }
    let value = (u32::from(buf[0]) << 18)
        | (u32::from(buf[1]) << 12)
        | (u32::from(buf[2]) << 6)
        | u32::from(buf[3]);
    let bytes = value.to_be_bytes();
    out.extend_from_slice(&bytes[1..j]);
    match trailing_garbage {
        Some(at) => Err(at),
        None => Ok((si, j)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input and Go's answer for it.
    type Case = (&'static [u8], Result<&'static [u8], usize>);

    #[test]
    fn offsets_and_answers_are_go_s() {
        // go1.19: json.Unmarshal of the quoted input into a []byte.
        let table: &[Case] = &[
            (b"", Ok(b"")),
            (b"Zm9v", Ok(b"foo")),
            (b"Zm9", Err(0)),
            (b"Zm9vYg", Err(4)),
            (b"Zm9vYg=", Err(7)),
            (b"Zm9vYg=x", Err(6)),
            (b"Zm-v", Err(2)),
            (b"Zm9v=====", Err(4)),
            (b"Zm9vYmFyYmF6YQ", Err(12)),
            (b"Zm\n9v", Ok(b"foo")),
            (b"Zm9v\r\n", Ok(b"foo")),
            (b"YR==", Ok(b"a")),
            (b"Y===", Err(1)),
            (b"YQ=", Err(3)),
            (b"YQ==YQ==", Err(4)),
            (b"Zm9vYmFyYg==", Ok(b"foobarb")),
            (b"Zm9vYmFyYmF6!", Err(12)),
            (b"Zm9vYmFy!mF6", Err(8)),
            (b"Z", Err(0)),
            (b"ZZZZZ", Err(4)),
            (b"=", Err(0)),
            (b"==", Err(0)),
            (b"Zg=\n=", Ok(b"f")),
            (b"Zg==\n", Ok(b"f")),
            (b"Zg==\nx", Err(5)),
            (b"Zm9vYmFyYmF6YmF6Zm9v!", Err(20)),
        ];
        for (input, want) in table {
            assert_eq!(
                decode(input),
                want.map(|b| b.to_vec()),
                "input {:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn canonical_input_decodes_as_the_base64_crate_does() {
        use base64::Engine as _;
        let mut data = Vec::new();
        for n in 0..300u32 {
            data.push((n.wrapping_mul(2_654_435_761) >> 13) as u8);
            let encoded = base64::engine::general_purpose::STANDARD.encode(&data);
            assert_eq!(decode(encoded.as_bytes()), Ok(data.clone()), "{encoded}");
        }
    }
}
