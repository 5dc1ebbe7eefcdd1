//! Realized-work mass: the scalar riding each contribution to a round.
//!
//! Three moves only: a contribution is pre-scaled by its mass at the source
//! and ships the mass with it; tensors and masses sum through any number of
//! fold tiers; the root divides once by the summed mass of exactly the
//! contributions it accepted. What a unit's mass *is* is policy: the two
//! policies flodl uses are here, with the idle guard (a unit that did no
//! work has zero mass for any exponent).

/// Params mass: `n^gamma` for `n` optimizer steps since the last sync;
/// 0 when `n <= 0` whatever `gamma` (raw `powf` would give `0^0 = 1` and
/// `0^-1 = inf`). `gamma = 1` is exactly `n`.
///
/// ```
/// use cohort_proto::reduce::gamma_mass;
/// assert_eq!(gamma_mass(4.0, 1.0), 4.0);
/// assert_eq!(gamma_mass(4.0, 0.0), 1.0);
/// assert_eq!(gamma_mass(4.0, -1.0), 0.25);
/// assert_eq!(gamma_mass(0.0, 0.0), 0.0);
/// assert_eq!(gamma_mass(0.0, -1.0), 0.0);
/// ```
pub fn gamma_mass(n: f64, gamma: f64) -> f64 {
    if n.is_nan() || n <= 0.0 {
        0.0
    } else if gamma == 1.0 {
        n
    } else {
        n.powf(gamma)
    }
}

/// Buffers mass: 1 for a unit that moved (`n > 0`), else 0.
///
/// ```
/// use cohort_proto::reduce::mover_mass;
/// assert_eq!((mover_mass(3.0), mover_mass(0.0)), (1.0, 0.0));
/// ```
pub fn mover_mass(n: f64) -> f64 {
    if n > 0.0 { 1.0 } else { 0.0 }
}

/// The zero-mass rule: a round realized work only when its mass is > 0;
/// otherwise its tensors are meaningless and receivers keep their state.
///
/// ```
/// use cohort_proto::reduce::is_realized;
/// assert!(is_realized(f64::MIN_POSITIVE));
/// assert!(!is_realized(0.0) && !is_realized(-0.0) && !is_realized(f64::NAN));
/// ```
pub fn is_realized(mass: f64) -> bool {
    mass > 0.0
}
