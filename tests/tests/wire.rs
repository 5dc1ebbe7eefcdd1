//! The wire, one test binary (one module per file in `wire/`): conformance
//! with flodl 0.8's vectors and the properties of every framing.

// The root is not a `main.rs` and each file is named by `#[path]`, so that
// proptest keeps a module's failure seeds beside its file (the
// `.proptest-regressions` files here); under a `main.rs` it would look in a
// `proptest-regressions/` directory beside the binary's folder instead.

#[path = "wire/conformance.rs"]
mod conformance;
#[path = "wire/props.rs"]
mod props;
