//! The process's one mutex-poisoning policy: a poisoned `std::sync::Mutex` is recovered, never
//! unwrapped.
//!
//! Why: every std mutex here guards in-memory bookkeeping (registries, pre-auth windows, ledgers,
//! lanes, rejection windows) whose critical sections are short, synchronous and never await. A
//! panic inside one is a bug that is already reported by the panic itself; turning it into a panic
//! of every later caller would take down the whole process (every socket of a cell) for one bad
//! request. Each guarded structure keeps its invariants at every statement boundary that can
//! panic (counters are adjusted together with the maps they count), so the data a recovered guard
//! shows is consistent. Async locks (`tokio::sync::Mutex`) cannot poison.
//!
//! Use [`lock`] for every std mutex; `tests/layering.rs` rejects `.lock().unwrap()` in `src/`.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering the guard if a panicking holder poisoned it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
