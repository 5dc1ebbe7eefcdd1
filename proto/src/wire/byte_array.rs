//! A byte array of any length in serde as its bytes, for `#[serde(with =
//! "crate::wire::byte_array")]` (serde derives arrays up to 32 elements
//! only): read back with its length checked.

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

/// Writes `bytes` as serde bytes.
///
/// # Errors
/// The serializer's.
pub fn serialize<S: Serializer, const N: usize>(bytes: &[u8; N], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
}

/// Reads `N` serde bytes.
///
/// # Errors
/// The deserializer's, or a length other than `N`.
pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(d: D) -> Result<[u8; N], D::Error> {
    struct Exactly<const N: usize>;
    impl<'de, const N: usize> Visitor<'de> for Exactly<N> {
        type Value = [u8; N];
        fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            write!(f, "{N} bytes")
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<[u8; N], E> {
            v.try_into().map_err(|_| E::invalid_length(v.len(), &self))
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<[u8; N], A::Error> {
            let mut out = [0u8; N];
            for (i, b) in out.iter_mut().enumerate() {
                *b = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(i, &self))?;
            }
            if seq.next_element::<u8>()?.is_some() {
                return Err(de::Error::invalid_length(N + 1, &self));
            }
            Ok(out)
        }
    }
    d.deserialize_bytes(Exactly::<N>)
}

#[cfg(test)]
mod tests {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Uid(#[serde(with = "super")] [u8; 40]);

    #[test]
    fn an_array_round_trips_and_a_wrong_length_is_refused() {
        let uid = Uid(core::array::from_fn(|i| i as u8));
        let bytes = bincode::serde::encode_to_vec(&uid, bincode::config::standard()).unwrap();
        let (back, _): (Uid, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!(back, uid);
        let short =
            bincode::serde::encode_to_vec(serde_bytes_of(&[1u8; 39]), bincode::config::standard()).unwrap();
        assert!(bincode::serde::decode_from_slice::<Uid, _>(&short, bincode::config::standard()).is_err());
    }

    /// 39 bytes in the same serde form.
    fn serde_bytes_of(b: &[u8]) -> impl serde::Serialize + '_ {
        struct B<'a>(&'a [u8]);
        impl serde::Serialize for B<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        B(b)
    }
}
