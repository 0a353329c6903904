#![no_main]
//! Fuzz target `wal`: see `tidemark_fuzz::wal` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::wal(data));
