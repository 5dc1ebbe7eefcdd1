//! The cases, in the order the suite runs them.

mod diff;
mod faults;
mod joins;
mod shapes;
mod smoke;
mod train;

use super::Case;

/// Every case; the throughput ones (`bench`) only on request.
pub static ALL: &[Case] = &[
    Case {
        name: "form-world",
        about: "flodl controller + flodl agent (no coordinator)",
        bench: false,
        run: smoke::form_world,
    },
    Case {
        name: "relay-spawn",
        about: "flodl agent spawns its relay + ranks (cpu world)",
        bench: false,
        run: smoke::relay_spawn,
    },
    Case {
        name: "flodl-agent-cohort-controller",
        about: "flodl's agent, relay and `cohort rank` children under `cohort controller`",
        bench: false,
        run: train::flodl_agent_cohort_controller,
    },
    Case {
        name: "sealed-prefer-mixed",
        about: "`cohort controller --sealed prefer`: a flodl host in the clear and a `cohort agent --sealed` \
                host sealed, one world trained to the end",
        bench: false,
        run: train::sealed_prefer_mixed,
    },
    Case {
        name: "cohort-agent-flodl-controller",
        about: "`cohort agent` (cohort relays + ranks) under flodl's coordinator and CPU reduce",
        bench: false,
        run: train::cohort_agent_flodl_controller,
    },
    Case {
        name: "flodl-relays-cohort-controller",
        about: "two flodl hosts (flodl relays, cohort ranks) under `cohort controller`",
        bench: false,
        run: train::flodl_relays_cohort_controller,
    },
    Case {
        name: "cohort-ranks-flodl-controller",
        about: "flodl's agent spawning `cohort rank` under flodl's controller (flodl coordinator, CPU reduce \
                and relay; cohort ranks)",
        bench: false,
        run: train::cohort_ranks_flodl_controller,
    },
    Case {
        name: "cohort-ranks-flodl-chunked",
        about: "the same under flodl's cadence and async policies, whose default is chunk-pool dispatch \
                (many chunks per epoch), to the end",
        bench: false,
        run: train::cohort_ranks_flodl_chunked,
    },
    Case {
        name: "cohort-ranks-flodl-nccl",
        about: "the same on flodl's NCCL plane: `cohort rank --backend nccl` runs the bootstrap rendezvous \
                with flodl's server (one unique id for all), no data relay, flodl's SyncNow cycles, to the end",
        bench: false,
        run: train::cohort_ranks_flodl_nccl,
    },
    Case {
        name: "flodl-agent-cohort-nccl",
        about: "`cohort controller --backend nccl`: flodl's agent starts a relay with no data channel and \
                `cohort rank --backend nccl` children, which rendezvous with cohort's server, to the end",
        bench: false,
        run: train::flodl_agent_cohort_nccl_controller,
    },
    Case {
        name: "rank-host-check",
        about: "`cohort rank` refuses an envelope meant for another host, as flodl's ranks do: exit 1, \
                reported by flodl's agent to the controller",
        bench: false,
        run: shapes::rank_host_check,
    },
    Case {
        name: "worldformed-shapes",
        about: "what flodl's agent hands its relay and rank children from a cohort WorldFormed equals what \
                it hands them from flodl's (envelope, relay spec, environment)",
        bench: false,
        run: shapes::worldformed_shapes,
    },
    Case {
        name: "status-endpoint",
        about: "state.json and POST /start: the same codes, headers, fields, order and values from both \
                controllers, stage by stage",
        bench: false,
        run: shapes::status_endpoint,
    },
    Case {
        name: "rank-wedged-flodl-coordinator",
        about: "a cohort rank stops (SIGSTOP) under flodl: declared dead when stale, its remainder \
                redistributed, the survivors finish",
        bench: false,
        run: faults::rank_wedged_flodl_coordinator,
    },
    Case {
        name: "rank-killed-flodl-coordinator",
        about: "a cohort rank is killed under flodl: its remainder redistributed; flodl's CPU reduce ends at \
                its RankExit, the survivors stop",
        bench: false,
        run: faults::rank_killed_flodl_coordinator,
    },
    Case {
        name: "relay-killed-cohort-controller",
        about: "a flodl relay killed mid-round (one of its two ranks' frames folded) under a cohort \
                controller: that host's ranks dead, the other host finishes",
        bench: false,
        run: faults::relay_killed_cohort_controller,
    },
    Case {
        name: "rank-exit-cohort-controller",
        about: "a flodl agent reports a killed rank's exit to a cohort controller: redistributed, the \
                survivors finish",
        bench: false,
        run: faults::rank_exit_cohort_controller,
    },
    Case {
        name: "join-lost-cohort-controller",
        about: "a flodl host killed in a cohort controller's join window is retracted: the world forms \
                without it, a later flodl host's ranks move down, its exits are mapped",
        bench: false,
        run: faults::join_lost_cohort_controller,
    },
    Case {
        name: "wrong-salt",
        about: "a join keyed with the wrong salt, each way",
        bench: false,
        run: joins::wrong_salt,
    },
    Case {
        name: "join-rejects",
        about: "every join reject reason both controllers can be made to give: same decision, same typed \
                reason, from flodl's agent and cohort's",
        bench: false,
        run: joins::join_rejects,
    },
    Case {
        name: "join-frames-raw",
        about: "crafted join frames no agent sends (no device, not a Join, not a Hello, unkeyed, \
                NCCL/vendor fields on a CPU plane): the same reply from both controllers",
        bench: false,
        run: joins::join_frames_raw,
    },
    Case {
        name: "join-seeded-by-a-reject",
        about: "which hello seeds the run's signatures",
        bench: false,
        run: joins::join_seeded_by_a_reject,
    },
    Case {
        name: "elche-differential",
        about: "cohort's ElChe (coord::el_che) against the real flodl::distributed::ElChe, guards and LR \
                meta-controller: random worlds, configs and report streams (deaths, restores), the whole \
                schedule and every verdict equal after every step (ELCHE_DIFF_CASES, default 4096)",
        bench: false,
        run: diff::elche_differential,
    },
    Case {
        name: "command-streams",
        about: "the same scripted ranks (speeds 10/13/30 ms, CPU and NCCL, sync/cadence/async) under \
                flodl's real ClusterCoordinator and cohort's Scheduler (Rules::Flodl), lockstep in virtual \
                time: the same commands, message by message",
        bench: false,
        run: diff::command_streams,
    },
    Case {
        name: "relay-throughput",
        about: "K = 4 and 8 ranks x 64 MiB f32 rounds through flodl's relay process and cohort's, ABBA \
                pairs: wall time per round, MiB/s, server CPU per round, peak RSS; host frames and \
                broadcasts checked on the warmup and a final round (PASS when every check holds; no \
                threshold)",
        bench: true,
        run: diff::relay_throughput,
    },
    Case {
        name: "reduce-throughput",
        about: "the same rounds through the controller's reduce: flodl's ClusterController (a `--backend \
                none` controller whose world a stand-in agent formed) and cohort's, K one-rank hosts; each \
                consensus checked",
        bench: true,
        run: diff::reduce_throughput,
    },
];
