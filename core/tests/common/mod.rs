//! Helpers shared by keel-core's integration tests.

use std::fmt::Debug;

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// `value` survives encoding and decoding unchanged, both in the compact
/// binary encoding (postcard) and in JSON.
pub fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T) -> Result<(), TestCaseError> {
    let bytes =
        postcard::to_stdvec(value).map_err(|e| TestCaseError::fail(format!("postcard encode {value:?}: {e}")))?;
    let decoded: T =
        postcard::from_bytes(&bytes).map_err(|e| TestCaseError::fail(format!("postcard decode {value:?}: {e}")))?;
    prop_assert_eq!(&decoded, value);
    let json = serde_json::to_string(value).map_err(|e| TestCaseError::fail(format!("json encode {value:?}: {e}")))?;
    let decoded: T =
        serde_json::from_str(&json).map_err(|e| TestCaseError::fail(format!("json decode {json}: {e}")))?;
    prop_assert_eq!(&decoded, value);
    Ok(())
}
