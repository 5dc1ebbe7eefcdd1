//! Embedding cohort: a controller in your own event loop.
//!
//! The controller (`ControllerNode`, a sans-IO machine) runs on
//! `cohort_driver_mio::Driver`, registered on a mio `Poll` this program
//! owns: the loop below is the whole drive loop, written out. Two worker
//! hosts of two ranks each join it: they are what the `cohort agent`
//! program runs (its agent, relays and ranks), started here in-process on
//! threads of their own so the example is self-contained. The run trains
//! two epochs, and the program exits once every rank has left and the
//! controller stopped cleanly.
//!
//! `cargo run -p cohort-examples --example embed_controller`
//!
//! # What the loop owes the controller
//!
//! A driver's obligations (`cohort_driver_core::engine` lists them all);
//! `Driver` carries out the socket-level ones, the loop the rest:
//!
//! - **Settle** (the driver's): the machine is live from its constructor
//!   and may already hold outputs; `Driver` carries them out on its first
//!   `fire_timers`, and `next_deadline` says "now" until then.
//! - **Call in on readiness** (ours): hand every mio event to
//!   `handle_event` (it ignores tokens outside its `TokenRange`).
//! - **Bytes that were there first** (the driver's): sockets are registered
//!   edge-triggered, so a connection's first bytes raise an edge.
//! - **Wake on time** (ours): sleep at most until `next_deadline`, then
//!   `fire_timers`; late delays the machine, early is harmless.
//! - **Drain events** (ours): after every call in, take `poll_event` until
//!   `None` (the queue is unbounded).
//! - **A run that ended is not a stop** (ours): `Finished` means the
//!   coordinator decided the run is over, not that its last frames are out
//!   (every rank's `Shutdown`); keep driving until every rank's exit came
//!   back through its host's agent (`JoinWindowEvent::RankExited`), or a grace
//!   period passed.
//! - **Stop cleanly, or crash** (ours): `begin_shutdown` flushes and closes
//!   every connection; keep driving until `is_idle`. Dropping the driver
//!   instead is a crash: sockets close unflushed.

use std::collections::BTreeSet;
use std::error::Error;
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort::cluster::host::{HostParams, MioHost, stop_all};
use cohort_driver_mio::{Clock, Config, Driver, NodeEvent, TokenRange};
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::ledger::{JoinConfig, TrustMode};
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::controller::{
    ControllerConfig, ControllerNode, ControllerNodeEvent, ControllerOutcome,
};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::knobs::RunKnobs;
use mio::{Events, Poll};

/// After `Finished`, how long to wait for the ranks to leave before stopping anyway.
const EXIT_GRACE: Duration = Duration::from_secs(5);

pub fn main() -> Result<(), Box<dyn Error>> {
    // The controller: its port, its join window (form with 4 ranks), its run.
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let at = listener.local_addr()?;
    let scale = TimeoutScale::new(0.1)?;
    let join = JoinConfig { min_rank_start: 4, target_ranks: Some(4), ..JoinConfig::default() };
    let trust = TrustMode::resolve(&join, at.ip().is_loopback());
    let knobs = RunKnobs {
        epochs: 2,
        samples_per_epoch: 200,
        batch_size: 1,
        sync_every: 5,
        model_elems: 16,
        ..RunKnobs::default()
    };
    let advertise = ControllerAddr { host: at.ip().to_string(), port: at.port() };
    let salt = cohort_driver_core::os_salt()?;
    let cfg = ControllerConfig::from_knobs(join, salt, trust, scale, advertise, &knobs)?;

    // Our loop owns the Poll; the driver gets tokens 1..1025 of it.
    let mut poll = Poll::new()?;
    let clock = Clock::start();
    let controller = ControllerNode::new(cfg, clock.now())?;
    let tokens = TokenRange::new(1, 1024);
    let mut driver = Driver::new(controller, poll.registry(), tokens, Config::scaled(scale), clock)?;
    driver.adopt_listener(listener)?;

    // Two worker hosts, as `cohort agent --connect ADDR --ranks 2` would run them.
    let (sink, _host_events) = mpsc::channel();
    let mut hosts = Vec::new();
    for i in 0..2 {
        let p = HostParams::new(format!("host-{i}"), 2, at.to_string()).timeout_scale(scale).clock(clock);
        hosts.push(MioHost::spawn(p, sink.clone())?);
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut events = Events::with_capacity(256);
    let mut finished: Option<(ControllerOutcome, Instant)> = None;
    let mut left = BTreeSet::new();
    let mut stopping = false;
    loop {
        // Wake on time: sleep at most until the driver's next deadline (and
        // at most 100 ms, for our own deadline).
        let wait = driver.next_deadline().map(|t| t.saturating_since(driver.now()));
        poll.poll(
            &mut events,
            Some(wait.map_or(Duration::from_millis(100), |w| w.min(Duration::from_millis(100)))),
        )?;
        // Call in on readiness, then fire whatever is due.
        for event in events.iter() {
            driver.handle_event(event);
        }
        driver.fire_timers();
        // Drain the events after every call in.
        while let Some(event) = driver.poll_event() {
            let NodeEvent::Machine(event) = event else { continue };
            match event {
                ControllerNodeEvent::Started { world_size } => println!("world formed: {world_size} ranks"),
                ControllerNodeEvent::Coord(CoordinatorEvent::EpochAggregated { metrics }) => {
                    println!("epoch {} done", metrics.epoch)
                }
                // Each rank's exit, as its host's agent reports it.
                ControllerNodeEvent::Join(JoinWindowEvent::RankExited { rank, code, .. }) => {
                    println!("rank {rank} exited with code {code}");
                    left.insert(rank);
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank, cause, .. }) => {
                    println!("rank {rank} dead: {cause}");
                    left.insert(rank);
                }
                ControllerNodeEvent::Finished(outcome) => {
                    println!("run finished: {outcome:?}");
                    finished = Some((outcome, Instant::now()));
                }
                _ => {}
            }
        }
        // A run that ended is not a stop: keep serving until the ranks left.
        if !stopping
            && let Some((_, at)) = &finished
            && (left.len() == 4 || at.elapsed() > EXIT_GRACE)
        {
            driver.begin_shutdown();
            stopping = true;
        }
        // Stop cleanly: drive until every connection is flushed and closed.
        if stopping && driver.is_idle() {
            break;
        }
        if Instant::now() > deadline {
            return Err("the run did not end within 60 s".into());
        }
    }
    stop_all(hosts);
    let (outcome, _) = finished.ok_or("no outcome")?;
    if outcome != ControllerOutcome::Done || left.len() != 4 {
        return Err(format!("the run ended {outcome:?} with {} of 4 ranks gone", left.len()).into());
    }
    println!("done: every rank left, the controller stopped cleanly");
    Ok(())
}
