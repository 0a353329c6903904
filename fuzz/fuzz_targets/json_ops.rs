#![no_main]
//! Fuzz target `json_ops`: see `tidemark_fuzz::json_ops` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::json_ops(data));
