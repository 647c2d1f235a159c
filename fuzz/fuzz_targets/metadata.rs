//! libFuzzer entry point of the `metadata` target; the logic is in `keel_fuzz::metadata`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::metadata(data));
