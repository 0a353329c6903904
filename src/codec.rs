//! The one place bytes are encoded and decoded (DESIGN.md A11).
//!
//! Format: one version byte, then bincode 2.0.1 (serde, standard config: little-endian varints).
//! Every decode states a size limit that is checked before any decoding, bincode's own claimed-
//! bytes limit bounds allocation, and trailing bytes are rejected. Swapping the codec later is a
//! change to this module only.

use serde::Serialize;
use serde::de::DeserializeOwned;

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

/// Decodes bytes written by [`encode`], refusing inputs over `limit` bytes, other versions,
/// malformed bytes and trailing bytes. Never panics on any input.
///
/// # Errors
/// The [`CodecError`] describing what is wrong.
pub fn decode<T: DeserializeOwned>(
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
}
