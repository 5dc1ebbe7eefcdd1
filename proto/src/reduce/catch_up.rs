//! The model a late joiner starts from (cohort only, elastic worlds).
//!
//! In a live elastic world the reduce keeps the world's current model
//! ([`ModelStore`]): the consensus rounds of the last averaging cycle whose
//! every round realized work, or, before the first cycle, the rounds a rank
//! program's start-up broadcast reduced. A replacement or new host's ranks,
//! before their promotion, send the rounds a starting rank sends (flodl's
//! rank: its start-up broadcast, one `Control` round per group of tensors;
//! cohort's synthetic rank: one). The reduce answers each, to that host
//! alone, with the matching round of the model it pinned for the host, as a
//! `Control` consensus in f32 (what a starting rank loads as rank 0's
//! parameters), after a `CatchUp{digest}` record its relay checks the
//! consensus against before handing it to the ranks.
//!
//! The digest ([`ModelDigest`]) is SHA-256 over each tensor's shape and f32
//! values, so the controller, the relay and a rank can each compute it from
//! what they hold.
//!
//! ```
//! use cohort_proto::reduce::{ModelDigest, ModelRound, ModelTensor};
//! let round = ModelRound { tensors: vec![ModelTensor { shape: vec![2], values: Some(vec![1.0, 2.0]) }] };
//! let zeros = ModelRound { tensors: vec![ModelTensor { shape: vec![2], values: None }] };
//! assert_eq!(round.digest(), ModelDigest::of([(&[2u32][..], Some(&[1.0f32, 2.0][..]))]));
//! assert_eq!(zeros.digest(), ModelDigest::of([(&[2u32][..], Some(&[0.0f32, 0.0][..]))]));
//! assert_ne!(round.digest(), zeros.digest());
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use core::fmt;
use sha2::{Digest, Sha256};

use super::schema::RoundSchema;
use super::sum::{Consensus, ConsensusTensor, FrameLayout};
use crate::machine::ConnId;
use crate::wire::{Dtype, FrameType, Problem, RoundKind, WireError, WireResult, bf16_to_f32, f32_to_bf16};

/// SHA-256 of a model's tensors: for each, its rank (`u32` LE), its
/// dimensions (`u32` LE) and its values (f32 LE; an elided tensor as zeros),
/// after the domain tag `cohort-model-v1`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ModelDigest(pub [u8; 32]);

impl ModelDigest {
    /// The digest of `tensors`, each its shape and values (`None`: zeros).
    pub fn of<'a>(tensors: impl IntoIterator<Item = (&'a [u32], Option<&'a [f32]>)>) -> ModelDigest {
        let mut h = Sha256::new();
        h.update(b"cohort-model-v1");
        let mut buf = Vec::with_capacity(4096);
        for (shape, values) in tensors {
            h.update((shape.len() as u32).to_le_bytes());
            for d in shape {
                h.update(d.to_le_bytes());
            }
            let numel = shape.iter().map(|&d| d as usize).product::<usize>();
            match values {
                Some(v) => {
                    for chunk in v.chunks(1024) {
                        buf.clear();
                        buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                        h.update(&buf);
                    }
                }
                None => {
                    let zeros = [0u8; 4096];
                    let mut left = numel * 4;
                    while left > 0 {
                        let n = left.min(zeros.len());
                        h.update(&zeros[..n]);
                        left -= n;
                    }
                }
            }
        }
        ModelDigest(h.finalize().into())
    }
}

impl fmt::Display for ModelDigest {
    /// The first 8 bytes in hex, as logs and summaries show it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0[..8].iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for ModelDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModelDigest({self})")
    }
}

/// One tensor of a kept model round.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelTensor {
    /// Dimensions.
    pub shape: Vec<u32>,
    /// The values every rank adopted (rounded as their wire dtype carried
    /// them); `None`: all zeros.
    pub values: Option<Vec<f32>>,
}

/// One round of the world's current model.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelRound {
    /// Its tensors, in order.
    pub tensors: Vec<ModelTensor>,
}

impl ModelRound {
    /// The round every rank adopted from `c`: its values as the wire carried
    /// them (a bf16 round's rounded to bf16).
    pub fn of(c: &Consensus) -> ModelRound {
        let tensors = c
            .tensors
            .iter()
            .map(|t| ModelTensor {
                shape: t.shape.clone(),
                values: t.values.as_ref().map(|v| match t.dtype {
                    Dtype::F32 => v.clone(),
                    Dtype::Bf16 => v.iter().map(|&x| bf16_to_f32(f32_to_bf16(x))).collect(),
                }),
            })
            .collect();
        ModelRound { tensors }
    }

    /// Its digest.
    pub fn digest(&self) -> ModelDigest {
        ModelDigest::of(self.tensors.iter().map(|t| (t.shape.as_slice(), t.values.as_deref())))
    }

    /// The schema a starting rank's request for it carries
    /// ([`RoundSchema::request`]).
    pub fn request_schema(&self) -> RoundSchema {
        RoundSchema::request(self.tensors.iter().map(|t| t.shape.as_slice()))
    }

    /// The consensus it is sent as: `Control` (adopted whatever the mass),
    /// f32, mass 0.
    pub fn to_consensus(&self) -> Consensus {
        let tensors = self
            .tensors
            .iter()
            .map(|t| ConsensusTensor { dtype: Dtype::F32, shape: t.shape.clone(), values: t.values.clone() })
            .collect();
        Consensus { kind: RoundKind::Control, weight: 0.0, tensors }
    }

    /// Bytes of values it holds (elided tensors hold none).
    pub fn value_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.values.as_ref().map_or(0, |v| 4 * v.len() as u64)).sum()
    }
}

/// What answering one catch-up request gave.
#[derive(Clone, Debug, PartialEq)]
pub struct CatchUpReply {
    /// The consensus to send.
    pub consensus: Consensus,
    /// Its digest.
    pub digest: ModelDigest,
    /// Which round of the model it is, from 0.
    pub round: u32,
    /// Rounds the model holds: the host is caught up when `round + 1 == of`.
    pub of: u32,
    /// Bytes of values it carries.
    pub bytes: u64,
}

/// A host's progress through the model it was pinned to.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Progress {
    model: Arc<Vec<ModelRound>>,
    sent: u32,
}

/// The reduce's keeper of the world's current model, and of each catching-up
/// host's progress. Off (nothing kept, nothing copied) until
/// [`ModelStore::keep`].
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ModelStore {
    on: bool,
    /// The current model (empty: none yet).
    model: Arc<Vec<ModelRound>>,
    /// The rounds reduced since the last commit, and whether each realized.
    building: Vec<ModelRound>,
    realized: bool,
    /// Hosts part way through the model, pinned to the model they started on.
    hosts: BTreeMap<ConnId, Progress>,
    /// Requests that came before any model existed, answered at the first commit.
    waiting: Vec<(ConnId, FrameLayout)>,
}

impl ModelStore {
    /// Keeps the model from now on.
    pub fn keep(&mut self) {
        if !self.on {
            self.on = true;
            self.realized = true;
        }
    }

    /// Whether the model is kept.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// The current model's rounds (empty before the first commit).
    pub fn model(&self) -> &[ModelRound] {
        &self.model
    }

    /// A round reduced: it joins the generation being built. A `Control`
    /// round once a model exists is no part of one (a sum some rank
    /// program gathers mid-run, not parameters): only a start-up
    /// broadcast's are.
    pub fn reduced(&mut self, c: &Consensus) {
        if !self.on || (c.kind == RoundKind::Control && !self.model.is_empty()) {
            return;
        }
        if self.building.is_empty() {
            self.realized = true;
        }
        self.realized &= c.is_realized();
        self.building.push(ModelRound::of(c));
    }

    /// A cycle boundary (a cycle started or finished): the rounds reduced
    /// since the last one become the model if each realized work (a round of
    /// mass 0 leaves every rank its own state, so it is no model). Returns
    /// the requests that waited for a first model, now answerable.
    pub fn commit(&mut self) -> Vec<(ConnId, FrameLayout)> {
        let building = core::mem::take(&mut self.building);
        if !building.is_empty() && self.realized {
            self.model = Arc::new(building);
            return core::mem::take(&mut self.waiting);
        }
        Vec::new()
    }

    /// Answers `conn`'s next request (a frame of `layout`): `Ok(None)` when
    /// no model exists yet (the request waits for the first), an error
    /// naming the field when it is not the request for the model's next
    /// round or the host already has every round.
    pub fn request(&mut self, conn: ConnId, layout: &FrameLayout) -> WireResult<Option<CatchUpReply>> {
        if !self.hosts.contains_key(&conn) {
            if self.model.is_empty() {
                self.waiting.push((conn, layout.clone()));
                return Ok(None);
            }
            self.hosts.insert(conn, Progress { model: self.model.clone(), sent: 0 });
        }
        let Some(p) = self.hosts.get_mut(&conn) else { return Ok(None) };
        let of = p.model.len() as u32;
        let Some(round) = p.model.get(p.sent as usize) else {
            let why = format!("a catch-up request past the world's model ({of} rounds, all sent)");
            return Err(WireError::new(FrameType::RoundFrame, "kind", Problem::Invalid(why)));
        };
        let against = format!("round {} of the world's model", p.sent);
        round.request_schema().check(layout.kind, layout.layout(), &against)?;
        let reply = CatchUpReply {
            consensus: round.to_consensus(),
            digest: round.digest(),
            round: p.sent,
            of,
            bytes: round.value_bytes(),
        };
        p.sent += 1;
        Ok(Some(reply))
    }

    /// Forgets `conn` (its connection ended, or its ranks were promoted).
    pub fn forget(&mut self, conn: ConnId) {
        self.hosts.remove(&conn);
        self.waiting.retain(|(c, _)| *c != conn);
    }

    /// Whether `conn` has been sent every round of its model.
    pub fn caught_up(&self, conn: ConnId) -> bool {
        self.hosts.get(&conn).is_some_and(|p| p.sent as usize >= p.model.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::LaidTensor;

    fn consensus(kind: RoundKind, weight: f64, values: &[f32]) -> Consensus {
        Consensus {
            kind,
            weight,
            tensors: vec![ConsensusTensor {
                dtype: Dtype::F32,
                shape: vec![values.len() as u32],
                values: Some(values.to_vec()),
            }],
        }
    }

    fn request(kind: RoundKind, n: u32) -> FrameLayout {
        let t = LaidTensor { dtype: Dtype::F32, shape: vec![n], offset: 0, nbytes: 0 };
        FrameLayout { kind, weight: 0.0, tensors: vec![t] }
    }

    #[test]
    fn the_model_is_the_last_cycle_whose_every_round_realized_work() {
        let mut s = ModelStore::default();
        s.keep();
        s.reduced(&consensus(RoundKind::Model, 2.0, &[1.0, 2.0]));
        s.commit();
        assert_eq!(s.model()[0].tensors[0].values, Some(vec![1.0, 2.0]));
        // A round of mass 0 keeps every rank's own state: no new model.
        s.reduced(&consensus(RoundKind::Model, 0.0, &[9.0, 9.0]));
        s.commit();
        assert_eq!(s.model()[0].tensors[0].values, Some(vec![1.0, 2.0]));
        s.reduced(&consensus(RoundKind::Model, 1.0, &[3.0, 4.0]));
        s.reduced(&consensus(RoundKind::Control, 0.0, &[4.0]));
        s.reduced(&consensus(RoundKind::Model, 1.0, &[5.0]));
        s.commit();
        // A Control sum mid-run is no part of the model.
        assert_eq!(s.model().len(), 2);
        assert_eq!(s.model()[1].tensors[0].values, Some(vec![5.0]));
    }

    #[test]
    fn a_host_is_answered_round_by_round_from_the_model_it_started_on() {
        let mut s = ModelStore::default();
        s.keep();
        let c = ConnId(3);
        // No model yet: the request waits for the first.
        assert_eq!(s.request(c, &request(RoundKind::Control, 2)).unwrap(), None);
        s.reduced(&consensus(RoundKind::Control, 0.0, &[1.0, 2.0]));
        s.reduced(&consensus(RoundKind::Control, 0.0, &[7.0]));
        let waiting = s.commit();
        assert_eq!(waiting.len(), 1);
        let first = s.request(c, &waiting[0].1).unwrap().unwrap();
        assert_eq!((first.round, first.of, first.bytes), (0, 2, 8));
        assert_eq!(first.consensus.kind, RoundKind::Control);
        assert_eq!(first.digest, ModelDigest::of([(&[2u32][..], Some(&[1.0f32, 2.0][..]))]));
        assert!(!s.caught_up(c));
        // A new model meanwhile does not change the host's.
        s.reduced(&consensus(RoundKind::Model, 1.0, &[5.0, 5.0]));
        s.commit();
        // Its second request must be for the pinned model's second round.
        let e = s.request(c, &request(RoundKind::Control, 2)).unwrap_err();
        assert_eq!(e.field, "shape");
        let mut again = ModelStore::default();
        again.keep();
        again.reduced(&consensus(RoundKind::Control, 0.0, &[1.0, 2.0]));
        again.reduced(&consensus(RoundKind::Control, 0.0, &[7.0]));
        again.commit();
        again.request(c, &request(RoundKind::Control, 2)).unwrap();
        let second = again.request(c, &request(RoundKind::Control, 1)).unwrap().unwrap();
        assert_eq!(second.consensus.tensors[0].values, Some(vec![7.0]));
        assert!(again.caught_up(c));
        // A request past the model's last round fails the host.
        let past = again.request(c, &request(RoundKind::Control, 1)).unwrap_err();
        assert_eq!(past.field, "kind");
        assert!(past.to_string().contains("past the world's model (2 rounds, all sent)"), "{past}");
        // A Model frame is no request.
        let mut m = ModelStore::default();
        m.keep();
        m.reduced(&consensus(RoundKind::Model, 1.0, &[1.0]));
        m.commit();
        assert_eq!(m.request(c, &request(RoundKind::Model, 1)).unwrap_err().field, "kind");
    }

    #[test]
    fn a_bf16_round_is_kept_as_the_ranks_adopted_it() {
        let mut c = consensus(RoundKind::Model, 1.0, &[1.0 + 1.0 / 512.0]);
        c.tensors[0].dtype = Dtype::Bf16;
        assert_eq!(ModelRound::of(&c).tensors[0].values, Some(vec![1.0]));
    }

    #[test]
    fn nothing_is_kept_until_asked() {
        let mut s = ModelStore::default();
        s.reduced(&consensus(RoundKind::Model, 1.0, &[1.0]));
        s.commit();
        assert!(s.model().is_empty());
    }
}
