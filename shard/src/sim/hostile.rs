//! A hostile peer in the simulator (issue 10 item 5): one replica, drawn
//! per seed, whose transfer server lies in one way, drawn per seed too:
//! garbage chunks, wrong chunk checksums in its manifests, stale offers,
//! inflated sizes, endless re-offers or undecodable manifests. Its replica
//! stays honest (VSR is not Byzantine-tolerant; the transfer must bound
//! what a broken or hostile serving peer costs). On with
//! [`super::SimOptions::hostile`], for groups of 3 or 5.
//!
//! A receiver must charge the liar, quarantine it past its charge limit,
//! and still install from an honest peer; every other check holds. Guards
//! against: a receiver taking a stale or oversized offer (it must refuse
//! it before anything is staged).

use std::collections::{BTreeMap, BTreeSet};

use ringlog_protocol::manifest::Manifest;
use ringlog_protocol::replication::Offer;

use crate::transfer::Message as XMsg;

use super::*;

/// The ways the hostile server lies (one per seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostility {
    /// Every chunk's bytes replaced by noise of the same length.
    GarbageChunks,
    /// Every chunk checksum in its manifests off by one bit.
    WrongChecksums,
    /// Offers below the requester's purge generation or commit.
    StaleOffers,
    /// The first artifact of each manifest longer than any segment.
    InflatedSizes,
    /// Its last offer sent again every tick, long after it was answered.
    EndlessReOffers,
    /// Offers whose manifest fails to decode.
    UndecodableManifests,
}

pub const HOSTILITIES: [Hostility; 6] = [
    Hostility::GarbageChunks,
    Hostility::WrongChecksums,
    Hostility::StaleOffers,
    Hostility::InflatedSizes,
    Hostility::EndlessReOffers,
    Hostility::UndecodableManifests,
];

/// Offers remembered as lies that must be refused, at most (the oldest
/// are forgotten past it: the check then misses, never misfires).
const LIED_OFFERS_MAX: usize = 1024;

pub struct Hostile {
    pub replica: u8,
    pub mode: Hostility,
    rng: Rng,
    /// Per requester: the commit and purge generation it last asked with.
    asked: BTreeMap<u8, (u64, u64)>,
    /// The last offer sent, and to whom (re-sent by `EndlessReOffers`).
    last_offer: Option<(u8, XMsg)>,
    /// (requester, snapshot id) of offers made stale or oversized.
    lied_offers: BTreeSet<(u8, u64)>,
    /// The first manifest it offered (`StaleOffers` replays it).
    first_offer: Option<Manifest>,
    /// False from the liveness phase on ([`Hostile::heal`]).
    lying: bool,
}

impl Hostile {
    /// The seed's hostile peer, if `on` and the group has two peers or more
    /// for each replica (one of them honest).
    pub fn draw(seed: u64, n: u8, on: bool) -> Option<Self> {
        if !on || n < 3 {
            return None;
        }
        let mut rng = Rng::new(seed ^ 0x484f_5354);
        let replica = rng.below(u64::from(n)) as u8;
        let mode = HOSTILITIES[rng.below(HOSTILITIES.len() as u64) as usize];
        Some(Self {
            replica,
            mode,
            rng,
            asked: BTreeMap::new(),
            last_offer: None,
            lied_offers: BTreeSet::new(),
            first_offer: None,
            lying: true,
        })
    }

    /// The liveness phase heals every fault, the lies included: a wipe and
    /// retention can leave the hostile peer the only replica holding what
    /// another needs, and no receiver can get data only a liar serves
    /// (seed 9000152). The lies it told stay remembered, so one still in
    /// flight must be refused as before.
    pub fn heal(&mut self) {
        self.lying = false;
        self.last_offer = None;
    }

    /// The hostile server's process died: what it offered is gone with it
    /// (a wipe may take its view back, and an old offer's view could not
    /// be framed then: seed 9200060 crashed and rebooted wiped between two
    /// ticks, and its next re-offer carried view 3 from a view-0 store).
    pub fn forget_offers(&mut self) {
        self.last_offer = None;
        self.first_offer = None;
    }

    /// Notes a request the hostile server received.
    pub fn asked(&mut self, from: u8, msg: &XMsg) {
        if let XMsg::RequestSnapshot(r) = msg {
            self.asked.insert(from, (r.commit, r.purge_generation));
        }
    }

    /// The lie told instead of `msg` to `to`, if any.
    fn lie(&mut self, to: u8, msg: &XMsg, segment_bytes: u64) -> Option<XMsg> {
        if let XMsg::SnapshotOffer(o) = msg {
            if let (None, Offer::Snapshot(m)) = (&self.first_offer, &o.offer) {
                self.first_offer = Some(m.clone());
            }
        }
        let mut out = msg.clone();
        match (&mut out, self.mode) {
            (XMsg::Chunk { data, .. }, Hostility::GarbageChunks) => {
                let noise: Vec<u8> = (0..data.len()).map(|_| self.rng.below(256) as u8).collect();
                *data = noise.into();
            }
            (XMsg::SnapshotOffer(o), mode) => {
                let Offer::Snapshot(m) = &mut o.offer else {
                    return None;
                };
                match mode {
                    Hostility::WrongChecksums => {
                        let sums = m.artifacts.iter_mut().flat_map(|a| &mut a.chunk_checksums);
                        sums.for_each(|c| *c ^= 1);
                    }
                    Hostility::StaleOffers => {
                        let &(commit, purge_generation) = self.asked.get(&to)?;
                        if purge_generation > 0 {
                            m.purge_generation = purge_generation - 1;
                        } else {
                            // Its first offer again, if it is below the
                            // requester's commit.
                            let old = self.first_offer.clone().filter(|f| f.commit < commit)?;
                            *m = old;
                            o.snapshot_id = m.snapshot_id;
                        }
                        self.remember_lie(to, m.snapshot_id);
                    }
                    Hostility::InflatedSizes => {
                        let chunk_bytes = m.chunk_size_bytes;
                        let a = m.artifacts.first_mut()?;
                        a.length_bytes += 4 * segment_bytes;
                        let chunks = Manifest::chunk_count(a.length_bytes, chunk_bytes);
                        a.chunk_checksums.resize(chunks as usize, 0);
                        self.remember_lie(to, m.snapshot_id);
                    }
                    _ => return None,
                }
            }
            _ => return None,
        }
        Some(out)
    }

    fn remember_lie(&mut self, to: u8, snapshot_id: u64) {
        if self.lied_offers.len() >= LIED_OFFERS_MAX {
            self.lied_offers.pop_first();
        }
        self.lied_offers.insert((to, snapshot_id));
    }
}

impl Cluster {
    /// The frame replica `r` sends `to` for `msg`: the hostile server's lie
    /// when it tells one (counted), else the message as it is.
    pub(super) fn transfer_frame(
        &mut self,
        r: u8,
        to: u8,
        msg: &XMsg,
        view: u32,
    ) -> Result<Vec<u8>, Violation> {
        let segment_bytes = self.segment_bytes;
        let lie = match self.hostile.as_mut() {
            Some(h) if h.replica == r && (!msg.for_receiver() || !h.lying) => None,
            Some(h) if h.replica == r => {
                if matches!(msg, XMsg::SnapshotOffer(_)) {
                    h.last_offer = Some((to, msg.clone()));
                }
                h.lie(to, msg, segment_bytes)
            }
            _ => None,
        };
        let lied = lie.is_some();
        let sent = lie.as_ref().unwrap_or(msg);
        let mut bytes = Vec::new();
        sent.to_wire(CLUSTER_ID, PARTITION_ID, r, view)
            .encode(&mut bytes)
            .map_err(|e| violation("messages encode", format!("R{r} transfer: {e}")))?;
        let undecodable = self.hostile.as_ref().is_some_and(|h| {
            h.replica == r
                && h.lying
                && h.mode == Hostility::UndecodableManifests
                && matches!(msg, XMsg::SnapshotOffer(o) if matches!(o.offer, Offer::Snapshot(_)))
        });
        if undecodable {
            // The manifest's trailing checksum no longer matches.
            if let Some(b) = bytes.last_mut() {
                *b ^= 0xff;
            }
        }
        if lied || undecodable {
            self.counts.hostile_frames += 1;
        }
        Ok(bytes)
    }

    /// Each tick the hostile server re-sends its last offer
    /// (`EndlessReOffers`).
    pub(super) fn hostile_tick(&mut self) -> Result<(), Violation> {
        let Some(h) = self.hostile.as_mut() else {
            return Ok(());
        };
        let r = h.replica;
        if !self.nodes[usize::from(r)].is_up() {
            return Ok(());
        }
        if h.mode != Hostility::EndlessReOffers || !h.lying {
            return Ok(());
        }
        let Some((to, msg)) = h.last_offer.clone() else {
            return Ok(());
        };
        self.counts.hostile_frames += 1;
        self.send_transfer(r, to, &msg)
    }

    /// Whether a frame from `from` that failed to decode came from the
    /// hostile server (then the receiver is told: it charges the sender).
    pub(super) fn hostile_undecodable(&self, from: u8) -> bool {
        self.hostile
            .as_ref()
            .is_some_and(|h| h.replica == from && h.mode == Hostility::UndecodableManifests)
    }

    /// Guards against: a receiver taking an offer the hostile server made
    /// stale or oversized: it must refuse it before staging anything.
    pub(super) fn check_not_a_lie(
        &self,
        r: u8,
        snapshot_id: u64,
        from: u8,
    ) -> Result<(), Violation> {
        let lied = self
            .hostile
            .as_ref()
            .is_some_and(|h| h.replica == from && h.lied_offers.contains(&(r, snapshot_id)));
        if lied {
            let mode = self.hostile.as_ref().map(|h| h.mode);
            let detail = format!(
                "replica {r} took snapshot {snapshot_id} of hostile replica {from} ({mode:?})"
            );
            return Err(violation("hostile offers refused", detail));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against: the remembered lies growing without bound over a
    /// long run: past LIED_OFFERS_MAX the oldest is forgotten.
    #[test]
    fn remembered_lies_stop_at_their_bound() {
        let mut h = Hostile::draw(1, 3, true).expect("a hostile peer at R = 3");
        for id in 0..LIED_OFFERS_MAX as u64 + 10 {
            h.remember_lie(1, id);
        }
        assert_eq!(h.lied_offers.len(), LIED_OFFERS_MAX);
        assert!(!h.lied_offers.contains(&(1, 0)), "the oldest kept");
        assert!(h.lied_offers.contains(&(1, LIED_OFFERS_MAX as u64 + 9)));
    }

    /// Guards against: the lie check losing its teeth: a receiver taking an
    /// offer the hostile server made stale is a violation; the same
    /// snapshot from another peer, or to another receiver, is not.
    #[test]
    fn taking_a_remembered_lie_is_a_violation() {
        let mut opts = SimOptions::new(9);
        opts.transfers = true;
        opts.hostile = true;
        let mut c = Cluster::new(&opts, 3).expect("cluster");
        let liar = c.hostile.as_ref().expect("hostile at R = 3").replica;
        let (to, other) = ((liar + 1) % 3, (liar + 2) % 3);
        if let Some(h) = c.hostile.as_mut() {
            h.remember_lie(to, 77);
        }
        let v = c.check_not_a_lie(to, 77, liar).expect_err("a lie taken");
        assert_eq!(v.check, "hostile offers refused");
        c.check_not_a_lie(to, 77, other)
            .expect("another peer's snapshot");
        c.check_not_a_lie(other, 77, liar)
            .expect("offered to another");
    }

    /// Guards against: the liveness phase keeping a liar's lies on (it may
    /// hold the only copy a receiver needs; seed 9000152): once healed it
    /// sends its chunks as they are and re-offers nothing.
    #[test]
    fn a_healed_hostile_peer_tells_no_more_lies() {
        let seed = (0..)
            .find(|&s| {
                Hostile::draw(s, 3, true).is_some_and(|h| h.mode == Hostility::GarbageChunks)
            })
            .expect("some seed draws garbage chunks");
        let mut opts = SimOptions::new(seed);
        opts.transfers = true;
        opts.hostile = true;
        let mut c = Cluster::new(&opts, 3).expect("cluster");
        let liar = c.hostile.as_ref().expect("hostile at R = 3").replica;
        let to = (liar + 1) % 3;
        let chunk = XMsg::Chunk {
            snapshot_id: 5,
            key: ringlog_protocol::replication::ChunkKey {
                artifact: 0,
                chunk: 0,
            },
            data: vec![7u8; 64].into(),
        };
        let mut honest = Vec::new();
        chunk
            .to_wire(CLUSTER_ID, PARTITION_ID, liar, 0)
            .encode(&mut honest)
            .expect("encodes");
        let lied = c.transfer_frame(liar, to, &chunk, 0).expect("frame");
        assert_ne!(lied, honest, "garbage before the heal");
        assert_eq!(c.counts.hostile_frames, 1);
        if let Some(h) = c.hostile.as_mut() {
            h.heal();
        }
        let sent = c.transfer_frame(liar, to, &chunk, 0).expect("frame");
        assert_eq!(sent, honest, "a lie after the heal");
        assert_eq!(c.counts.hostile_frames, 1);
    }

    /// Guards against: a group with no honest peer for some replica (R = 1)
    /// getting a hostile one, and the option being ignored.
    #[test]
    fn a_hostile_peer_needs_the_option_and_two_peers() {
        assert!(Hostile::draw(1, 1, true).is_none());
        assert!(Hostile::draw(1, 3, false).is_none());
        let modes: BTreeSet<usize> = (0..200)
            .filter_map(|seed| Hostile::draw(seed, 5, true))
            .map(|h| HOSTILITIES.iter().position(|&m| m == h.mode).unwrap_or(99))
            .collect();
        assert_eq!(
            modes.len(),
            HOSTILITIES.len(),
            "some way of lying never drawn"
        );
    }
}
