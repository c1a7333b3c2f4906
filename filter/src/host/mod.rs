//! Glue to the proxy-wasm ABI. Only `Result`-returning host calls are used;
//! every failure is logged and turns into "let the request through".

pub(crate) mod calls;
pub(crate) mod http;
pub(crate) mod root;
