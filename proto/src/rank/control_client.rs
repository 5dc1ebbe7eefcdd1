//! The rank control client. Status: not written yet (issue 5).
