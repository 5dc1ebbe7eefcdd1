//! `GET /metrics` on a real loopback controller (the demo's, which serves
//! it): scraped while the world trains and at the run's end, parsed by a
//! Prometheus text parser as a scraper would, and its values held to what
//! the controller's events said.

use std::collections::BTreeMap;
use std::time::Duration;

use cohort::cluster::demo::{self, DemoOptions, Kill};
use cohort::cluster::{ClusterEvent, Source, http};
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::reduce::ReduceEvent;
use prometheus_parse::{Sample, Scrape, Value};

/// 2 hosts x 2 ranks, 2 epochs of 400 samples in 5 ms batches, a round
/// every 5 batches, rank 3 killed 0.25 s in.
fn opts() -> DemoOptions {
    DemoOptions {
        knobs: RunKnobs {
            epochs: 2,
            samples_per_epoch: 400,
            batch_size: 1,
            sync_every: 5,
            model_elems: 64,
            ..RunKnobs::default()
        },
        batch_ms: 5.0,
        kill: Some(Kill { rank: 3, after: Duration::from_millis(250) }),
        deadline: Duration::from_secs(60),
        ..DemoOptions::default()
    }
}

fn parse(body: &str) -> Scrape {
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("the body parses as Prometheus text")
}

/// The one sample of `metric` whose labels include `labels`.
fn sample<'a>(scrape: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> &'a Sample {
    let found: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "{metric} {labels:?}: {found:?}");
    found[0]
}

/// A counter's or gauge's value.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match &sample(scrape, metric, labels).value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{metric} is not a number: {other:?}"),
    }
}

/// Every series of `metric`, by the value of `label`.
fn by_label(scrape: &Scrape, metric: &str, label: &str) -> BTreeMap<String, f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .map(|s| {
            let v = match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => f64::NAN,
            };
            (s.labels.get(label).unwrap_or_default().to_owned(), v)
        })
        .collect()
}

/// A histogram's `+Inf` bucket: its count.
fn histogram_count(scrape: &Scrape, metric: &str) -> f64 {
    match &sample(scrape, metric, &[]).value {
        Value::Histogram(buckets) => {
            buckets.iter().find(|b| b.less_than == f64::INFINITY).map_or(f64::NAN, |b| b.count)
        }
        other => panic!("{metric} is not a histogram: {other:?}"),
    }
}

#[test]
fn metrics_scraped_from_a_loopback_controller_say_what_its_events_said() {
    let mut addr: Option<String> = None;
    let mut during = None;
    let (mut rounds, mut cycles, mut deaths) = (0u64, 0u64, Vec::new());
    let report = demo::run(&opts(), |s| {
        if let ClusterEvent::Listening { addr: a } = &s.event {
            addr = Some(a.clone());
        }
        let (Source::Controller, ClusterEvent::Controller(e)) = (&s.source, &s.event) else { return };
        match e {
            ControllerNodeEvent::Started { .. } => {
                let at = addr.as_deref().expect("the controller's address comes first");
                during = Some(http::request(at, "GET", "/metrics", Duration::from_secs(5)).expect("scrape"));
            }
            ControllerNodeEvent::Reduce(ReduceEvent::Consensus { .. }) => rounds += 1,
            ControllerNodeEvent::Coord(CoordinatorEvent::CycleFinished { .. }) => cycles += 1,
            ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank, cause, .. }) => {
                deaths.push((*rank, cause.label()))
            }
            _ => {}
        }
    })
    .expect("demo runs");
    let text = report.lines().join("\n");
    assert!(report.ok(), "{text}");

    // While the world trains: formed, nobody dead yet.
    let during = during.expect("scraped at formation");
    assert_eq!(during.status, 200, "{}", during.body);
    let early = parse(&during.body);
    assert_eq!(value(&early, "cohort_world_size", &[]), 4.0);
    assert_eq!(value(&early, "cohort_joined_ranks", &[]), 4.0);
    assert_eq!(value(&early, "cohort_join_window_phase", &[("phase", "training")]), 1.0);
    assert_eq!(value(&early, "cohort_join_window_phase", &[("phase", "waiting")]), 0.0);
    assert!(by_label(&early, "cohort_rank_deaths_total", "cause").values().all(|n| *n == 0.0));

    // At the end: the numbers the events gave.
    let body = report.metrics.as_ref().expect("scraped at the end");
    let end = parse(body);
    assert_eq!(value(&end, "cohort_world_size", &[]), f64::from(report.world_size));
    assert!(rounds > 0, "{text}");
    assert_eq!(rounds, report.check.rounds);
    assert_eq!(value(&end, "cohort_averaging_rounds_total", &[]), rounds as f64, "{body}");
    // Every round was asked for by a cycle, so every one was timed.
    assert_eq!(histogram_count(&end, "cohort_averaging_round_latency_seconds"), rounds as f64, "{body}");
    assert_eq!(value(&end, "cohort_averaging_cycles_completed_total", &[]), cycles as f64);

    // The killed rank: one death, under the cause the coordinator gave.
    assert_eq!(deaths.len(), 1, "{deaths:?}");
    assert_eq!(deaths[0].0, 3);
    let by_cause = by_label(&end, "cohort_rank_deaths_total", "cause");
    assert_eq!(by_cause.len(), 9, "{by_cause:?}");
    assert_eq!(by_cause[deaths[0].1], 1.0, "{by_cause:?}");
    assert_eq!(by_cause.values().sum::<f64>(), 1.0, "{by_cause:?}");
    assert_eq!(histogram_count(&end, "cohort_death_detection_delay_seconds"), 1.0);

    // Traffic on every channel the run used, none unrouted.
    let received = by_label(&end, "cohort_received_bytes_total", "channel");
    let sent = by_label(&end, "cohort_sent_bytes_total", "channel");
    for channel in ["join", "control", "data", "status"] {
        assert!(received[channel] > 0.0, "{channel}: {received:?}");
        assert!(sent[channel] > 0.0, "{channel}: {sent:?}");
    }
    assert_eq!(received["unrouted"], 0.0, "{received:?}");
    assert!(by_label(&end, "cohort_join_refusals_total", "reason").values().all(|n| *n == 0.0));

    // The run's progress: its last epoch, whole; ElChe's counts for every rank.
    assert_eq!(value(&end, "cohort_run_epochs", &[]), 2.0);
    assert_eq!(value(&end, "cohort_epoch", &[]), 1.0);
    assert_eq!(value(&end, "cohort_epoch_processed_samples", &[]), 400.0);
    assert_eq!(value(&end, "cohort_epoch_size_samples", &[]), 400.0);
    assert!(value(&end, "cohort_elche_anchor_batches", &[]) >= 1.0, "{body}");
    assert_eq!(by_label(&end, "cohort_elche_rank_batches", "rank").len(), 4, "{body}");
    assert_eq!(value(&end, "cohort_join_window_phase", &[("phase", "done")]), 1.0);
}
