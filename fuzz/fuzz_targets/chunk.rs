#![no_main]
//! Fuzz target `chunk`: see `tidemark_fuzz::chunk` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::chunk(data));
