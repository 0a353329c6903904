#![no_main]
//! Fuzz target `marks`: see `tidemark_fuzz::marks` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::marks(data));
