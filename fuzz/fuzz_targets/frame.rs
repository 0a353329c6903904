#![no_main]
//! Fuzz target `frame`: see `tidemark_fuzz::frame` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::frame(data));
