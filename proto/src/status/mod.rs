//! The controller's HTTP status endpoint, both sides: the [`server`] that
//! answers on the controller's single port (`GET /state.json`, `POST
//! /start`), and the operator's [`client`] that asks it.

pub mod client;
pub mod server;

pub use client::{StatusAnswer, StatusClient, StatusClientEvent, parse_answer};
pub use server::*;
