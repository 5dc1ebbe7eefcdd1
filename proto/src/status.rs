//! The HTTP status responder (`GET /state.json`, `POST /start`). Status: not written yet (issue 3).
