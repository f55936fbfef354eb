//! Crate-level tests of the registry client: they exercise the client and the parsers across
//! modules, so they live at the crate root (`src/tests/`) rather than beside one module.

/// The client against a scripted HTTP/1.1 server on 127.0.0.1.
mod mock;
/// Property tests of the parsers.
mod prop;
