//! The controller's HTTP status endpoint, both sides: the [`server`] that
//! answers on the controller's single port (`GET /state.json`, `POST
//! /start`, and with metrics on, cohort's `GET /metrics`), the operator's
//! [`client`] that asks it, and the [`metrics`] a scrape reads.

pub mod client;
pub mod metrics;
pub mod server;

pub use client::{StatusAnswer, StatusClient, StatusClientEvent, parse_answer};
pub use metrics::{METRICS_CONTENT_TYPE, MetricsRenderer, MetricsSnapshot};
pub use server::*;
