//! The connection ledger of a capped cell (docs/reference/websocket.md): physical, in-flight and reserved
//! units, limits H − 100 (normal) and H (rebind controls), and the monotonic inclusion watermark
//! every change and snapshot advances. Pure; the cell wraps it in a mutex.

use std::collections::HashMap;

use crate::contract::limits::CONTROL_RESERVE;

/// Where a data leg's unit came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataUnit {
    /// The phone's reserved unit bound to this `connId` (restored if the leg fails).
    Bound,
    /// A fresh unit under the normal limit.
    Fresh,
}

/// One consistent view (heartbeat fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub physical: u64,
    pub in_flight: u64,
    pub reserved: u64,
    pub enforced: u64,
    pub hard_cap: u64,
    pub watermark: u64,
}

#[derive(Debug)]
pub struct Ledger {
    cap: u64,
    physical: u64,
    in_flight: u64,
    reserved: u64,
    watermark: u64,
    /// Reserved units bound to a `connId` at `conn-open` (true while a data leg holds it in flight).
    bound: HashMap<String, bool>,
}

impl Ledger {
    pub fn new(cap: u64) -> Ledger {
        Ledger {
            cap,
            physical: 0,
            in_flight: 0,
            reserved: 0,
            watermark: 0,
            bound: HashMap::new(),
        }
    }

    fn bump(&mut self) -> u64 {
        self.watermark += 1;
        self.watermark
    }

    pub fn enforced(&self) -> u64 {
        self.physical + self.in_flight + self.reserved
    }

    pub fn normal_limit(&self) -> u64 {
        self.cap - CONTROL_RESERVE
    }

    /// Physical (open) connections.
    pub fn physical(&self) -> u64 {
        self.physical
    }

    /// Phone upgrade: 1 in-flight + 1 reserved unit if enforced + 2 ≤ normal limit.
    pub fn reserve_phone(&mut self) -> bool {
        if self.enforced() + 2 > self.normal_limit() {
            return false;
        }
        self.in_flight += 1;
        self.reserved += 1;
        self.bump();
        true
    }

    /// Binds the phone's reserved unit to `conn_id` (at `conn-open`).
    pub fn bind(&mut self, conn_id: &str) {
        self.bound.insert(conn_id.to_owned(), false);
        self.bump();
    }

    /// Releases a phone's reserved unit (bound or not): admission failed, attach deadline, or the
    /// phone closed before its data leg consumed it. No-op for a consumed unit.
    pub fn release_reserved(&mut self, conn_id: Option<&str>) {
        match conn_id {
            Some(id) => match self.bound.get(id) {
                Some(false) => {
                    self.bound.remove(id);
                    self.reserved -= 1;
                }
                Some(true) => {
                    // A data leg holds it in flight: it is consumed or restored there; drop the bond.
                    self.bound.remove(id);
                }
                None => return,
            },
            None => self.reserved = self.reserved.saturating_sub(1),
        }
        self.bump();
    }

    /// Data upgrade: the bound unit of `conn_id` (converted to in-flight), else a fresh unit if
    /// enforced + 1 ≤ normal limit.
    pub fn reserve_data(&mut self, conn_id: &str) -> Option<DataUnit> {
        if let Some(taken) = self.bound.get_mut(conn_id) {
            if !*taken {
                *taken = true;
                self.reserved -= 1;
                self.in_flight += 1;
                self.bump();
                return Some(DataUnit::Bound);
            }
        }
        if self.enforced() + 1 > self.normal_limit() {
            return None;
        }
        self.in_flight += 1;
        self.bump();
        Some(DataUnit::Fresh)
    }

    /// `host-data-auth` succeeded: the bound unit is consumed.
    pub fn consume_bound(&mut self, conn_id: &str) {
        if self.bound.remove(conn_id).is_some() {
            self.bump();
        }
    }

    /// The data leg failed before consuming its bound unit: the unit goes back to reserved, and
    /// the leg's own unit (in-flight or physical) is released by the caller's `abort`/`close`.
    pub fn restore_bound(&mut self, conn_id: &str) {
        if let Some(taken) = self.bound.get_mut(conn_id) {
            if *taken {
                *taken = false;
                self.reserved += 1;
                self.bump();
            }
        }
    }

    /// Control upgrade: enforced + 1 ≤ normal limit, or ≤ H for a rebind over a live control.
    /// Returns the watermark taken at the reservation.
    pub fn reserve_control(&mut self, rebind: bool) -> Option<u64> {
        let limit = if rebind {
            self.cap
        } else {
            self.normal_limit()
        };
        if self.enforced() + 1 > limit {
            return None;
        }
        self.in_flight += 1;
        Some(self.bump())
    }

    /// An in-flight unit's handshake completed: it becomes physical.
    pub fn complete(&mut self) {
        self.in_flight -= 1;
        self.physical += 1;
        self.bump();
    }

    /// An in-flight unit's handshake failed.
    pub fn abort(&mut self) {
        self.in_flight -= 1;
        self.bump();
    }

    /// A physical connection closed.
    pub fn close(&mut self) {
        self.physical -= 1;
        self.bump();
    }

    /// A snapshot for the heartbeat; advances the watermark so later reservations are newer.
    pub fn snapshot(&mut self) -> Snapshot {
        let watermark = self.bump();
        Snapshot {
            physical: self.physical,
            in_flight: self.in_flight,
            reserved: self.reserved,
            enforced: self.enforced(),
            hard_cap: self.cap,
            watermark,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P-47.
    #[test]
    fn h600_phones_to_500_rebind_control_to_600() {
        let mut l = Ledger::new(600);
        let mut w = 0;
        let mut phones = 0;
        while l.reserve_phone() {
            phones += 1;
            l.complete();
            assert!(l.snapshot().watermark > w);
            w = l.snapshot().watermark;
        }
        assert_eq!(phones, 250);
        assert_eq!(l.enforced(), 500);
        assert_eq!(l.reserve_data("nobody"), None, "data at the limit");
        assert_eq!(l.reserve_control(false), None, "new control at the limit");
        for _ in 0..100 {
            assert!(l.reserve_control(true).is_some());
        }
        assert_eq!(l.enforced(), 600);
        assert_eq!(l.reserve_control(true), None);
    }

    #[test]
    fn data_leg_uses_its_bound_unit_even_at_the_limit() {
        let mut l = Ledger::new(600);
        for _ in 0..249 {
            assert!(l.reserve_phone());
        }
        assert!(l.reserve_phone());
        l.bind("c1");
        assert_eq!(l.enforced(), 500);
        let before = l.snapshot().watermark;
        assert_eq!(l.reserve_data("c1"), Some(DataUnit::Bound));
        assert!(l.snapshot().watermark > before);
        assert_eq!(l.enforced(), 500);
        assert_eq!(l.reserve_data("c1"), None, "a bound unit serves one leg");
        // Failure before consumption restores the reserved unit.
        l.abort();
        l.restore_bound("c1");
        assert_eq!(l.enforced(), 500);
        assert_eq!(l.reserve_data("c1"), Some(DataUnit::Bound));
        l.complete();
        l.consume_bound("c1");
        l.release_reserved(Some("c1"));
        assert_eq!(l.enforced(), 500);
    }

    #[test]
    fn release_of_unbound_and_bound_units() {
        let mut l = Ledger::new(600);
        assert!(l.reserve_phone());
        l.complete();
        l.release_reserved(None);
        assert_eq!(l.enforced(), 1);
        assert!(l.reserve_phone());
        l.complete();
        l.bind("x");
        l.release_reserved(Some("x"));
        l.release_reserved(Some("x"));
        assert_eq!(l.enforced(), 2);
        l.close();
        l.close();
        assert_eq!(l.enforced(), 0);
    }
}
