//! Runs each example program's `main` to its end: the examples are
//! compiled as part of this test, so `cargo test --workspace` both builds
//! and runs them.

#[path = "../embed_controller.rs"]
mod embed_controller;
#[path = "../train_linear_regression.rs"]
mod train_linear_regression;

#[test]
fn embed_controller_trains_and_stops_cleanly() {
    embed_controller::main().expect("the embedded controller's run");
}

#[test]
fn train_linear_regression_lowers_the_loss() {
    train_linear_regression::main().expect("the training run");
}
