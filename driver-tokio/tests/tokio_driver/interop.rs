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
