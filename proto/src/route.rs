//! The controller port router: routes each accepted connection by its first 4 bytes. Status: not written yet (issue 3).
