//! The one place bytes are encoded and decoded (docs/design/principles.md, "One codec").
//!
//! Format: one version byte, then bincode 2.0.1 (serde, standard config: little-endian varints).
//! Every decode states a size limit that is checked before any decoding, bincode's own claimed-
//! bytes limit bounds allocation, and trailing bytes are rejected. Swapping the codec later is a
//! change to this module only.
//!
//! Guarantee (one value, one encoding): `decode(b) == Ok(v)` implies `encode(v) == b`. bincode
//! itself accepts over-long varints (several byte strings for one integer); [`decode`] therefore
//! re-encodes what it decoded and compares it with the input, byte by byte and without
//! allocating, and rejects any difference as [`CodecError::NotCanonical`].

use serde::Serialize;
use serde::de::DeserializeOwned;

pub mod wal;

/// The format version written first in every frame and record.
pub const FORMAT_VERSION: u8 = 1;

/// Hard ceiling on any decoded item, whatever limit the caller passes (256 MiB).
const DECODE_CEILING: usize = 256 * 1024 * 1024;

type Config = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<DECODE_CEILING>,
>;

fn config() -> Config {
    bincode::config::standard().with_limit::<DECODE_CEILING>()
}

/// Why bytes could not be decoded (or a value encoded). Nothing was applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The input is larger than the limit for what it claims to be.
    #[error("{what} is {len} bytes, over the limit of {limit}")]
    TooLarge {
        /// What was being decoded.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The input is empty (no version byte).
    #[error("{what} is empty")]
    Empty {
        /// What was being decoded.
        what: &'static str,
    },
    /// The version byte is not one this build reads.
    #[error("{what} has format version {found}, this build reads {FORMAT_VERSION}")]
    Version {
        /// What was being decoded.
        what: &'static str,
        /// The version found.
        found: u8,
    },
    /// The bytes are not a valid encoding.
    #[error("{what} is malformed: {detail}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// The decoder's message.
        detail: String,
    },
    /// Bytes were left after the value.
    #[error("{what} has {extra} trailing bytes")]
    Trailing {
        /// What was being decoded.
        what: &'static str,
        /// How many bytes were left.
        extra: usize,
    },
    /// The bytes decode, but are not the one encoding of their value (an over-long varint, a
    /// map out of order, ...): correct nodes never write them.
    #[error("{what} is not canonically encoded (first difference at byte {at})")]
    NotCanonical {
        /// What was being decoded.
        what: &'static str,
        /// Offset (after the version byte) of the first byte that differs.
        at: usize,
    },
    /// Encoding failed (a value over the ceiling).
    #[error("cannot encode {what}: {detail}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's message.
        detail: String,
    },
}

/// Encodes `value` as version byte + bincode.
///
/// # Errors
/// [`CodecError::Encode`] when the value cannot be encoded (over the ceiling).
pub fn encode<T: Serialize + ?Sized>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config()).map_err(|e| {
        CodecError::Encode {
            what,
            detail: e.to_string(),
        }
    })?;
    Ok(out)
}

/// The encoded size of `value` (without allocating the bytes twice where avoidable).
///
/// # Errors
/// As [`encode`].
pub fn encoded_len<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<usize, CodecError> {
    let mut counter = SizeCounter(0);
    bincode::serde::encode_into_std_write(value, &mut counter, config()).map_err(|e| {
        CodecError::Encode {
            what,
            detail: e.to_string(),
        }
    })?;
    Ok(counter.0 + 1)
}

struct SizeCounter(usize);

impl std::io::Write for SizeCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that compares what is written with `expected` instead of storing it.
struct Compare<'a> {
    expected: &'a [u8],
    at: usize,
    /// The offset of the first difference, if any.
    differs: Option<usize>,
}

impl std::io::Write for Compare<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.differs.is_none() {
            let rest = self.expected.get(self.at..).unwrap_or(&[]);
            match buf.iter().zip(rest).position(|(a, b)| a != b) {
                Some(i) => self.differs = Some(self.at + i),
                None if rest.len() < buf.len() => self.differs = Some(self.at + rest.len()),
                None => {}
            }
        }
        self.at += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `Err(offset)` when `value` does not encode to exactly `body`.
fn check_canonical<T: Serialize>(value: &T, body: &[u8]) -> Result<(), usize> {
    let mut cmp = Compare {
        expected: body,
        at: 0,
        differs: None,
    };
    if bincode::serde::encode_into_std_write(value, &mut cmp, config()).is_err() {
        return Err(0);
    }
    match cmp.differs {
        Some(at) => Err(at),
        None if cmp.at != body.len() => Err(cmp.at.min(body.len())),
        None => Ok(()),
    }
}

/// Decodes bytes written by [`encode`], refusing inputs over `limit` bytes, other versions,
/// malformed bytes, trailing bytes and non-canonical encodings (so `decode(b) == Ok(v)` implies
/// `encode(v) == b`). Never panics on any input.
///
/// # Errors
/// The [`CodecError`] describing what is wrong.
pub fn decode<T: DeserializeOwned + Serialize>(
    what: &'static str,
    bytes: &[u8],
    limit: usize,
) -> Result<T, CodecError> {
    let limit = limit.min(DECODE_CEILING);
    if bytes.len() > limit {
        return Err(CodecError::TooLarge {
            what,
            len: bytes.len(),
            limit,
        });
    }
    let Some((&version, body)) = bytes.split_first() else {
        return Err(CodecError::Empty { what });
    };
    if version != FORMAT_VERSION {
        return Err(CodecError::Version {
            what,
            found: version,
        });
    }
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(body, config()).map_err(|e| {
        CodecError::Malformed {
            what,
            detail: e.to_string(),
        }
    })?;
    if used != body.len() {
        return Err(CodecError::Trailing {
            what,
            extra: body.len() - used,
        });
    }
    check_canonical(&value, body).map_err(|at| CodecError::NotCanonical { what, at })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejections() {
        let v: Vec<u64> = vec![1, 2, 300];
        let bytes = encode("test", &v).expect("encodes");
        assert_eq!(decode::<Vec<u64>>("test", &bytes, 1024), Ok(v.clone()));
        assert_eq!(encoded_len("test", &v), Ok(bytes.len()));
        assert!(matches!(
            decode::<Vec<u64>>("test", &bytes, 2),
            Err(CodecError::TooLarge { .. })
        ));
        assert!(matches!(
            decode::<Vec<u64>>("test", &[], 10),
            Err(CodecError::Empty { .. })
        ));
        let mut wrong = bytes.clone();
        wrong[0] = 9;
        assert!(matches!(
            decode::<Vec<u64>>("test", &wrong, 1024),
            Err(CodecError::Version { found: 9, .. })
        ));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(
            decode::<Vec<u64>>("test", &trailing, 1024),
            Err(CodecError::Trailing { extra: 1, .. })
        ));
        // A length prefix claiming far more elements than bytes present must fail, not allocate.
        let hostile = [
            FORMAT_VERSION,
            0xfd,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0x7f,
        ];
        assert!(decode::<Vec<u64>>("test", &hostile, 1024).is_err());
    }

    /// bincode reads `[0xfb, 5, 0]` (a u16-width varint) as 5, whose encoding is `[5]`: one
    /// value, two encodings. The codec accepts only the canonical one.
    #[test]
    fn over_long_varints_are_rejected() {
        let canonical = encode("test", &5u64).expect("encodes");
        assert_eq!(canonical, vec![FORMAT_VERSION, 5]);
        assert_eq!(decode::<u64>("test", &canonical, 16), Ok(5));
        for long in [
            vec![FORMAT_VERSION, 0xfb, 5, 0],
            vec![FORMAT_VERSION, 0xfc, 5, 0, 0, 0],
            vec![FORMAT_VERSION, 0xfd, 5, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(
                bincode::serde::decode_from_slice::<u64, _>(&long[1..], config()).is_ok(),
                "bincode alone accepts {long:?}"
            );
            assert!(
                matches!(
                    decode::<u64>("test", &long, 16),
                    Err(CodecError::NotCanonical { .. })
                ),
                "{long:?}"
            );
        }
        // Inside a structure too: a vector length written long.
        assert!(matches!(
            decode::<Vec<u8>>("test", &[FORMAT_VERSION, 0xfb, 1, 0, 7], 16),
            Err(CodecError::NotCanonical { .. })
        ));
        assert_eq!(
            decode::<Vec<u8>>("test", &[FORMAT_VERSION, 1, 7], 16),
            Ok(vec![7])
        );
    }
}
