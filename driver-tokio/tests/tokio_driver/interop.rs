//! The tokio driver against the mio and smol drivers over loopback, both
//! ways.

use cohort_driver_mio::testing::Mio;
use cohort_driver_smol::testing::SmolThread;
use cohort_driver_tokio::testing::TokioThread;

mod tokio_to_mio {
    cohort_driver_core::interop_suite!(super::TokioThread, super::Mio);
}

mod mio_to_tokio {
    cohort_driver_core::interop_suite!(super::Mio, super::TokioThread);
}

mod tokio_to_smol {
    cohort_driver_core::interop_suite!(super::TokioThread, super::SmolThread);
}

mod smol_to_tokio {
    cohort_driver_core::interop_suite!(super::SmolThread, super::TokioThread);
}

/// The controller on tokio, a synthetic host on mio and a host of the
/// user's workload on smol: one cluster, run to the end, every round exact.
#[test]
fn a_cluster_across_three_drivers() {
    cohort_driver_core::testing::suite::interop::a_cluster_across_three_drivers::<TokioThread, Mio, SmolThread>(
    );
}

/// The same cluster across the three drivers, every link sealed: the
/// controller on tokio requires it, the hosts on mio and smol offer it.
#[test]
fn a_sealed_cluster_across_three_drivers() {
    cohort_driver_core::testing::suite::interop::a_sealed_cluster_across_three_drivers::<
        TokioThread,
        Mio,
        SmolThread,
    >();
}

/// An elastic cluster heals across the three drivers: the controller on
/// tokio, host-a on mio, host-b on smol, and host-b's replacement on mio.
#[test]
fn a_cluster_heals_across_three_drivers() {
    cohort_driver_core::testing::suite::interop::a_cluster_heals_across_three_drivers::<
        TokioThread,
        Mio,
        SmolThread,
    >();
}

/// An elastic cluster grows across the three drivers: the controller on
/// tokio, host-a on mio, host-b on smol, and the new host-c on mio.
#[test]
fn a_cluster_grows_across_three_drivers() {
    cohort_driver_core::testing::suite::interop::a_cluster_grows_across_three_drivers::<
        TokioThread,
        Mio,
        SmolThread,
    >();
}
