//! The smol and mio drivers against each other over loopback, both ways.

mod smol_to_mio {
    cohort_driver_core::interop_suite!(
        cohort_driver_smol::testing::SmolThread,
        cohort_driver_mio::testing::Mio
    );
}

mod mio_to_smol {
    cohort_driver_core::interop_suite!(
        cohort_driver_mio::testing::Mio,
        cohort_driver_smol::testing::SmolThread
    );
}
