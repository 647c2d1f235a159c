//! libFuzzer entry point of the `assignors` target; the logic is in `keel_fuzz::assignors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::assignors(data));
