#![no_main]
//! Fuzz target `delta`: see `tidemark_fuzz::delta` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::delta(data));
