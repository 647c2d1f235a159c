//! postcard encoding into a buffer sized once.
//!
//! `postcard::to_stdvec` grows its vector as it goes, so an entry of 128
//! records of 1 KiB is reallocated and copied many times while it is
//! encoded: 4% of a broker's request threads at replication 3, and under
//! mimalloc a third of the encoding's time (`benches/encoding.rs`). A first
//! pass that only counts bytes (no copies) sizes the buffer.

use serde::Serialize;

/// `value`'s postcard encoding, in a vector allocated once.
pub fn to_sized_vec<T: Serialize + ?Sized>(value: &T) -> postcard::Result<Vec<u8>> {
    let size = postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())?;
    postcard::to_extend(value, Vec::with_capacity(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_is_postcards_and_fills_its_buffer_exactly() {
        let value = (7u64, vec![vec![1u8; 3000]; 5], "keel".to_string());
        let sized = to_sized_vec(&value).unwrap();
        assert_eq!(sized, postcard::to_stdvec(&value).unwrap());
        assert_eq!(sized.capacity(), sized.len());
    }
}
