//! The rank data client. Status: not written yet (issue 4).
