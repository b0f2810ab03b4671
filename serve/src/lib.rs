//! Serving local clients that may be hostile, shared by both daemons: [`slots`], the
//! connection slots that close the longest-waiting connection to make room (ipamd's socket and
//! both `/metrics` endpoints), and [`metrics`], the `/metrics` HTTP endpoint with its request,
//! idle and write deadlines.

pub mod metrics;
pub mod slots;
