#![no_main]
//! Fuzz target `context`: see `tidemark_fuzz::context` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::context(data));
