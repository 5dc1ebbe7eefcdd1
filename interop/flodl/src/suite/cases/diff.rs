//! In-process differentials (cohort's pure coordinator code against
//! flodl's: `interop/flodl/tests`) and the throughput cases (`--bench`).

use crate::suite::logs::{Log, cut};
use crate::suite::proc::{Cmd, End, Proc};
use crate::suite::{Ctx, ensure};

/// Runs one differential test target of interop/flodl (built with
/// flodl-peer's profile and target directory), its output in `test.out`;
/// a failure's reason is its first panic, shrunk input or build error.
fn diff_test(ctx: &Ctx, target: &str) -> Result<Log, String> {
    let cmd = Cmd::new("cargo")
        .cwd(&ctx.pkg)
        .env("CARGO_TARGET_DIR", &ctx.pkg.join("target").display().to_string())
        .words(&format!("test --locked --test {target} -- --nocapture"));
    let file = ctx.at("test.out");
    let mut p = Proc::spawn_merged(&file, 900, &cmd)?;
    let end = p.wait(900);
    let log = Log::new(&file);
    if end != End::Exit(0) {
        let why = log.first_of(|l| {
            (l.contains("panicked")
                || l.contains("minimal failing input")
                || l.contains("error[")
                || l.contains("error:"))
            .then(|| cut(l, 300))
        });
        return Err(why.unwrap_or_else(|| format!("cargo test --test {target} ended {end}")));
    }
    Ok(log)
}

pub fn elche_differential(ctx: &mut Ctx) -> Result<(), String> {
    let log = diff_test(ctx, "elche_differential")?;
    let ran = log.first_of(|l| l.split_once("differential: ").map(|(_, rest)| cut(rest, 200)));
    ensure!(ran.is_some(), "the property ran no case");
    ctx.note = ran;
    Ok(())
}

pub fn command_streams(ctx: &mut Ctx) -> Result<(), String> {
    let log = diff_test(ctx, "command_streams")?;
    // `command-streams <run>: <N> commands ...`, one line per scripted run.
    let runs: Vec<String> = log.with_lines(|ls| {
        ls.iter()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("command-streams ")?.split_once(": ")?;
                let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
                (!n.is_empty() && rest[n.len()..].starts_with(" commands")).then(|| format!("{name} {n}"))
            })
            .collect()
    });
    ensure!(runs.len() >= 6, "fewer than 6 scripted runs compared");
    ctx.note = Some(runs.join(","));
    Ok(())
}

/// flodl-peer bench-`what` (bench-peer build) for K = 4 and 8 x 64 MiB, 7
/// ABBA pairs after 1 warmup round; passes when it exits 0 (every check
/// held) with both K's figures, which go in the note.
fn throughput(ctx: &mut Ctx, what: &str) -> Result<(), String> {
    let cmd = Cmd::new(&ctx.bench_peer)
        .words(&format!("bench-{what} --ks 4,8 --mib 64 --pairs 7 --warmup 1 --log-dir"))
        .arg(ctx.dir.display());
    let mut p = Proc::spawn(&ctx.at("bench"), 900, &cmd)?;
    let end = p.wait(900);
    ensure!(end == End::Exit(0), "bench-{what} ended ({end}): {}", p.err().first("FAILED"));
    let figures: Vec<serde_json::Value> = p.out().with_lines(|ls| {
        ls.iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["bench"] == what && v["mib"] == 64)
            .collect()
    });
    let mut notes = Vec::new();
    for k in [4, 8] {
        let f = figures.iter().find(|v| v["k"] == k).ok_or(format!("no K={k} summary line"))?;
        let num = |key: &str| f[key].as_f64().unwrap_or(f64::NAN);
        notes.push(format!(
            "K={k} flodl {:.3} s/round cohort {:.3} s/round: wall {:.2}x cpu {:.2}x ({} pairs)",
            num("flodl_s_per_round"),
            num("cohort_s_per_round"),
            num("wall_ratio"),
            num("cpu_ratio"),
            f["pairs"]
        ));
    }
    ctx.note = Some(notes.join("; "));
    Ok(())
}

pub fn relay_throughput(ctx: &mut Ctx) -> Result<(), String> {
    throughput(ctx, "relay")
}

pub fn reduce_throughput(ctx: &mut Ctx) -> Result<(), String> {
    throughput(ctx, "reduce")
}
