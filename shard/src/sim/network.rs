//! The simulated network: encoded messages in flight between replicas,
//! with loss, duplication, delay (and so reordering), partitions
//! (symmetric and one-way) and clogged links. Ordered containers only:
//! delivery order comes from the seed alone.

use crate::vsr::timeout::Rng;

use super::faults::{chance, FaultRates};

/// Messages in flight at most; past it a send is dropped (and counted),
/// as a full socket buffer would.
pub const PACKETS_MAX: usize = 4096;

#[derive(Debug, Clone)]
pub struct Packet {
    pub deliver_tick: u64,
    pub from: u8,
    pub to: u8,
    /// The wire frame, exactly as `ringlog_protocol::replication` encoded it.
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Link {
    /// Partitioned: everything on this directed link is lost.
    cut: bool,
    /// Clogged: messages wait until this tick before delivery.
    clogged_until_tick: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NetworkCounts {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub cut: u64,
    pub overflowed: u64,
    pub partitions: u64,
    pub asymmetric_partitions: u64,
    pub clogs: u64,
}

#[derive(Debug)]
pub struct Network {
    n: u8,
    links: Vec<Link>,
    packets: Vec<Packet>,
    partitioned: bool,
    pub counts: NetworkCounts,
}

impl Network {
    pub fn new(n: u8) -> Self {
        Self {
            n,
            links: vec![Link::default(); usize::from(n) * usize::from(n)],
            packets: Vec::new(),
            partitioned: false,
            counts: NetworkCounts::default(),
        }
    }

    fn link(&mut self, from: u8, to: u8) -> &mut Link {
        &mut self.links[usize::from(from) * usize::from(self.n) + usize::from(to)]
    }

    pub fn in_flight(&self) -> usize {
        self.packets.len()
    }

    pub fn send(&mut self, rng: &mut Rng, f: &FaultRates, now: u64, packet: (u8, u8, Vec<u8>)) {
        let (from, to, bytes) = packet;
        self.counts.sent += 1;
        if chance(rng, f.loss_per_mille) {
            self.counts.lost += 1;
            return;
        }
        let copies = if chance(rng, f.duplicate_per_mille) {
            self.counts.duplicated += 1;
            2
        } else {
            1
        };
        let clogged = self.link(from, to).clogged_until_tick;
        for _ in 0..copies {
            if self.packets.len() >= PACKETS_MAX {
                self.counts.overflowed += 1;
                return;
            }
            let delay = rng.below(f.delay_ticks_max + 1);
            self.packets.push(Packet {
                deliver_tick: (now + delay).max(clogged),
                from,
                to,
                bytes: bytes.clone(),
            });
        }
    }

    /// Takes the packets due by `now`, in a seeded order; those on a cut
    /// link are lost.
    pub fn due(&mut self, rng: &mut Rng, now: u64) -> Vec<Packet> {
        let (mut due, keep): (Vec<Packet>, Vec<Packet>) = std::mem::take(&mut self.packets)
            .into_iter()
            .partition(|p| p.deliver_tick <= now);
        self.packets = keep;
        // Fisher-Yates with the run's rng: reordering among due messages.
        for i in (1..due.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            due.swap(i, j);
        }
        let before = due.len();
        due.retain(|p| {
            !self.links[usize::from(p.from) * usize::from(self.n) + usize::from(p.to)].cut
        });
        self.counts.cut += (before - due.len()) as u64;
        due
    }

    /// One tick of network weather: partitions start and heal, links clog.
    pub fn weather(&mut self, rng: &mut Rng, f: &FaultRates, now: u64) {
        if self.partitioned && chance(rng, f.heal_per_mille) {
            self.heal();
        } else if !self.partitioned && chance(rng, f.partition_per_mille) {
            self.partition(rng, f);
        }
        if chance(rng, f.clog_per_mille) {
            let from = rng.below(u64::from(self.n)) as u8;
            let to = rng.below(u64::from(self.n)) as u8;
            if from != to {
                let until = now + 1 + rng.below(f.clog_ticks_max);
                self.link(from, to).clogged_until_tick = until;
                self.counts.clogs += 1;
            }
        }
    }

    /// Cuts the links between two random groups (both ways), or from one
    /// group to the other only.
    fn partition(&mut self, rng: &mut Rng, f: &FaultRates) {
        let n = u64::from(self.n);
        // A non-empty proper subset of the replicas.
        let side = 1 + rng.below((1u64 << n) - 2);
        let asymmetric = rng.below(100) < f.asymmetric_pct;
        for a in 0..self.n {
            for b in 0..self.n {
                let a_in = side & (1 << a) != 0;
                let b_in = side & (1 << b) != 0;
                if a_in && !b_in || (!asymmetric && !a_in && b_in) {
                    self.link(a, b).cut = true;
                }
            }
        }
        self.partitioned = true;
        self.counts.partitions += 1;
        if asymmetric {
            self.counts.asymmetric_partitions += 1;
        }
    }

    /// Every link whole and unclogged again.
    pub fn heal(&mut self) {
        for l in &mut self.links {
            *l = Link::default();
        }
        self.partitioned = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calm_with(f: impl FnOnce(&mut FaultRates)) -> FaultRates {
        let mut r = FaultRates::calm();
        f(&mut r);
        r
    }

    /// Guards against: the network queue growing without bound.
    #[test]
    fn sends_past_the_bound_are_dropped_and_counted() {
        let mut net = Network::new(3);
        let mut rng = Rng::new(1);
        let f = calm_with(|f| f.delay_ticks_max = 0);
        for _ in 0..PACKETS_MAX + 10 {
            net.send(&mut rng, &f, 0, (0, 1, vec![1]));
        }
        assert_eq!(net.in_flight(), PACKETS_MAX);
        assert_eq!(net.counts.overflowed, 10);
    }

    /// Guards against: a one-way partition cutting both directions (or none).
    #[test]
    fn asymmetric_partition_cuts_one_direction() {
        let mut net = Network::new(3);
        let mut rng = Rng::new(7);
        let f = calm_with(|f| {
            f.asymmetric_pct = 100;
            f.partition_per_mille = 1000;
            f.delay_ticks_max = 0;
        });
        net.weather(&mut rng, &f, 0);
        let cut: Vec<(u8, u8)> = (0..3u8)
            .flat_map(|a| (0..3u8).map(move |b| (a, b)))
            .filter(|&(a, b)| net.links[usize::from(a) * 3 + usize::from(b)].cut)
            .collect();
        assert!(!cut.is_empty());
        for &(a, b) in &cut {
            assert!(!cut.contains(&(b, a)), "{cut:?} cuts both ways");
        }
        net.send(&mut rng, &f, 0, (cut[0].0, cut[0].1, vec![1]));
        net.send(&mut rng, &f, 0, (cut[0].1, cut[0].0, vec![2]));
        let due = net.due(&mut rng, 0);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].bytes, vec![2]);
        assert_eq!(net.counts.cut, 1);
    }

    /// Guards against: a clogged link delivering early.
    #[test]
    fn clogged_link_holds_messages() {
        let mut net = Network::new(2);
        let mut rng = Rng::new(3);
        let f = calm_with(|f| f.delay_ticks_max = 0);
        net.link(0, 1).clogged_until_tick = 10;
        net.send(&mut rng, &f, 0, (0, 1, vec![1]));
        assert!(net.due(&mut rng, 9).is_empty());
        assert_eq!(net.due(&mut rng, 10).len(), 1);
    }
}
