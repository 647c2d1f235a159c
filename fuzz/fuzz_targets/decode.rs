//! libFuzzer entry point of the `decode` target; the logic is in `keel_fuzz::decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::decode(data));
