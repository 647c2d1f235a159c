//! libFuzzer entry point of the `recovery` target; the logic is in `keel_fuzz::recovery`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::recovery(data));
