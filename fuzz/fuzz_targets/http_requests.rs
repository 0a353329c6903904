#![no_main]
//! Fuzz target `http_requests`: see `tidemark_fuzz::http_requests` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidemark_fuzz::http_requests(data));
