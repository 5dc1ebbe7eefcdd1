//! Loopback length framing between a rank and its relay: `u32 len | bytes`,
//! the length checked against the frame ceiling before anything is kept.

use bytes::Bytes;

use super::error::{FrameType, Problem, WireError, WireResult};
use super::payload::{Payload, PayloadBuilder};

/// The 4-byte length prefix for a blob of `len` bytes.
pub fn len_prefix(len: usize, ceiling: u64) -> WireResult<[u8; 4]> {
    if len as u64 > ceiling || u32::try_from(len).is_err() {
        return Err(WireError::new(
            FrameType::LenFrame,
            "len",
            Problem::TooLarge { got: len as u64, limit: ceiling.min(u32::MAX.into()) },
        ));
    }
    Ok((len as u32).to_le_bytes())
}

/// One step of [`LenDecoder::step`].
#[derive(Debug, PartialEq, Eq)]
pub enum LenStep<'a> {
    /// A blob of this many bytes begins.
    Start(usize),
    /// The next bytes of the current blob.
    Body(&'a [u8]),
    /// The current blob is complete.
    End,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum State {
    Prefix { buf: [u8; 4], have: usize },
    Body { remaining: usize },
    Ended,
}

/// Incremental decoder of length-framed blobs.
///
/// Use [`LenDecoder::decode`] to collect whole blobs, or [`LenDecoder::step`]
/// to stream each blob's bytes into another decoder as they arrive (the
/// relay's fold does this, so a model-sized frame is never buffered).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct LenDecoder {
    ceiling: u64,
    state: State,
    collect: Option<PayloadBuilder>,
}

impl LenDecoder {
    /// A decoder refusing blobs above `ceiling` bytes.
    pub fn new(ceiling: u64) -> Self {
        LenDecoder { ceiling, state: State::Prefix { buf: [0; 4], have: 0 }, collect: None }
    }

    /// Whether the decoder sits between blobs.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Prefix { have: 0, .. })
    }

    /// Consumes bytes from the front of `input`; returns how many were used
    /// and what they amounted to (`None`: all used, nothing to report yet).
    pub fn step<'a>(&mut self, input: &'a [u8]) -> WireResult<(usize, Option<LenStep<'a>>)> {
        match &mut self.state {
            State::Ended => {
                self.state = State::Prefix { buf: [0; 4], have: 0 };
                Ok((0, None))
            }
            State::Prefix { buf, have } => {
                let n = (4 - *have).min(input.len());
                buf[*have..*have + n].copy_from_slice(&input[..n]);
                *have += n;
                if *have < 4 {
                    return Ok((n, None));
                }
                let len = u32::from_le_bytes(*buf);
                if u64::from(len) > self.ceiling {
                    return Err(WireError::new(
                        FrameType::LenFrame,
                        "len",
                        Problem::TooLarge { got: len.into(), limit: self.ceiling },
                    ));
                }
                self.state = State::Body { remaining: len as usize };
                Ok((n, Some(LenStep::Start(len as usize))))
            }
            State::Body { remaining: 0 } => {
                self.state = State::Ended;
                Ok((0, Some(LenStep::End)))
            }
            State::Body { remaining } => {
                let n = (*remaining).min(input.len());
                *remaining -= n;
                if n == 0 {
                    return Ok((0, None));
                }
                Ok((n, Some(LenStep::Body(&input[..n]))))
            }
        }
    }

    /// Consumes bytes and returns the blob they completed, if any.
    pub fn decode(&mut self, input: &[u8]) -> WireResult<(usize, Option<Payload>)> {
        let mut used = 0;
        loop {
            let (n, step) = self.step(&input[used..])?;
            used += n;
            match step {
                Some(LenStep::Start(len)) => {
                    self.collect = Some(PayloadBuilder::default());
                    let _ = len;
                }
                Some(LenStep::Body(b)) => {
                    let remaining = match self.state {
                        State::Body { remaining } => remaining,
                        _ => 0,
                    };
                    if let Some(c) = &mut self.collect {
                        c.push(b, remaining);
                    }
                }
                Some(LenStep::End) => {
                    let blob = self.collect.take().unwrap_or_default().finish();
                    // Re-arm for the next blob without consuming input.
                    self.step(&[])?;
                    return Ok((used, Some(blob)));
                }
                None => {
                    if used == input.len() {
                        return Ok((used, None));
                    }
                }
            }
        }
    }

    /// At end of stream: an error if a blob was left unfinished.
    pub fn finish(&self) -> WireResult<()> {
        match &self.state {
            State::Prefix { have: 0, .. } | State::Ended => Ok(()),
            State::Prefix { have, .. } => Err(WireError::truncated(FrameType::LenFrame, *have)),
            State::Body { .. } => Err(WireError::truncated(FrameType::LenFrame, 4)),
        }
    }
}

/// The prefix and the blob's shared segments, ready to transmit in order.
pub fn len_framed(blob: &Payload, ceiling: u64) -> WireResult<(Bytes, Vec<Bytes>)> {
    let prefix = len_prefix(blob.len(), ceiling)?;
    Ok((Bytes::copy_from_slice(&prefix), blob.segments().to_vec()))
}
