//! Library algorithms chosen by measurement, as `cudnn.benchmark` does: the first time a
//! device meets a problem (a product's or a convolution's shape), each candidate the
//! library offers for it is run and timed on the device, and the fastest is kept for
//! that problem; later calls of the same shape run it at once. The candidates are only
//! those whose results hold the op's stated error bound (the caller's list), so the
//! choice moves speed, never the answer's bound.
//!
//! A search costs a few runs of each candidate. Where a timed run of the first candidate
//! takes longer than `SEARCH_LIMIT_MS`, the search stops there and keeps it: the longest
//! problems would otherwise pay seconds once, in some request's latency.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaStream, DriverError};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

/// Timed runs of each candidate, after one untimed run (lazy loads, clocks rising).
pub const TIMED_RUNS: usize = 2;
/// A timed run of the first candidate longer than this ends the search (milliseconds).
pub const SEARCH_LIMIT_MS: f32 = 25.0;
/// Problems remembered per device; past this the memory starts again (a service meets a
/// handful of shapes; this bounds one that is sent every shape there is).
pub const REMEMBERED: usize = 4096;

/// What a search found: the candidate to run, and what it measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice<A> {
    pub algo: A,
    /// Its milliseconds a run (the mean of `TIMED_RUNS`), or None where the search
    /// stopped at the first.
    pub ms: Option<f32>,
    /// Candidates timed (the library refused the others).
    pub tried: usize,
}

/// The fastest of `candidates` by `run`, which runs a candidate `times` times and answers
/// the milliseconds they took in all, or None where the library refuses that candidate.
/// Ties keep the earlier (the library's own order of preference). None: every candidate
/// was refused.
pub fn fastest<A: Copy, E>(
    candidates: &[A],
    mut run: impl FnMut(A, usize) -> Result<Option<f32>, E>,
) -> Result<Option<Choice<A>>, E> {
    let mut best: Option<Choice<A>> = None;
    let mut tried = 0;
    for &algo in candidates {
        // The first run is not counted: it pays the lazy loads and the clocks' rise.
        if run(algo, 1)?.is_none() {
            continue;
        }
        let Some(total) = run(algo, TIMED_RUNS)? else {
            continue;
        };
        tried += 1;
        let ms = total / TIMED_RUNS as f32;
        if tried == 1 && ms > SEARCH_LIMIT_MS {
            return Ok(Some(Choice {
                algo,
                ms: None,
                tried,
            }));
        }
        if best.is_none_or(|b| b.ms.is_some_and(|best| ms < best)) {
            best = Some(Choice {
                algo,
                ms: Some(ms),
                tried,
            });
        }
    }
    Ok(best.map(|b| Choice { tried, ..b }))
}

/// The choices a device has made, by problem.
pub struct Chosen<K, A> {
    by_problem: Mutex<HashMap<K, A>>,
}

impl<K: Hash + Eq, A: Copy> Default for Chosen<K, A> {
    fn default() -> Self {
        Self {
            by_problem: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq, A: Copy> Chosen<K, A> {
    pub fn get(&self, problem: &K) -> Option<A> {
        self.lock().get(problem).copied()
    }

    pub fn keep(&self, problem: K, algo: A) {
        let mut map = self.lock();
        if map.len() >= REMEMBERED && !map.contains_key(&problem) {
            map.clear();
        }
        map.insert(problem, algo);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, A>> {
        self.by_problem.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Milliseconds `work` took on `stream`, between two events recorded there around it
/// (the host waits for the second). `work`'s own error is the outer Ok's.
pub fn device_ms<T>(
    stream: &CudaStream,
    work: impl FnOnce() -> T,
) -> Result<(T, f32), DriverError> {
    // Timing events: cudarc's default flags (None) disable timing.
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(timed)?;
    let out = work();
    let end = stream.record_event(timed)?;
    Ok((out, start.elapsed_ms(&end)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Candidates by their milliseconds a run; None: refused.
    fn search(times: &[Option<f32>]) -> (Option<Choice<usize>>, Vec<(usize, usize)>) {
        let mut runs = Vec::new();
        let candidates: Vec<usize> = (0..times.len()).collect();
        let chosen = fastest(&candidates, |i, n| {
            runs.push((i, n));
            Ok::<_, ()>(times[i].map(|ms| ms * n as f32))
        })
        .unwrap();
        (chosen, runs)
    }

    #[test]
    fn the_fastest_candidate_is_chosen_after_a_warm_run_of_each() {
        let (chosen, runs) = search(&[Some(3.0), Some(1.5), Some(2.0)]);
        assert_eq!(
            chosen,
            Some(Choice {
                algo: 1,
                ms: Some(1.5),
                tried: 3
            })
        );
        let expected: Vec<_> = (0..3).flat_map(|i| [(i, 1), (i, TIMED_RUNS)]).collect();
        assert_eq!(runs, expected);
    }

    #[test]
    fn refused_candidates_are_passed_over_and_ties_keep_the_library_order() {
        let (chosen, _) = search(&[None, Some(2.0), Some(2.0), None]);
        assert_eq!(chosen.map(|c| (c.algo, c.tried)), Some((1, 2)));
        assert_eq!(search(&[None, None]).0, None);
    }

    #[test]
    fn a_long_first_run_ends_the_search_with_it() {
        let (chosen, runs) = search(&[None, Some(SEARCH_LIMIT_MS * 2.0), Some(0.1)]);
        assert_eq!(
            chosen,
            Some(Choice {
                algo: 1,
                ms: None,
                tried: 1
            })
        );
        assert_eq!(runs, vec![(0, 1), (1, 1), (1, TIMED_RUNS)]);
        // Only the first that runs can end it: a slow later one is just slower.
        let (chosen, _) = search(&[Some(1.0), Some(SEARCH_LIMIT_MS * 2.0)]);
        assert_eq!(chosen.map(|c| (c.algo, c.tried)), Some((0, 2)));
    }

    #[test]
    fn a_slow_first_run_alone_neither_ends_the_search_nor_counts() {
        // Candidate 0's first run pays a cold start; timed, it is the slower of the two.
        let chosen = fastest(&[0usize, 1], |i, n| {
            Ok::<_, ()>(Some(match (i, n) {
                (0, 1) => SEARCH_LIMIT_MS * 10.0,
                (0, n) => 2.0 * n as f32,
                (_, n) => n as f32,
            }))
        })
        .unwrap();
        assert_eq!(chosen.map(|c| (c.algo, c.tried)), Some((1, 2)));
    }

    #[test]
    fn the_memory_of_choices_is_bounded() {
        let chosen = Chosen::<usize, u8>::default();
        for p in 0..REMEMBERED {
            chosen.keep(p, 1);
        }
        chosen.keep(0, 2);
        let held = chosen.lock().len();
        assert_eq!((held, chosen.get(&0)), (REMEMBERED, Some(2)));
        chosen.keep(REMEMBERED, 3);
        let held = chosen.lock().len();
        assert_eq!((held, chosen.get(&REMEMBERED)), (1, Some(3)));
        assert_eq!(chosen.get(&1), None);
    }
}
