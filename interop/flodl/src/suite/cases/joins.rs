//! Joins refused (and admitted): both controllers must decide the same,
//! for the same typed reason.

use std::io::Write as _;
use std::time::Duration;

use cohort_proto::wire::json::{Framing, decode_to_json, encode_from_json};
use cohort_proto::wire::{DEFAULT_FRAME_CEILING, MacKey, SessionSalt};
use serde_json::Value;

use crate::suite::cluster::{
    Controller, Joiner, SCALE, Side, cohort_controller_with, flodl_controller_with, free_port, fresh_token,
    join_attempt, join_controller,
};
use crate::suite::proc::{Cmd, End, Proc, poll};
use crate::suite::reason::{JoinOutcome, Refusal};
use crate::suite::{Ctx, ensure, flodl};

use super::shapes::differences;

/// A hello keyed with the wrong salt. flodl's window drops it without a
/// reply (it counts as a rejected attempt); the joiner finds the connection
/// closed. Both ways: flodl's agent at a cohort controller, cohort's agent
/// at a flodl controller; neither is admitted, both joiners fail promptly.
pub fn wrong_salt(ctx: &mut Ctx) -> Result<(), String> {
    let token = fresh_token()?;
    let fp = free_port(&[])?;
    let cp = free_port(&[fp])?;
    let fctl = flodl_controller_with(
        &ctx.at("flodl"),
        60,
        Cmd::new(&ctx.peer).words(&format!(
            "controller --port {fp} --backend none --quorum 2 --join-timeout 20 --max-join-timeout 30 \
            --token {token} --timeout-scale {SCALE}"
        )),
    )
    .map_err(|_| "flodl controller never opened".to_string())?;
    let cctl = cohort_controller_with(
        &ctx.at("cohort"),
        60,
        Cmd::new(&ctx.cohort).words(&format!(
            "controller --bind 127.0.0.1:{cp} --pre-shared --salt {token} --min-ranks 2 \
            --join-timeout-secs 20 --max-join-timeout-secs 30 --timeout-scale {SCALE}"
        )),
    )
    .map_err(|_| "cohort controller never listened".to_string())?;
    let wrong = fresh_token()?;
    let flodl_agent = |name: &str, port: u16| {
        Proc::spawn(
            &ctx.at(name),
            30,
            &Cmd::new(&ctx.peer).words(&format!(
                "agent --controller 127.0.0.1:{port} --host hostA --salt {wrong} --timeout-scale {SCALE}"
            )),
        )
    };
    // Reference: flodl's agent at flodl's controller.
    let mut a1 = flodl_agent("flodl-agent-flodl", fp)?;
    let mut a2 = flodl_agent("flodl-agent-cohort", cp)?;
    let mut a3 = Proc::spawn(
        &ctx.at("cohort-agent-flodl"),
        30,
        &Cmd::new(&ctx.cohort).words(&format!(
            "agent --connect 127.0.0.1:{fp} --host hostB --salt {wrong} --timeout-scale {SCALE} --json"
        )),
    )?;
    let rc = a1.wait(30);
    ensure!(
        rc == End::Exit(1),
        "reference: flodl's agent with a wrong salt at flodl's controller ended {rc}"
    );
    let reference = a1.err().first_of(flodl::failure).unwrap_or_default();
    let rc = a2.wait(30);
    ensure!(rc == End::Exit(1), "flodl's agent with a wrong salt at cohort's controller ended {rc}");
    let got = a2.err().first_of(flodl::failure).unwrap_or_default();
    ensure!(got == reference, "flodl's agent: at flodl's controller {reference:?}, at cohort's {got:?}");
    let rc = a3.wait(30);
    ensure!(rc == End::Exit(1), "cohort's agent with a wrong salt at flodl's controller ended {rc}");
    ensure!(fctl.err.has("rejected a join attempt"), "flodl's controller did not count the wrong-salt hello");
    ensure!(a3.out().any(|e| e.event == "join_failed"), "cohort's agent did not fail its join");
    ensure!(fctl.err.count_lines("joined with ranks") == 0, "flodl's controller admitted a wrong salt");
    ensure!(!cctl.out.any(|e| e.event == "host_admitted"), "cohort's controller admitted a wrong salt");
    Ok(())
}

/// The refusals cohort's controller reported so far.
fn rejections(ctl: &Controller) -> usize {
    ctl.out.count(|e| e.event == "join_rejected")
}

/// cohort's controller must have reported `want` (typed) for a dial after
/// the first `before` refusals: what the joiner was told is what it
/// decided.
fn reported(ctl: &Controller, before: usize, want: &Refusal) -> Result<(), String> {
    let seen = || {
        ctl.out.with_events(|es| {
            es.iter()
                .filter(|e| e.event == "join_rejected")
                .skip(before)
                .map(|e| Refusal::from_cohort(&e.data["reason"]))
                .collect::<Vec<_>>()
        })
    };
    if poll(5.0, None, || seen().contains(want).then_some(())).is_some() {
        return Ok(());
    }
    Err(format!("cohort's controller reported {:?} for a refusal its joiner read as {want:?}", seen()))
}

/// Whether a refusal is the controller's (its window checked the hello),
/// not the joiner's own or a silence.
fn decided_by_the_window(r: &Refusal) -> bool {
    !matches!(r, Refusal::Other(_) | Refusal::Unstated)
}

/// A join-rejects scenario: its name, the first joiner's arguments (flodl's
/// agent, admitted), the last joiner and its arguments.
struct Scenario(&'static str, Option<Vec<String>>, Joiner, Vec<String>);

/// Every reject reason both controllers can be made to give here through
/// an agent (the vendor and NCCL-version checks need an NCCL plane, which
/// `cohort controller` does not offer, and flodl's agent sends no NCCL
/// version on this machine; a hello without devices is refused by flodl's
/// agent itself, so no-devices-agent-side checks the agent and
/// join-frames-raw sends that hello). Each scenario runs against a flodl
/// controller and a cohort controller; the last joiner's fate (admitted or
/// refused, and the reason's check and values) must be the same at both,
/// and cohort's controller must report, typed, the reason its joiner read.
/// Joiners are flodl's agent, and cohort's agent where it can say the
/// hello.
pub fn join_rejects(ctx: &mut Ctx) -> Result<(), String> {
    let jt = fresh_token()?;
    let (sa, sb) = ("a".repeat(64), "b".repeat(64));
    let many = (0..256).map(|d| d.to_string()).collect::<Vec<_>>().join(",") + ",0";
    let w = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<String>>();
    use Joiner::{Cohort, Flodl};
    // name, first joiner (flodl's agent), last joiner and its arguments.
    let scenarios: Vec<Scenario> = vec![
        // A blank host name survives no word splitting: spelled out.
        Scenario(
            "empty-host",
            None,
            Flodl,
            vec!["--host".into(), " ".into(), "--devices".into(), "1".into()],
        ),
        Scenario(
            "empty-host-cohort",
            None,
            Cohort,
            vec!["--host".into(), " ".into(), "--ranks".into(), "1".into()],
        ),
        Scenario("no-devices-agent-side", None, Flodl, w("--host hostB --device-ids ,")),
        Scenario("too-many-devices", None, Flodl, w(&format!("--host hostB --device-ids {many}"))),
        Scenario("duplicate-device", None, Flodl, w("--host hostB --device-ids 3,3")),
        Scenario(
            "duplicate-host-flodl",
            Some(w("--host hostA --devices 1")),
            Flodl,
            w("--host hostA --devices 1"),
        ),
        Scenario(
            "duplicate-host-cohort",
            Some(w("--host hostA --devices 1")),
            Cohort,
            w("--host hostA --ranks 1"),
        ),
        Scenario(
            "dataset-flodl",
            Some(w(&format!("--host hostA --devices 1 --dataset-sig {sa}"))),
            Flodl,
            w(&format!("--host hostB --devices 1 --dataset-sig {sb}")),
        ),
        Scenario(
            "dataset-cohort",
            Some(w(&format!("--host hostA --devices 1 --dataset-sig {sa}"))),
            Cohort,
            w("--host hostB --ranks 1"),
        ),
        Scenario(
            "run-id",
            Some(w("--host hostA --devices 1 --run-id run-one")),
            Flodl,
            w("--host hostB --devices 1 --run-id run-two"),
        ),
        Scenario(
            "model",
            Some(w(&format!("--host hostA --devices 1 --model-sig {sa}"))),
            Flodl,
            w(&format!("--host hostB --devices 1 --model-sig {sb}")),
        ),
        Scenario(
            "dataset-cohort-flag",
            Some(w(&format!("--host hostA --devices 1 --dataset-sig {sa}"))),
            Cohort,
            w(&format!("--host hostB --ranks 1 --dataset-sig {sb}")),
        ),
        Scenario(
            "run-id-cohort-flag",
            Some(w("--host hostA --devices 1 --run-id run-one")),
            Cohort,
            w("--host hostB --ranks 1 --run-id run-two"),
        ),
        Scenario(
            "model-cohort-flag",
            Some(w(&format!("--host hostA --devices 1 --model-sig {sa}"))),
            Cohort,
            w(&format!("--host hostB --ranks 1 --model-sig {sb}")),
        ),
        Scenario(
            "signatures-agree-cohort-flags",
            Some(w(&format!(
                "--host hostA --devices 1 --dataset-sig {sa} --run-id run-one --model-sig {sa}"
            ))),
            Cohort,
            w(&format!("--host hostB --ranks 1 --dataset-sig {sa} --run-id run-one --model-sig {sa}")),
        ),
        Scenario("admitted-cohort", Some(w("--host hostA --devices 1")), Cohort, w("--host hostB --ranks 2")),
    ];
    let mut outcomes = open_outcomes(ctx)?;
    let mut bad = Vec::new();
    for Scenario(name, first, kind, last) in &scenarios {
        let mut seen = Vec::new();
        for side in [Side::Flodl, Side::Cohort(None)] {
            let s = side.name();
            let port = free_port(&[])?;
            let ctl = join_controller(ctx, &ctx.at(&format!("{name}-ctl-{s}")), side, port, &jt)
                .map_err(|e| format!("{name}: {e}"))?;
            let mut joiners = Vec::new();
            if let Some(args) = first {
                let j = join_attempt(ctx, &ctx.at(&format!("{name}-first-{s}")), port, Flodl, &jt, args)?;
                ensure!(
                    j.outcome == JoinOutcome::Admitted,
                    "{name}: the first joiner was refused at {s}'s controller: {}",
                    j.outcome
                );
                joiners.push(j);
            }
            let before = rejections(&ctl);
            let j = join_attempt(ctx, &ctx.at(&format!("{name}-last-{s}")), port, *kind, &jt, last)?;
            let _ = writeln!(outcomes, "{name} at {s} controller: {}", j.outcome);
            if let (Side::Cohort(_), JoinOutcome::Refused(r)) = (side, &j.outcome)
                && decided_by_the_window(r)
            {
                reported(&ctl, before, r).map_err(|e| format!("{name}: {e}"))?;
            }
            seen.push(j.outcome.clone());
            joiners.push(j);
        }
        if seen[0] != seen[1] {
            bad.push(format!("{name}: flodl's controller [{}] vs cohort's [{}]", seen[0], seen[1]));
        }
    }
    differences(&ctx.dir, &bad, &format!("{}/{} scenarios differ", bad.len(), scenarios.len()), "")
}

fn open_outcomes(ctx: &Ctx) -> Result<std::fs::File, String> {
    let path = ctx.at("outcomes.txt");
    std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// What a join reply says, for comparison.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// The connection ended (or the wait passed) without a byte.
    None,
    /// `Reject{reason}`, its reason's facts.
    Reject(Refusal),
    /// `Accept{..}` as decoded, but for the formation wait (each window's
    /// own clock).
    Accept(Value),
    /// Bytes that do not decode as a Join reply.
    Undecodable(String),
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::None => f.write_str("no reply"),
            Reply::Reject(r) => write!(f, "Reject {r:?}"),
            Reply::Accept(v) => write!(f, "{v}"),
            Reply::Undecodable(e) => write!(f, "undecodable: {e}"),
        }
    }
}

/// Decodes a controller's answer to a join frame (cohort's wire decoder,
/// the session key).
fn reply_of(answer: &[u8], key: &MacKey) -> Reply {
    if answer.is_empty() {
        return Reply::None;
    }
    let first = decode_to_json(Framing::Control, key, DEFAULT_FRAME_CEILING, answer).into_iter().next();
    let mut v = match first {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Reply::Undecodable(e.to_string()),
        None => return Reply::Undecodable("no frame".into()),
    };
    if let Some(reason) = v["Join"]["Reject"]["reason"].as_str() {
        return Reply::Reject(Refusal::from_text(reason));
    }
    if let Some(accept) = v["Join"]["Accept"].as_object_mut() {
        accept.remove("formation_wait_secs");
        return Reply::Accept(v);
    }
    Reply::Undecodable(v.to_string())
}

/// Join frames no agent of either kind can be made to send, encoded with
/// cohort's wire encoder (its vectors are flodl 0.8's bytes), each sent
/// after the join channel magic (0xF10D17E3, little-endian) to a fresh
/// window of each controller; the replies must say the same, and cohort's
/// controller must report, typed, the refusal it sent.
pub fn join_frames_raw(ctx: &mut Ctx) -> Result<(), String> {
    let jt = fresh_token()?;
    let salt = SessionSalt::from_hex(&jt).map_err(|e| e.to_string())?;
    let zeros = SessionSalt::from_bytes([0; 16]);
    let hello = |libtorch: &str, devices: Value, nccl: Value| {
        serde_json::json!({"Join": {"Hello": {
            "dataset_sig": vec![0u8; 32], "gpus": [], "host": "hostB", "libtorch": libtorch,
            "local_devices": devices, "model_sig": null, "nccl_version": nccl, "run_id": null,
        }}})
    };
    // name, frame, key (the session salt, or zeros: an unkeyed hello).
    let frames = [
        ("no-devices", hello("", serde_json::json!([]), Value::Null), &salt),
        ("not-join", serde_json::json!({"Control": "Shutdown"}), &salt),
        ("not-hello", serde_json::json!({"Join": {"Abort": {"reason": "x"}}}), &salt),
        ("unkeyed", hello("", serde_json::json!([0]), Value::Null), &zeros),
        (
            "nccl-fields-on-cpu",
            hello("cu128", serde_json::json!([0, 1]), serde_json::json!([2, 21, 5])),
            &salt,
        ),
    ];
    let key = MacKey::new(&salt);
    let mut outcomes = open_outcomes(ctx)?;
    let mut bad = Vec::new();
    for (name, json, frame_key) in &frames {
        let bytes = encode_from_json(Framing::Control, &MacKey::new(frame_key), DEFAULT_FRAME_CEILING, json)
            .map_err(|e| format!("{name}: cohort's wire encoder refused it: {e}"))?;
        let mut sent = 0xF10D_17E3u32.to_le_bytes().to_vec();
        sent.extend_from_slice(&bytes);
        let mut replies = Vec::new();
        for side in [Side::Flodl, Side::Cohort(None)] {
            let s = side.name();
            let port = free_port(&[])?;
            let ctl = join_controller(ctx, &ctx.at(&format!("{name}-ctl-{s}")), side, port, &jt)
                .map_err(|e| format!("{name}: {e}"))?;
            let before = rejections(&ctl);
            let answer =
                crate::http::exchange(&format!("127.0.0.1:{port}"), &sent, Duration::from_millis(1500));
            let record = match &answer {
                Ok((got, ending)) if got.is_empty() => format!("<no response: {ending}>"),
                Ok((got, _)) => crate::hex::encode(got),
                Err(e) => format!("<{e}>"),
            };
            let _ = std::fs::write(ctx.at(&format!("{name}.{s}")), record + "\n");
            let reply = match answer {
                Ok((got, _)) => reply_of(&got, &key),
                Err(e) => Reply::Undecodable(e),
            };
            match (&side, &reply) {
                (Side::Cohort(_), Reply::Reject(r)) => reported(&ctl, before, r),
                (Side::Cohort(_), Reply::None) => reported(&ctl, before, &Refusal::NoReply),
                _ => Ok(()),
            }
            .map_err(|e| format!("{name}: {e}"))?;
            replies.push(reply);
        }
        let _ = writeln!(outcomes, "{name}: flodl [{}] cohort [{}]", replies[0], replies[1]);
        if replies[0] != replies[1] {
            bad.push(format!("{name}: flodl's controller [{}], cohort's [{}]", replies[0], replies[1]));
        }
    }
    differences(&ctx.dir, &bad, &format!("{}/{} frames answered differently", bad.len(), frames.len()), "")
}

/// flodl's window seeds the run's expected signatures while it checks a
/// hello, in check order, and keeps what it seeded when a later check
/// refuses that hello; cohort's refusal changes nothing (DIFFERENCES.md),
/// and `--rules flodl` restores flodl's. A: model M1, no run id (admitted).
/// B: run id R2, model M2 (refused: model) - at flodl it has seeded run id
/// R2 all the same. C: run id R3, model M1: flodl refuses it (run identity),
/// so must cohort under flodl's rules; under cohort's it is admitted.
pub fn join_seeded_by_a_reject(ctx: &mut Ctx) -> Result<(), String> {
    let jt = fresh_token()?;
    let (m1, m2) = ("1".repeat(64), "2".repeat(64));
    let args = |host: &str, run: Option<&str>, model: &str| {
        let mut v = vec!["--host".to_string(), host.into(), "--devices".into(), "1".into()];
        if let Some(r) = run {
            v.extend(["--run-id".to_string(), r.into()]);
        }
        v.extend(["--model-sig".to_string(), model.into()]);
        v
    };
    let mut outcomes = open_outcomes(ctx)?;
    let mut out = Vec::new();
    for side in [Side::Flodl, Side::Cohort(Some("flodl")), Side::Cohort(Some("cohort"))] {
        let s = side.name();
        let port = free_port(&[])?;
        let ctl = join_controller(ctx, &ctx.at(&format!("ctl-{s}")), side, port, &jt)?;
        let a = join_attempt(
            ctx,
            &ctx.at(&format!("a-{s}")),
            port,
            Joiner::Flodl,
            &jt,
            &args("hostA", None, &m1),
        )?;
        ensure!(a.outcome == JoinOutcome::Admitted, "host A refused at {s}'s controller: {}", a.outcome);
        let b = join_attempt(
            ctx,
            &ctx.at(&format!("b-{s}")),
            port,
            Joiner::Flodl,
            &jt,
            &args("hostB", Some("run-two"), &m2),
        )?;
        ensure!(b.outcome != JoinOutcome::Admitted, "host B (another model) admitted at {s}'s controller");
        let before = rejections(&ctl);
        let c = join_attempt(
            ctx,
            &ctx.at(&format!("c-{s}")),
            port,
            Joiner::Flodl,
            &jt,
            &args("hostC", Some("run-three"), &m1),
        )?;
        let _ = writeln!(outcomes, "{s}: host C {}", c.outcome);
        if let (Side::Cohort(_), JoinOutcome::Refused(r)) = (side, &c.outcome) {
            reported(&ctl, before, r)?;
        }
        out.push(c.outcome.clone());
        drop((a, b, c, ctl));
    }
    ensure!(
        out[0] == out[1],
        "host C: flodl's controller [{}], cohort's under --rules flodl [{}]",
        out[0],
        out[1]
    );
    ensure!(out[2] == JoinOutcome::Admitted, "host C refused by cohort's own rules: [{}]", out[2]);
    Ok(())
}
