//! libFuzzer entry point of the `partition` target; the logic is in `keel_fuzz::partition`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keel_fuzz::partition(data));
