//! Faults: ranks stopped or killed, a relay killed mid-round.

use std::time::{Duration, Instant};

use cohort_proto::wire::ControlMsgWire;

use crate::check::Expect;
use crate::suite::cluster::{
    FAULT_SCALE, Host, SAMPLES, SCALE, Train, agent_ranks, cohort_controller_finished, declared_dead,
    exit_reported, expect, failed_line, flodl_agent, free_port, fresh_token, last_command, rank_args,
    rank_events, rank_pid, ranks, run_check,
};
use crate::suite::logs::{Log, cut};
use crate::suite::proc::{End, poll, signal};
use crate::suite::{Ctx, ensure, flodl};

use super::train::tap;

/// The samples the survivors received as `ExtendPartition`s.
fn extended(log: &Log) -> u64 {
    log.commands()
        .iter()
        .filter_map(|(_, m)| match m {
            ControlMsgWire::ExtendPartition { partition_size, .. } => Some(*partition_size),
            _ => None,
        })
        .sum()
}

fn extensions(log: &Log) -> usize {
    log.commands().iter().filter(|(_, m)| matches!(m, ControlMsgWire::ExtendPartition { .. })).count()
}

/// Waits (at most `secs`) for rank `rank` to have received `n` consensus
/// rounds, or says how far it got.
fn rounds_reached(log: &Log, rank: u32, n: usize, secs: f64) -> Result<(), String> {
    let reached = poll(secs, None, || (rank_events(log, "consensus", rank) >= n).then_some(()));
    ensure!(
        reached.is_some(),
        "rank {rank} never received {n} consensus rounds ({} came; its last command: {})",
        rank_events(log, "consensus", rank),
        last_command(log, rank)
    );
    Ok(())
}

/// A cohort rank stops (SIGSTOP: its sockets stay open, it sends nothing)
/// under flodl's coordinator: declared dead when stale (> scaled 30 s), its
/// unprocessed remainder split over the survivors (ExtendPartition), the
/// controller's DeclareDead takes it out of the relay's fold; the survivors
/// finish both epochs. (The whole-batch sample total is not checked: flodl
/// drops a dead rank's share from later epochs, see the report.)
pub fn rank_wedged_flodl_coordinator(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    let t = Train { port, world: 3, scale: FAULT_SCALE, samples: 1200 };
    let mut ctl = t.flodl(ctx, &ctx.at("controller"), "cpu", &token, &[])?;
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agent"),
        Host { name: "hostA", devices: 3, at: &at, scale: FAULT_SCALE },
        &["--salt", &token],
        &rank_args(10, Some(4)),
    )?;
    rounds_reached(&a.out, 2, 3, 15.0)?;
    let pid = rank_pid(&a.err, 2).ok_or("no pid for rank 2")?;
    signal(pid, libc::SIGSTOP)?;
    let out = &ctl.out;
    ensure!(
        poll(20.0, Some(&mut ctl.proc), || out.has("declaring dead").then_some(())).is_some(),
        "flodl never declared the stopped rank dead"
    );
    ensure!(
        poll(10.0, None, || (extensions(&a.out) >= 1).then_some(())).is_some(),
        "no survivor received the stopped rank's remainder"
    );
    // Dead in flodl's ledger: its end no longer matters to the reduce.
    signal(pid, libc::SIGKILL)?;
    let arc = a.proc.wait(60);
    let crc = ctl.proc.wait(30);
    let moved = ctl.out.first_of(|l| flodl::redistributed(l, 2, 2));
    let moved = moved.ok_or("flodl did not redistribute rank 2's remainder over the 2 survivors")?;
    let sent = extended(&a.out);
    ensure!(sent == moved, "the survivors received {sent} samples of rank 2's {moved}");
    let x = Expect {
        ranks: vec![0, 1, 2],
        survivors: Some(vec![0, 1]),
        epochs: 2,
        min_rounds: 1,
        ..Expect::default()
    };
    run_check(&ctx.dir, &x, &[&a.out])?;
    ensure!(
        ctl.err.has("reports rank 2 exited with code -1"),
        "flodl: no -1 exit reported for the killed rank"
    );
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}");
    ensure!(crc == End::Exit(0), "flodl controller exit status {crc}");
    Ok(())
}

/// A cohort rank is killed (SIGKILL) under flodl's coordinator. flodl 0.8:
/// the agent reports exit -1, the coordinator declares it dead and splits
/// its remainder over the survivors; but its relay's data leg reports the
/// rank's exit (RankExit) before the death reaches the ledger, which ends
/// flodl's CPU reduce for everyone: the survivors lose their data plane and
/// exit 1, as flodl's own ranks would. Checked: the redistribution, every
/// round reduced until then exact, the survivors stop (data plane failure)
/// instead of hanging, everyone ends in bounded time.
pub fn rank_killed_flodl_coordinator(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    let t = Train { port, world: 3, scale: FAULT_SCALE, samples: 1200 };
    let mut ctl = t.flodl(ctx, &ctx.at("controller"), "cpu", &token, &[])?;
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agent"),
        Host { name: "hostA", devices: 3, at: &at, scale: FAULT_SCALE },
        &["--salt", &token],
        &rank_args(10, Some(4)),
    )?;
    rounds_reached(&a.out, 2, 3, 15.0)?;
    let pid = rank_pid(&a.err, 2).ok_or("no pid for rank 2")?;
    signal(pid, libc::SIGKILL)?;
    let arc = a.proc.wait(60);
    let crc = ctl.proc.wait(30);
    ensure!(
        ctl.err.has("reports rank 2 exited with code -1"),
        "flodl: no -1 exit reported for the killed rank"
    );
    let moved = ctl.out.first_of(|l| flodl::redistributed(l, 2, 2));
    let moved = moved.ok_or("flodl did not redistribute rank 2's remainder over the 2 survivors")?;
    let sent = extended(&a.out);
    ensure!(sent == moved, "the survivors received {sent} samples of rank 2's {moved}");
    let x = Expect { ranks: vec![0, 1, 2], survivors: Some(vec![]), min_rounds: 1, ..Expect::default() };
    run_check(&ctx.dir, &x, &[&a.out])?;
    for r in 0..2u32 {
        let node = format!("rank {r}");
        ensure!(
            rank_events(&a.out, "data_failed", r) == 1,
            "survivor rank {r} did not stop on its lost data plane ({})",
            a.out.with_events(|es| es
                .iter()
                .rev()
                .find(|e| e.node == node && e.level != "debug")
                .map_or(String::new(), |e| cut(&format!("{}: {}", e.event, e.text), 200)))
        );
        ensure!(
            ctl.err.has(&format!("reports rank {r} exited with code 1")),
            "flodl: rank {r}'s exit 1 not reported"
        );
    }
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}");
    ensure!(crc == End::Exit(0), "flodl controller exit status {crc}");
    Ok(())
}

/// Two flodl hosts under a cohort controller; host B's relay is killed
/// (SIGKILL) while a round is half folded there: rank 3 (B) is stopped
/// (SIGSTOP) after the round's RequestParams reached it and before it
/// submitted, rank 2 (B) submits, so B's relay holds one deposit of a round
/// it cannot complete; then the relay dies. B's ranks end (flodl's agent
/// kills them, or they exit first on their relay's end) and are reported;
/// they are dead, the round completes with host A's frame alone, A finishes
/// both epochs with every consensus exact.
pub fn relay_killed_cohort_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let tport = free_port(&[port])?;
    // Whole-epoch dispatch: the `Throttle` barrier holds the round's ranks.
    let t = Train { port, world: 4, scale: FAULT_SCALE, samples: 400 };
    let mut ctl = t.cohort(ctx, &ctx.at("controller"), &["--whole-epochs"])?;
    let _tap = tap(ctx, tport, port)?;
    // Long batches: a RequestParams lands mid-batch, and the rank submits
    // at the batch's end, tens of milliseconds later.
    let slow = rank_args(100, None);
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agentA"),
        Host { name: "hostA", devices: 2, at: &format!("127.0.0.1:{port}"), scale: FAULT_SCALE },
        &[],
        &slow,
    )?;
    let aerr = &a.err;
    ensure!(
        poll(10.0, Some(&mut a.proc), || aerr.has("joined as rank(s)").then_some(())).is_some(),
        "host A never joined"
    );
    let mut b = flodl_agent(
        ctx,
        &ctx.at("agentB"),
        Host { name: "hostB", devices: 2, at: &format!("127.0.0.1:{tport}"), scale: FAULT_SCALE },
        &[],
        &slow,
    )?;
    let berr = &b.err;
    ensure!(
        poll(10.0, Some(&mut b.proc), || berr.has("joined as rank(s)").then_some(())).is_some(),
        "host B never joined"
    );
    let (ra, rb) = (agent_ranks(&a.err), agent_ranks(&b.err));
    ensure!(
        ra.as_deref() == Some(&[0, 1][..]) && rb.as_deref() == Some(&[2, 3][..]),
        "admission order: A got {ra:?}, B got {rb:?}"
    );
    ensure!(
        poll(30.0, None, || (b.out.count(|e| e.event == "consensus") >= 4).then_some(())).is_some(),
        "host B's ranks never got 2 rounds each"
    );
    let stopped = rank_pid(&b.err, 3).ok_or("no pid for rank 3")?;
    let requests = |log: &Log| {
        log.count(|e| e.is("command", "rank 3") && matches!(e.msg(), Some(ControlMsgWire::RequestParams)))
    };
    let (mut tries, mut held) = (0, false);
    while !held && tries < 20 {
        tries += 1;
        let sub = rank_events(&b.out, "submitted", 3);
        // The next round's request reaches rank 3 ...
        if poll(10.0, None, || (requests(&b.out) > sub).then_some(())).is_none() {
            break;
        }
        signal(stopped, libc::SIGSTOP)?;
        // ... and it is held before it submits (lines it wrote before the
        // stop are let through first).
        quiet(&b.out, Duration::from_millis(300), Duration::from_secs(5));
        if rank_events(&b.out, "submitted", 3) < requests(&b.out) {
            held = true;
        } else {
            signal(stopped, libc::SIGCONT)?;
        }
    }
    ensure!(held, "could not hold rank 3 between a RequestParams and its submission ({tries} tries)");
    let req = requests(&b.out);
    ensure!(
        poll(10.0, None, || (rank_events(&b.out, "submitted", 2) >= req).then_some(())).is_some(),
        "rank 2 never submitted round {}",
        req - 1
    );
    let relay =
        b.err.first_of(|l| flodl::relay_child(l).map(|(pid, _)| pid)).ok_or("no pid for host B's relay")?;
    signal(relay, libc::SIGKILL)?;
    signal(stopped, libc::SIGCONT)?;
    let (arc, stall) = a.proc.wait_run(90, 8, &[&a.out]);
    if let Some(s) = stall {
        return Err(s);
    }
    let brc = b.proc.wait(30);
    let crc = ctl.proc.wait(30);
    let x = Expect {
        ranks: vec![0, 1, 2, 3],
        survivors: Some(vec![0, 1]),
        epochs: 2,
        min_rounds: 1,
        ..Expect::default()
    };
    run_check(&ctx.dir, &x, &[&a.out, &b.out])?;
    // flodl's agent polls its children every 50 ms, and cohort's ranks end
    // at once when their relay's legs close: a race decides whether the
    // agent finds the dead relay with its ranks still running (it tears its
    // host down and exits 1) or finds the ranks' exits first (it finishes
    // DEGRADED and exits 0). Either way host B's ranks are gone.
    let torn_down = b.err.has("relay died with 2 rank child(ren) still running");
    ensure!(
        torn_down || b.err.has("finished DEGRADED"),
        "flodl agent B neither tore its host down nor finished DEGRADED"
    );
    for r in 2..4 {
        ensure!(declared_dead(&ctl.out, r), "cohort controller never declared rank {r} dead");
    }
    ensure!(
        !ctl.out.any(|e| e.event == "rank_dead" && e.str("cause") == Some("stale")),
        "a rank died of staleness: the fault was not the relay's"
    );
    cohort_controller_finished(&ctl.out, 4, 2)?;
    ensure!(arc == End::Exit(0), "flodl agent A exit status {arc}");
    let want = End::Exit(if torn_down { 1 } else { 0 });
    ensure!(brc == want, "flodl agent B exit status {brc} ({want} expected)");
    ensure!(crc == End::Exit(0), "cohort controller exit status {crc}");
    Ok(())
}

/// Waits (at most `limit`) until `log` has not grown for `quiet`: what a
/// stopped process wrote has come through.
fn quiet(log: &Log, quiet: Duration, limit: Duration) {
    let until = Instant::now() + limit;
    let (mut last, mut since) = (u64::MAX, Instant::now());
    while Instant::now() < until {
        let size = log.size();
        if size != last {
            (last, since) = (size, Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A flodl agent's rank is killed (SIGKILL) under a cohort controller: the
/// agent reports its exit code (-1) up the host link, the controller
/// declares it dead and hands its remainder to the survivors, who finish.
pub fn rank_exit_cohort_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    // Whole-epoch dispatch: the remainder goes out as `ExtendPartition`.
    let t = Train { port, world: 3, scale: FAULT_SCALE, samples: 600 };
    let mut ctl = t.cohort(ctx, &ctx.at("controller"), &["--whole-epochs"])?;
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agent"),
        Host { name: "hostA", devices: 3, at: &at, scale: FAULT_SCALE },
        &[],
        &rank_args(10, None),
    )?;
    ensure!(
        poll(30.0, None, || (rank_events(&a.out, "consensus", 1) >= 3).then_some(())).is_some(),
        "rank 1 never received 3 consensus rounds: {}",
        failed_line(&a.err)
    );
    let pid = rank_pid(&a.err, 1).ok_or("no pid for rank 1")?;
    signal(pid, libc::SIGKILL)?;
    let arc = a.proc.wait(60);
    let crc = ctl.proc.wait(30);
    ensure!(
        exit_reported(&ctl.out, "hostA", 1, -1),
        "cohort controller: no exit code -1 reported for rank 1"
    );
    ensure!(declared_dead(&ctl.out, 1), "cohort controller never declared rank 1 dead");
    ensure!(
        poll(1.0, None, || (extensions(&a.out) >= 1).then_some(())).is_some(),
        "no survivor received rank 1's remainder"
    );
    let x = Expect {
        ranks: vec![0, 1, 2],
        survivors: Some(vec![0, 2]),
        epochs: 2,
        min_rounds: 1,
        ..Expect::default()
    };
    run_check(&ctx.dir, &x, &[&a.out])?;
    cohort_controller_finished(&ctl.out, 3, 1)?;
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}");
    ensure!(a.err.has("finished DEGRADED"), "flodl agent: no degraded finish");
    ensure!(crc == End::Exit(0), "cohort controller exit status {crc}");
    Ok(())
}

/// A flodl host killed in a cohort controller's join window is retracted
/// (cohort's rules): the world of 4 forms without it, at the target, once
/// hostB comes. hostA, admitted after it as ranks 1 and 2, moves
/// down to 0 and 1: flodl's agent starts its ranks from the envelope (the
/// world's ranks) and reports their exits by its accept's ranks, which the
/// controller maps back to the world's.
pub fn join_lost_cohort_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let t = Train { port, world: 4, scale: SCALE, samples: SAMPLES };
    let mut ctl = t.cohort(ctx, &ctx.at("controller"), &[])?;
    let at = format!("127.0.0.1:{port}");
    let admitted = |host: &str| {
        poll(30.0, None, || {
            ctl.out.any(|e| e.event == "host_admitted" && e.str("host") == Some(host)).then_some(())
        })
        .is_some()
    };
    let host = |name, devices| Host { name, devices, at: &at, scale: SCALE };
    let mut x = flodl_agent(ctx, &ctx.at("agent-x"), host("hostX", 1), &[], &ranks())?;
    ensure!(admitted("hostX"), "hostX was never admitted: {}", failed_line(&x.err));
    let mut a = flodl_agent(ctx, &ctx.at("agent-a"), host("hostA", 2), &[], &ranks())?;
    ensure!(admitted("hostA"), "hostA was never admitted: {}", failed_line(&a.err));
    x.proc.stop();
    let retracted =
        poll(30.0, None, || ctl.out.find(|e| e.event == "join_retracted" && e.str("host") == Some("hostX")));
    ensure!(retracted.is_some(), "hostX's admission was never retracted after its agent ended");
    ensure!(
        !ctl.out.any(|e| e.event == "formed"),
        "the world formed around hostX's rank: {}",
        ctl.out.first("formed")
    );
    // hostB's relay needs its own loopback port pair: it joins through a
    // forwarder (see flodl_relays_cohort_controller).
    let tport = free_port(&[port])?;
    let _tap = tap(ctx, tport, port)?;
    let via = format!("127.0.0.1:{tport}");
    let hb = Host { name: "hostB", devices: 2, at: &via, scale: SCALE };
    let mut b = flodl_agent(ctx, &ctx.at("agent-b"), hb, &[], &ranks())?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out, &b.out]);
    stall.map_or(Ok(()), Err)?;
    let brc = b.proc.wait(30);
    let crc = ctl.proc.wait(30);
    ensure!(agent_ranks(&a.err) == Some(vec![1, 2]), "hostA's accept named {:?}", agent_ranks(&a.err));
    ensure!(agent_ranks(&b.err) == Some(vec![2, 3]), "hostB's accept named {:?}", agent_ranks(&b.err));
    run_check(&ctx.dir, &expect(&[0, 1, 2, 3]), &[&a.out, &b.out])?;
    cohort_controller_finished(&ctl.out, 4, 2)?;
    for (host, rank) in [("hostA", 0), ("hostA", 1), ("hostB", 2), ("hostB", 3)] {
        ensure!(
            exit_reported(&ctl.out, host, rank, 0),
            "cohort controller: no exit code 0 reported for {host}'s rank {rank}"
        );
    }
    ensure!(
        !ctl.out.any(|e| e.event == "join_warning"),
        "cohort controller: {}",
        ctl.out.first("join window:")
    );
    ensure!(arc == End::Exit(0), "hostA's flodl agent exit status {arc}: {}", failed_line(&a.err));
    ensure!(brc == End::Exit(0), "hostB's flodl agent exit status {brc}: {}", failed_line(&b.err));
    ensure!(crc == End::Exit(0), "cohort controller exit status {crc}");
    Ok(())
}
